package openenum_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/oncekey/oncekey/internal/service/openenum"
)

const base = `
components:
  schemas:
    Order:
      properties:
        status:
          type: string
          enum: [created, cancelled]
        reason:
          type: string
          enum: [a, b]
`

// enums reads the enum values at each path of doc.
func enums(t *testing.T, doc []byte) map[string][]string {
	t.Helper()
	var v struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct{ Enum []string }
			}
		}
	}
	require.NoError(t, yaml.Unmarshal(doc, &v), "decode %s", doc)
	props := v.Components.Schemas["Order"].Properties
	return map[string][]string{"status": props["status"].Enum, "reason": props["reason"].Enum}
}

func TestWiden(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, revision string
		want           map[string][]string
	}{
		{
			name:     "a value added to an open enum is in the widened base",
			revision: "components: {schemas: {Order: {properties: {status: {type: string, enum: [created, cancelled, disputed], x-open-enum: true}, reason: {type: string, enum: [a, b]}}}}}",
			want:     map[string][]string{"status": {"created", "cancelled", "disputed"}, "reason": {"a", "b"}},
		},
		{
			name:     "a value removed from an open enum stays in the base, for the gate to see",
			revision: "components: {schemas: {Order: {properties: {status: {type: string, enum: [created], x-open-enum: true}, reason: {type: string, enum: [a, b]}}}}}",
			want:     map[string][]string{"status": {"created", "cancelled"}, "reason": {"a", "b"}},
		},
		{
			name:     "a value added to a closed enum is not",
			revision: "components: {schemas: {Order: {properties: {status: {type: string, enum: [created, cancelled]}, reason: {type: string, enum: [a, b, c]}}}}}",
			want:     map[string][]string{"status": {"created", "cancelled"}, "reason": {"a", "b"}},
		},
		{
			name:     "an enum the base has not got is left alone",
			revision: "components: {schemas: {Refund: {properties: {status: {type: string, enum: [x], x-open-enum: true}}}}}",
			want:     map[string][]string{"status": {"created", "cancelled"}, "reason": {"a", "b"}},
		},
		{
			name:     "x-open-enum: false is closed",
			revision: "components: {schemas: {Order: {properties: {status: {type: string, enum: [created, cancelled, disputed], x-open-enum: false}}}}}",
			want:     map[string][]string{"status": {"created", "cancelled"}, "reason": {"a", "b"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := openenum.Widen([]byte(base), []byte(tt.revision))
			require.NoError(t, err, "widen")
			require.Equal(t, tt.want, enums(t, out), "the widened base:\n%s", out)
		})
	}
}

func TestWidenRefusesWhatIsNotYAML(t *testing.T) {
	t.Parallel()
	_, err := openenum.Widen([]byte(base), []byte("{not: yaml"))
	require.Error(t, err, "a revision that does not parse")
	_, err = openenum.Widen([]byte("a: [b"), []byte(base))
	require.Error(t, err, "a base that does not parse")
}

// TestContractsOpenEnums: openapi.yaml declares open exactly the statuses
// of orders, payments and refunds, which gain values as the API grows; an
// enum opened by mistake (a failure reason, say) would let the gate pass a
// value no client was told to expect.
func TestContractsOpenEnums(t *testing.T) {
	t.Parallel()
	spec, err := os.ReadFile("../../../openapi.yaml")
	require.NoError(t, err, "read openapi.yaml")
	found, err := openenum.Find(spec)
	require.NoError(t, err, "find the open enums")
	require.Equal(t, []string{
		"/components/schemas/Order/properties/status",
		"/components/schemas/Payment/properties/status",
		"/components/schemas/Refund/properties/status",
	}, found)
}
