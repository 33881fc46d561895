package conformance

import (
	"encoding/json"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

func TestBodies(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(`
openapi: 3.1.0
info: {title: t, version: "1"}
paths: {}
components:
  schemas:
    Charge:
      type: object
      required: [amount, currency, card]
      properties:
        amount: {type: integer, minimum: 50, maximum: 99999999}
        currency: {type: string, enum: [usd, eur]}
        card:
          type: object
          required: [number]
          properties:
            number: {type: string, pattern: '^[0-9]{16}$', examples: ["4242424242424242"]}
        tags: {type: array, minItems: 2, items: {type: string, maxLength: 3}}
        note: {type: [string, "null"]}
`))
	require.NoError(t, err)
	charge := doc.Components.Schemas["Charge"]

	body := normalise(minimal(charge, 0))
	require.Equal(t, map[string]any{
		"amount": json.Number("50"), "currency": "usd", "card": map[string]any{"number": "4242424242424242"},
	}, body, "the smallest valid body: required properties, least number, first enum value, 3.1 examples")

	other, ok := varied(charge, body, 0)
	require.True(t, ok)
	require.Equal(t, 51.0, other.(map[string]any)["amount"], "the first property that can change, changed")

	bad, ok := invalid(charge, body)
	require.True(t, ok)
	require.NotContains(t, bad, "amount", "a required property left out")

	q, err := request{contentType: formMedia}.withBody(map[string]any{
		"amount": json.Number("1234567"), "card": map[string]any{"number": "42"}, "tags": []any{"a", "b"},
	})
	require.NoError(t, err)
	require.Equal(t, "amount=1234567&card%5Bnumber%5D=42&tags%5B0%5D=a&tags%5B1%5D=b", string(q.body))

	for v, want := range map[any]string{1234567.0: "1234567", json.Number("1152921504606846976"): "1152921504606846976", 1.5: "1.5", "x": "x"} {
		require.Equal(t, want, text(v))
	}
	_, ok = invalid(&openapi3.SchemaRef{Value: &openapi3.Schema{}}, map[string]any{})
	require.False(t, ok, "a schema that accepts anything has no invalid body")
}
