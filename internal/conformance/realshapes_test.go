package conformance_test

import (
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// TestPlanOnShapesOfRealDocuments: where a value comes from, in the
// shapes public payment and platform APIs' documents have (each case is a
// small document of the shape, written here): an id that is not "id", a
// resource wrapped in its answer, an answer that names nothing, paths
// with a trailing slash, path parameters declared out of the path's
// order.
func TestPlanOnShapesOfRealDocuments(t *testing.T) {
	t.Parallel()
	const head = `openapi: 3.0.3
info: {title: T, version: "1"}
components:
  parameters:
    Key: {name: Idempotency-Key, in: header, schema: {type: string}}
  schemas:
    Made: {type: object, properties: {id: {type: string}}}
paths:
`
	const square = `
  /v2/cards:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      responses:
        '200':
          description: OK
          content:
            application/json:
              schema:
                type: object
                properties:
                  errors: {type: array, items: {type: object, properties: {code: {type: string}}}}
                  card:
                    allOf: [{type: object, properties: {id: {type: string}, last_4: {type: string}}}]
  /v2/cards/{card_id}/disable:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: card_id, in: path, required: true, schema: {type: string}}
      responses: {'200': {description: OK}}
  /v2/refunds:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      requestBody:
        content:
          application/json:
            schema: {type: object, required: [card_id], properties: {card_id: {type: string}}}
      responses: {'200': {description: OK}}
`
	for _, tc := range []struct {
		name, paths string
		// want: for an operation, where each value comes from, as
		// "source: detail".
		operation string
		want      map[string]string
	}{
		{
			// Adyen's payment answers its pspReference, and has no id.
			name: "an answer without id: the field the parameter's name ends with",
			paths: `
  /payments:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      responses:
        '200':
          description: OK
          content:
            application/json:
              schema: {type: object, properties: {pspReference: {type: string}, resultCode: {type: string}}}
  /payments/{paymentPspReference}/refunds:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: paymentPspReference, in: path, required: true, schema: {type: string}}
      responses: {'201': {description: Refunded.}}
`,
			operation: "POST /payments/{paymentPspReference}/refunds",
			want: map[string]string{
				"path paymentPspReference": "name match: the pspReference POST /payments answers with (it makes /payments/{paymentPspReference})",
			},
		},
		{
			// Square's answers wrap the resource beside a list of errors.
			name:      "a resource wrapped in its answer",
			paths:     square,
			operation: "POST /v2/cards/{card_id}/disable",
			want: map[string]string{
				"path card_id": "name match: the card.id POST /v2/cards answers with (it makes /v2/cards/{card_id})",
			},
		},
		{
			name:      "a body field names a wrapped resource",
			paths:     square,
			operation: "POST /v2/refunds",
			want: map[string]string{
				"body":         "schema: the least value its schema accepts",
				"body card_id": "name match: the card.id POST /v2/cards answers with (card_id names what it makes)",
			},
		},
		{
			// GitHub names a stack by its number, beside its id.
			name: "a parameter named for a field of what is made",
			paths: `
  /stacks:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      responses:
        '201':
          description: Made.
          content:
            application/json:
              schema: {type: object, properties: {id: {type: integer}, number: {type: integer}}}
  /stacks/{stack_number}/merge:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: stack_number, in: path, required: true, schema: {type: integer}}
      responses: {'200': {description: OK}}
`,
			operation: "POST /stacks/{stack_number}/merge",
			want: map[string]string{
				"path stack_number": "name match: the number POST /stacks answers with (it makes /stacks/{stack_number})",
			},
		},
		{
			// Stripe's promotion code has a code, but its path takes its id.
			name: "a parameter named for the resource takes its id",
			paths: `
  /promotion_codes:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      responses:
        '200':
          description: OK
          content:
            application/json:
              schema: {type: object, properties: {id: {type: string}, code: {type: string}}}
  /promotion_codes/{promotion_code}:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: promotion_code, in: path, required: true, schema: {type: string}}
      responses: {'200': {description: OK}}
`,
			operation: "POST /promotion_codes/{promotion_code}",
			want: map[string]string{
				"path promotion_code": "name match: the id POST /promotion_codes answers with (it makes /promotion_codes/{promotion_code})",
			},
		},
		{
			// GitHub's POST …/restrictions/users answers the list of users;
			// Kubernetes' …/proxy answers a string.
			name: "an answer that names nothing made",
			paths: `
  /restrictions/users:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      responses:
        '200':
          description: OK
          content:
            application/json:
              schema: {type: array, items: {type: object, properties: {id: {type: integer}}}}
  /users/{user_id}/drafts:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: user_id, in: path, required: true, schema: {type: string}, example: u1}
      responses: {'200': {description: OK}}
`,
			operation: "POST /users/{user_id}/drafts",
			want: map[string]string{
				"path user_id": "example: the spec's example",
			},
		},
		{
			// Svix's paths end with a slash, and its operations declare
			// the deeper parameter first.
			name: "paths with a trailing slash, parameters out of the path's order",
			paths: `
  /app/:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      responses: {'201': {description: Made., content: {application/json: {schema: {$ref: '#/components/schemas/Made'}}}}}
  /app/{app_id}/endpoint/:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: app_id, in: path, required: true, schema: {type: string}}
      responses: {'201': {description: Made., content: {application/json: {schema: {$ref: '#/components/schemas/Made'}}}}}
  /app/{app_id}/endpoint/{endpoint_id}/recover/:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: endpoint_id, in: path, required: true, schema: {type: string}}
        - {name: app_id, in: path, required: true, schema: {type: string}}
      responses: {'202': {description: Accepted.}}
`,
			operation: "POST /app/{app_id}/endpoint/{endpoint_id}/recover/",
			want: map[string]string{
				"path endpoint_id": "name match: the id POST /app/{app_id}/endpoint/ answers with (it makes /app/{app_id}/endpoint/{endpoint_id})",
				"path app_id":      "name match: the path POST /app/{app_id}/endpoint/ was sent to when it made the endpoint_id",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			loader := openapi3.NewLoader()
			spec, err := loader.LoadFromData([]byte(head + tc.paths))
			require.NoError(t, err)
			require.NoError(t, spec.Validate(loader.Context))
			plans, err := conformance.Plan(conformance.Config{Spec: spec, Only: []string{tc.operation}})
			require.NoError(t, err)
			require.Len(t, plans, 1)
			got := map[string]string{}
			for _, v := range plans[0].Values {
				got[v.Where] = v.Source + ": " + v.Detail
			}
			require.Equal(t, tc.want, got, "the plan of %s", tc.operation)
		})
	}
}
