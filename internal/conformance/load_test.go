package conformance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/oncekey/oncekey/idempotency/oapi"
)

// unsupportedDoc has a $ref the tool cannot follow in each place OpenAPI
// has one, and a "$ref" in an example's value, which is data.
const unsupportedDoc = `openapi: 3.1.0
info: {title: Unsupported, version: "1"}
paths:
  /orders:
    post:
      operationId: createOrder
      parameters:
        - $ref: '#/components/parameters/Key'
        - $ref: 'common.yaml#/components/parameters/Trace'
        - $ref: '#/components/parameters/Expand'
      requestBody:
        content:
          application/json:
            schema:
              type: object
              properties:
                customer: {$ref: 'https://schemas.example.com/customer.json'}
                card: {$ref: '#/components/schemas/Card'}
            example: {note: {$ref: 'not a reference, an example'}}
      responses:
        '201':
          description: Created.
          content:
            application/json:
              examples:
                big: {$ref: 'examples.yaml#/big'}
          links:
            self: {$ref: 'links.yaml#/self'}
        '400': {$ref: 'errors.yaml#/BadRequest'}
      callbacks:
        done: {$ref: 'callbacks.yaml#/done'}
  /refunds: {$ref: 'refunds.yaml'}
  /anchored:
    post:
      requestBody: {$ref: '#body'}
      responses: {'200': {description: OK}}
components:
  parameters:
    Key: {name: Idempotency-Key, in: header, schema: {type: string}}
    Expand: {$ref: './params.yaml#/Expand'}
  schemas:
    Card:
      oneOf: [{$ref: '#/components/schemas/Visa'}, {$ref: 'cards.yaml#/Amex'}]
      discriminator:
        propertyName: brand
        mapping: {visa: '#/components/schemas/Visa', amex: 'cards.yaml#/Amex'}
    Visa: {type: object, properties: {brand: {const: visa}}}
  securitySchemes:
    partner: {$ref: 'security.yaml#/partner'}
webhooks:
  paid: {$ref: 'hooks.yaml#/paid'}
`

// TestLoadUnsupported: each $ref Load cannot follow is a notice, with its
// pointer and line, in YAML and in JSON, and is replaced by what fits its
// place; the rest of the document loads as it is.
func TestLoadUnsupported(t *testing.T) {
	t.Parallel()
	type want struct{ ref, pointer, done string }
	wants := []want{
		{"common.yaml#/components/parameters/Trace", "/paths/~1orders/post/parameters/1", "the parameter is left out"},
		{"https://schemas.example.com/customer.json", "/paths/~1orders/post/requestBody/content/application~1json/schema/properties/customer", "the schema is taken as {}, which any value fits"},
		{"examples.yaml#/big", "/paths/~1orders/post/responses/201/content/application~1json/examples/big", "the example is left out"},
		{"links.yaml#/self", "/paths/~1orders/post/responses/201/links/self", "the link is left out"},
		{"errors.yaml#/BadRequest", "/paths/~1orders/post/responses/400", "the response is taken as one without content"},
		{"callbacks.yaml#/done", "/paths/~1orders/post/callbacks/done", "the callback is left out"},
		{"refunds.yaml", "/paths/~1refunds", "the path's operations are left out"},
		{"#body", "/paths/~1anchored/post/requestBody", "the request body is left out"},
		{"./params.yaml#/Expand", "/components/parameters/Expand", "the parameter is left out"},
		{"cards.yaml#/Amex", "/components/schemas/Card/oneOf/1", "the schema is taken as {}, which any value fits"},
		{"cards.yaml#/Amex", "/components/schemas/Card/discriminator/mapping/amex", `the discriminator's mapping of "amex" is left out`},
		{"security.yaml#/partner", "/components/securitySchemes/partner", "the scheme is taken as HTTP bearer (the tool sends --auth as it is given)"},
		{"hooks.yaml#/paid", "/webhooks/paid", "the path's operations are left out"},
		// Met before the component it names was left out: found on the
		// second pass.
		{"#/components/parameters/Expand", "/paths/~1orders/post/parameters/2", "the parameter is left out"},
	}
	var asJSON any
	require.NoError(t, yaml.Unmarshal([]byte(unsupportedDoc), &asJSON))
	jsonDoc, err := json.MarshalIndent(asJSON, "", "  ")
	require.NoError(t, err)
	for _, tc := range []struct {
		name, doc string
	}{
		{"yaml", unsupportedDoc},
		{"json", string(jsonDoc)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "openapi."+tc.name)
			require.NoError(t, os.WriteFile(path, []byte(tc.doc), 0o600))
			doc, notices, err := Load(path)
			require.NoError(t, err)
			require.Len(t, notices, len(wants), "%v", notices)
			lines := strings.Split(tc.doc, "\n")
			byPointer := map[string]Notice{}
			for _, n := range notices {
				byPointer[n.Pointer] = n
			}
			for i, w := range wants {
				n := byPointer[w.pointer]
				if tc.name == "yaml" { // in the order of the document, and of the passes
					n = notices[i]
				}
				require.Equal(t, w.pointer, n.Pointer, "notice %d: %s", i, n)
				require.Contains(t, n.What, `"`+w.ref+`"`, "notice %d", i)
				require.Equal(t, w.done, n.Done, "notice %d", i)
				require.Positive(t, n.Line, "notice %d: %s", i, n)
				require.Contains(t, lines[n.Line-1], w.ref, "notice %d names the line of its $ref", i)
			}
			require.Contains(t, byPointer["/paths/~1orders/post/parameters/1"].String(), `unsupported: an external $ref to "common.yaml#/components/parameters/Trace" (only $refs within the document are followed) at /paths/~1orders/post/parameters/1 (line `)
			require.Contains(t, byPointer["/paths/~1anchored/post/requestBody"].What, "a $ref to the anchor")
			require.Contains(t, byPointer["/paths/~1orders/post/parameters/2"].What, "which is left out")

			post := doc.Paths.Value("/orders").Post
			require.Len(t, post.Parameters, 1, "the parameters left out")
			require.Equal(t, "Idempotency-Key", post.Parameters[0].Value.Name)
			media := post.RequestBody.Value.Content.Get("application/json")
			customer := media.Schema.Value.Properties["customer"]
			require.NotNil(t, customer.Value, "an empty schema")
			require.Nil(t, customer.Value.Type)
			require.Equal(t, map[string]any{"note": map[string]any{"$ref": "not a reference, an example"}}, media.Example, "an example's value is data")
			require.Empty(t, post.Responses.Value("201").Value.Content.Get("application/json").Examples)
			require.Empty(t, post.Responses.Value("201").Value.Links)
			require.Contains(t, *post.Responses.Value("400").Value.Description, "unsupported")
			require.Empty(t, post.Callbacks)
			require.Nil(t, doc.Paths.Value("/refunds"))
			require.Nil(t, doc.Paths.Value("/anchored").Post.RequestBody)
			card := doc.Components.Schemas["Card"].Value
			require.Len(t, card.OneOf, 2)
			require.Len(t, card.Discriminator.Mapping, 1)
			require.Equal(t, "#/components/schemas/Visa", card.Discriminator.Mapping["visa"].Ref)
			require.Equal(t, "bearer", doc.Components.SecuritySchemes["partner"].Value.Scheme)
			require.Nil(t, doc.Webhooks["paid"])

			ops, err := oapi.New(doc, nil)
			require.NoError(t, err)
			require.True(t, ops.Find("POST", "/orders").Idempotent, "the operation is still covered")
		})
	}
}

// TestLoad: what Load reads and what it refuses.
func TestLoad(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc string
		// err: what the error says; notices: what each notice says.
		err     string
		notices []string
		check   func(t *testing.T, doc *openapi3.T)
	}{
		{
			name: "OpenAPI 3.1: type arrays, const, examples, $ref siblings, webhooks, dialect",
			doc: `openapi: 3.1.0
jsonSchemaDialect: https://spec.openapis.org/oas/3.1/dialect/base
info: {title: T, version: "1", summary: A 3.1 document., license: {name: MIT, identifier: MIT}}
paths:
  /ping: {$ref: '#/components/pathItems/Ping'}
  /charges:
    post:
      parameters: [{$ref: '#/components/parameters/Key', description: The key, again.}]
      requestBody:
        content:
          application/json:
            schema: {$ref: '#/components/schemas/Charge', description: A sibling of a $ref.}
      responses: {'200': {description: OK}}
components:
  parameters:
    Key: {name: Idempotency-Key, in: header, schema: {type: string}}
  pathItems:
    Ping: {get: {responses: {'204': {description: Pong.}}}}
  schemas:
    Charge:
      type: object
      required: [amount]
      unevaluatedProperties: false
      properties:
        amount: {type: integer, exclusiveMinimum: 0, examples: [100, 2500]}
        description: {type: [string, "null"], maxLength: 100}
        object: {const: charge}
        tags: {type: array, prefixItems: [{type: string}], items: {type: string}}
        source:
          oneOf: [{$ref: '#/components/schemas/Card'}, {type: "null"}]
        receipt: {type: string, contentMediaType: application/pdf, contentEncoding: base64}
      dependentRequired: {receipt: [description]}
      if: {properties: {amount: {minimum: 1000}}}
      then: {required: [description]}
      $defs:
        Cents: {type: integer}
    Card: {type: object, properties: {brand: {type: string, enum: [visa, null]}}}
webhooks:
  charge.succeeded:
    post:
      requestBody: {content: {application/json: {schema: {$ref: '#/components/schemas/Charge'}}}}
      responses: {'200': {description: OK}}
`,
			check: func(t *testing.T, doc *openapi3.T) {
				charge := doc.Components.Schemas["Charge"].Value
				require.True(t, charge.Properties["description"].Value.Type.Includes("null"), "a type array")
				require.Equal(t, "charge", charge.Properties["object"].Value.Const)
				require.Len(t, charge.Properties["amount"].Value.Examples, 2)
				require.NotNil(t, doc.Webhooks["charge.succeeded"])
				require.Equal(t, "https://spec.openapis.org/oas/3.1/dialect/base", doc.JSONSchemaDialect)
				require.NotNil(t, doc.Paths.Value("/ping").Get, "a path item of the components")
			},
		},
		{
			name: "the nits of real documents",
			doc: `openapi: 3.0.3
info: {title: T, version: "1"}
paths:
  /charges:
    post:
      deprecated-since: "2024-01-01"
      parameters:
        - {name: Idempotency-Key, in: header, schema: {type: string, format: opaque-key, example: 42}}
      requestBody:
        content:
          application/json:
            schema:
              type: object
              properties:
                amount: {type: integer, default: lots, example: many}
                email: {type: string, pattern: '^(?!test)[^@]+@[^@]+$'}
                currency: {type: string, format: iso-4217, nullable-ish: true}
            example: {amount: "not an integer"}
      responses: {'200': {description: OK}}
`,
			notices: []string{
				"unsupported: fields that are neither OpenAPI's nor extensions (x-): nullable-ish at invalid paths: invalid path /charges: invalid operation POST: they are ignored",
				"unsupported: fields that are neither OpenAPI's nor extensions (x-): deprecated-since at invalid paths: invalid path /charges: invalid operation POST: they are ignored",
			},
		},
		{
			name: "JSON with a duplicate key, the last of which counts",
			doc: `{"openapi": "3.1.0", "info": {"title": "T", "version": "1"}, "info": {"title": "U", "version": "2"},
 "paths": {"/a": {"post": {"parameters": [{"$ref": "other.json#/Key"}], "responses": {"200": {"description": "OK"}}}}}}`,
			notices: []string{`unsupported: an external $ref to "other.json#/Key" (only $refs within the document are followed) at /paths/~1a/post/parameters/0 (line 2): the parameter is left out`},
			check: func(t *testing.T, doc *openapi3.T) {
				require.Equal(t, "U", doc.Info.Title)
			},
		},
		{
			name: "JSON escapes YAML does not have, and a character it reads as a line break",
			doc: `{"openapi": "3.1.0", "info": {"title": "a\/b \ud83d\ude00 \\/ \u00e9` + "\u0085" + ` end", "version": "1"},
 "paths": {"/a": {"post": {"parameters": [{"$ref": "other.json#/Key"}], "responses": {"200": {"description": "OK"}}}}}}`,
			notices: []string{`at /paths/~1a/post/parameters/0 (line 2)`},
			check: func(t *testing.T, doc *openapi3.T) {
				require.Equal(t, "a/b \U0001F600 \\/ é\u0085 end", doc.Info.Title)
			},
		},
		{
			name: "JSON that YAML refuses: a key longer than YAML allows",
			doc: `{"openapi": "3.1.0", "info": {"title": "T", "version": "1", "x-` + strings.Repeat("k", 1100) + `": 1},
 "paths": {"/a": {"post": {"parameters": [{"$ref": "other.json#/Key"}], "responses": {"200": {"description": "OK"}}}}}}`,
			notices: []string{`at /paths/~1a/post/parameters/0: the parameter is left out`},
		},
		{
			// GitHub's has /orgs/{org}/attestations/{subject_digest} (GET)
			// and /orgs/{org}/attestations/{attestation_id} (DELETE). The
			// unknown field makes validation run twice: the paths are
			// noted once.
			name: "paths that differ only in their parameters' names",
			doc: `openapi: 3.0.3
info: {title: T, version: "1"}
paths:
  /keys/{digest}:
    get:
      deprecated-since: "2024-01-01"
      parameters: [{name: digest, in: path, required: true, schema: {type: string}}]
      responses: {'200': {description: OK}}
  /keys/{key_id}:
    delete:
      parameters:
        - {name: key_id, in: path, required: true, schema: {type: integer}}
        - {name: Idempotency-Key, in: header, schema: {type: string}}
      responses: {'204': {description: Gone.}}
`,
			notices: []string{
				"unsupported: fields that are neither OpenAPI's nor extensions (x-): deprecated-since",
				`unsupported: the paths "/keys/{digest}" and "/keys/{key_id}", which differ only in their parameters' names at /paths/~1keys~1{key_id} (line 9): both are kept; the operations of /keys/{key_id} are not validated`,
			},
			check: func(t *testing.T, doc *openapi3.T) {
				require.NotNil(t, doc.Paths.Value("/keys/{digest}").Get, "the first path")
				require.NotNil(t, doc.Paths.Value("/keys/{key_id}").Delete, "the second path")
				ops, err := oapi.New(doc, nil)
				require.NoError(t, err)
				require.True(t, ops.Find("DELETE", "/keys/{key_id}").Idempotent, "the operation under the second path is covered")
			},
		},
		{
			// GoDaddy's and DrChrono's have no title, Amentum's a server
			// without a url, Microsoft Graph's examples without values.
			name: "fields left empty that make no request",
			doc: `openapi: 3.0.3
info: {title: "", version: "1", license: {name: ""}}
servers: [{url: ""}]
paths:
  /charges:
    post:
      externalDocs: {url: ""}
      parameters: [{name: Idempotency-Key, in: header, schema: {type: string}}]
      requestBody:
        content:
          application/json:
            schema: {type: object}
            examples: {empty: {$ref: '#/components/examples/Empty'}}
      responses: {'200': {description: OK}}
components:
  examples:
    Empty: {summary: Nothing here.}
`,
			notices: []string{
				`unsupported: an example with neither value nor externalValue at invalid components: example "Empty": it is left out`,
				"unsupported: a license without a name at invalid info: the tool does not need one",
				"unsupported: an info without a title at invalid info: the tool does not need one",
				"unsupported: external docs without a url at invalid paths: invalid path /charges: invalid operation POST: invalid external docs: the tool does not need them",
				"unsupported: a server without a url at invalid servers: the tool sends its requests to --url",
			},
		},
		{
			// api.video's pattern is 0, Codat's examples a map; Swagger
			// 2.0's properties say "required: true".
			name: "schema keywords whose values are not of their types",
			doc: `openapi: 3.0.3
info: {title: T, version: "1"}
paths:
  /videos:
    post:
      parameters: [{name: Idempotency-Key, in: header, schema: {type: string}}]
      requestBody:
        content:
          application/json:
            schema:
              type: object
              properties:
                timecode: {type: string, pattern: 0}
                title: {type: string, required: true, minLength: "3"}
                tags: {type: array, items: [{type: string}, {type: integer}]}
              examples: {first: {value: {title: A}}}
      responses: {'200': {description: OK}}
`,
			notices: []string{
				`unsupported: a schema's pattern that is not a string ("0") at /paths/~1videos/post/requestBody/content/application~1json/schema/properties/timecode/pattern (line 13): it is left out`,
				`unsupported: a schema's required that is not a list ("true") at /paths/~1videos/post/requestBody/content/application~1json/schema/properties/title/required (line 14): it is left out`,
				`unsupported: a schema's minLength that is not a whole number ("3") at /paths/~1videos/post/requestBody/content/application~1json/schema/properties/title/minLength (line 14): it is left out`,
				`unsupported: a schema's items that are a list (a tuple, before JSON Schema 2020-12) at /paths/~1videos/post/requestBody/content/application~1json/schema/properties/tags/items (line 15): the items are taken as {}, which any value fits`,
				`unsupported: a schema's examples that is not a list (a map) at /paths/~1videos/post/requestBody/content/application~1json/schema/examples (line 16): it is left out`,
			},
			check: func(t *testing.T, doc *openapi3.T) {
				props := doc.Paths.Value("/videos").Post.RequestBody.Value.Content.Get("application/json").Schema.Value.Properties
				require.True(t, props["timecode"].Value.Type.Is("string"), "the rest of the schema stays")
				require.Empty(t, props["timecode"].Value.Pattern)
				require.NotNil(t, props["tags"].Value.Items, "items of any value")
			},
		},
		{
			name: "JSON that does not fit OpenAPI's types",
			doc: `{"openapi": "3.0.3", "info": {"title": "T", "version": "1"},
 "paths": {"/a": {"post": {"tags": "one", "responses": {"200": {"description": "OK"}}}}}}`,
			// Not what kin-openapi says of the block YAML it was handed:
			// neither a JSON error nor a line of that text.
			err: "the document does not fit OpenAPI's types: cannot construct !!str `one` into []string in /paths/~1a/post/tags",
		},
		{
			// An alias naming the node that holds it is no JSON document,
			// and walking it would never end.
			name: "a YAML alias that contains itself",
			doc: `openapi: 3.0.3
info: {title: T, version: "1"}
paths:
  /a: {post: {requestBody: {content: {application/json: {schema: {$ref: '#/components/schemas/A'}}}}, responses: {'200': {description: OK}}}}
components:
  schemas:
    A: &a {type: object, properties: {self: *a}}
`,
			err: `anchor "a" value contains itself`,
		},
		{
			name: "an invalid document",
			doc: `openapi: 3.0.3
info: {title: T, version: "1"}
paths:
  /a: {post: {parameters: [{name: a, in: body, schema: {type: string}}], responses: {'200': {description: OK}}}}
`,
			err: `not a valid OpenAPI document: invalid paths: invalid path /a: invalid operation POST: parameter can't have 'in' value "body"`,
		},
		{
			// Each of its operations would be an error of its own.
			name: "a Swagger 2.0 document",
			doc: `swagger: "2.0"
info: {title: T, version: "1"}
paths:
  /pets:
    post:
      parameters: [{name: pet, in: body, schema: {type: object}}]
      responses: {'200': {description: OK}}
`,
			err: "a Swagger 2.0 document: the tool reads OpenAPI 3.0 and 3.1 (convert it to OpenAPI 3 first",
		},
		{name: "a list", doc: `[{"openapi": "3.1.0"}]`, err: "not an OpenAPI document: it holds no object of fields"},
		{name: "no version", doc: "asyncapi: 2.6.0\ninfo: {title: T, version: \"1\"}\nchannels: {}\n", err: "not an OpenAPI document: it has no openapi field"},
		{name: "another major version", doc: "openapi: 4.0.0\ninfo: {title: T, version: \"1\"}\npaths: {}\n", err: `OpenAPI "4.0.0": the tool reads OpenAPI 3.0 and 3.1`},
		{name: "an empty file", doc: "", err: "the document is empty"},
		{name: "neither YAML nor JSON", doc: `{"openapi": "3.1.0",`, err: "neither YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "openapi.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.doc), 0o600))
			doc, notices, err := Load(path)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Len(t, notices, len(tc.notices), "%q", notices)
			for i, n := range notices {
				require.Contains(t, n.String(), tc.notices[i])
			}
			if tc.check != nil {
				tc.check(t, doc)
			}
		})
	}
}

// TestLoadOwnDocuments: the documents of this repository load as
// kin-openapi loads them, without a notice.
func TestLoadOwnDocuments(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"../../openapi.yaml", "testdata/customers.yaml", "testdata/widgets.yaml"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			doc, notices, err := Load(path)
			require.NoError(t, err)
			require.Empty(t, notices)
			want, err := openapi3.NewLoader().LoadFromFile(path)
			require.NoError(t, err)
			require.Equal(t, want.Paths.InMatchingOrder(), doc.Paths.InMatchingOrder())
		})
	}
}

// TestBlockYAML: a document written out by blockYAML reads back to the
// same values, whatever its strings look like; timestamps stay the text
// they are written as.
func TestBlockYAML(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, doc string }{
		{"strings that look like other things", `
a: "123"
b: "true"
c: "null"
d: "~"
e: ""
f: "1e3"
g: "0x10"
h: "- dash"
i: "key: value"
j: "#not a comment"
k: " leading and trailing "
l: "quote \" and backslash \\ and tab \t"
m: "é ✓ \u2028 \U0001F600"
n: '@at'
o: "*star"
p: "&amp"
q: "!bang"
r: "%percent"
s: "{not: a map}"
t: "[not, a, list]"
u: "yes"
v: "on"
`},
		{"scalars", `
int: 42
negative: -7
float: 1.5
exponent: 1.5e3
true: true
false: false
null: null
tilde: ~
empty:
200: status
`},
		{"block scalars", `
literal: |
  line one
    indented
  line three
folded: >
  folded
  text
`},
		{"collections", `
empty map: {}
empty list: []
list of lists: [[1, 2], [], [[3]]]
list of maps: [{a: 1}, {}, {b: [x, {c: d}]}]
map: {nested: {deeper: {deepest: true}}}
`},
		{"aliases and merge keys", `
base: &base {a: 1, b: [x, y]}
copy: *base
merged:
  <<: *base
  c: 3
`},
		{"JSON", `{"a": "1", "b": 1, "c": [], "d": {}, "e": null, "f": 1.5e3, "g": "\u00e9\n\"", "h": [{"i": true}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var node yaml.Node
			require.NoError(t, yaml.Unmarshal([]byte(tc.doc), &node))
			out, err := blockYAML(&node)
			require.NoError(t, err)
			var want, got any
			require.NoError(t, yaml.Unmarshal([]byte(tc.doc), &want))
			require.NoError(t, yaml.Unmarshal(out, &got), "%s", out)
			require.Equal(t, want, got, "%s", out)
		})
	}

	var node yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte("date: 2024-01-01\n"), &node))
	out, err := blockYAML(&node)
	require.NoError(t, err)
	require.Equal(t, "\"date\": \"2024-01-01\"\n", string(out), "a timestamp is the text it is written as")

	require.NoError(t, yaml.Unmarshal([]byte("a: &a [1, *a]\n"), &node))
	_, err = blockYAML(&node)
	require.Error(t, err, "an alias in what it names never ends")
}
