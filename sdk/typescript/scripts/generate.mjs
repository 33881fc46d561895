// Writes src/schema.d.ts from openapi.yaml, as the openapi-typescript CLI
// does, with one difference: an enum the contract declares open
// (x-open-enum: true, the statuses of orders, payments and refunds) is
// typed as its values or any other string, `"created" | "cancelled" |
// (string & {})`. A later server may add a value, and the types must let a
// caller's switch take it to a default instead of claiming it cannot
// happen; the literals still complete in an editor.
import { writeFileSync } from "node:fs";
import openapiTS, { astToString, COMMENT_HEADER } from "openapi-typescript";
import ts from "typescript";

const spec = new URL("../../../openapi.yaml", import.meta.url);
const out = new URL("../src/schema.d.ts", import.meta.url);

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
writeFileSync(out, COMMENT_HEADER + astToString(ast));
