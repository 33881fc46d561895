// Writes src/schema.d.ts from openapi.yaml, as the openapi-typescript CLI
// does, with one difference: an enum the contract declares open
// (x-open-enum: true, the statuses of orders, payments and refunds) is
// typed as its values or any other string, `"created" | "cancelled" |
// (string & {})`. A later server may add a value, and the types must let a
// caller's switch take it to a default instead of claiming it cannot
// happen; the literals still complete in an editor.
//
// `node scripts/generate.mjs SPEC OUT` writes OUT from SPEC instead (paths
// from the current directory): the tests build the SDK's types as the
// released contract (api/openapi.released.yaml) has them this way, to read
// a later server's answers with them.
import { mkdirSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import openapiTS, { astToString, COMMENT_HEADER } from "openapi-typescript";
import ts from "typescript";

const args = process.argv.slice(2);
if (args.length !== 0 && args.length !== 2) {
  console.error("usage: node scripts/generate.mjs [SPEC OUT]");
  process.exit(2);
}
const [spec, out] =
  args.length === 2
    ? args.map((p) => pathToFileURL(p))
    : [new URL("../../../openapi.yaml", import.meta.url), new URL("../src/schema.d.ts", import.meta.url)];

const ast = await openapiTS(spec, {
  transform(schema) {
    if (schema["x-open-enum"] !== true || !Array.isArray(schema.enum)) return undefined;
    const known = schema.enum.map((v) => ts.factory.createLiteralTypeNode(ts.factory.createStringLiteral(String(v))));
    const anyOther = ts.factory.createIntersectionTypeNode([
      ts.factory.createKeywordTypeNode(ts.SyntaxKind.StringKeyword),
      ts.factory.createTypeLiteralNode([]),
    ]);
    return ts.factory.createUnionTypeNode([...known, anyOther]);
  },
});
mkdirSync(new URL(".", out), { recursive: true });
writeFileSync(out, COMMENT_HEADER + astToString(ast));
