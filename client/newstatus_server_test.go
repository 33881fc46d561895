package client_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
	"github.com/oncekey/oncekey/internal/service/openenum"
)

// newStatus is the value a later contract adds to every open enum: what an
// SDK generated before it must read without an error.
const newStatus = "disputed"

// newStatusFile holds what a server whose contract gained newStatus answers
// to GET /orders/{id}, /payments/{id} and /refunds/{id}: an order, a
// payment and a refund in that status. The TypeScript SDK's test
// (sdk/typescript/test/new-status.test.ts) serves the same file, so both
// SDKs read the answers that TestNewStatusAnswers proves valid.
const newStatusFile = "testdata/new-status.json"

// newStatusAnswer is one body of newStatusFile, its resource's id and the
// path it answers.
type newStatusAnswer struct {
	id, path string
	body     json.RawMessage
}

// newStatusAnswers reads newStatusFile: its order, payment and refund, by
// those names.
func newStatusAnswers(t *testing.T) map[string]newStatusAnswer {
	t.Helper()
	raw, err := os.ReadFile(newStatusFile)
	require.NoError(t, err, "the answers of a server with a new status")
	var bodies map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &bodies), "%s", newStatusFile)
	collections := map[string]string{"order": "/orders/", "payment": "/payments/", "refund": "/refunds/"}
	require.Len(t, bodies, len(collections), "%s holds an order, a payment and a refund, and nothing else", newStatusFile)
	answers := make(map[string]newStatusAnswer, len(bodies))
	for name, body := range bodies {
		collection, ok := collections[name]
		require.True(t, ok, "%s: %q is not an order, a payment or a refund", newStatusFile, name)
		var resource struct{ ID string }
		require.NoError(t, json.Unmarshal(body, &resource), "%s: the %s", newStatusFile, name)
		require.NotEmpty(t, resource.ID, "%s: the %s has an id", newStatusFile, name)
		answers[name] = newStatusAnswer{id: resource.ID, path: collection + resource.ID, body: body}
	}
	return answers
}

// newStatusServer serves newStatusFile: each body with 200 on GET of its
// path, 404 to anything else. Which contract its answers keep is the
// transport's to check (validatingClient), as a client sees them.
func newStatusServer(t *testing.T) *httptest.Server {
	t.Helper()
	byPath := map[string][]byte{}
	for _, a := range newStatusAnswers(t) {
		byPath[a.path] = a.body
	}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := byPath[r.URL.Path]
		if !ok || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
	t.Cleanup(server.Close)
	return server
}

// loadContract loads openapi.yaml, the contract the SDKs are generated
// from, as kin-openapi reads it (x-open-enum is no notion of kin-openapi's:
// to it, every enum is closed).
func loadContract(t *testing.T) ([]byte, *openapi3.T) {
	t.Helper()
	raw, err := os.ReadFile("../openapi.yaml")
	require.NoError(t, err, "openapi.yaml")
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	require.NoError(t, err, "load openapi.yaml")
	require.NoError(t, doc.Validate(t.Context()), "openapi.yaml is a valid contract")
	return raw, doc
}

// laterContract is openapi.yaml as a later release may have it: newStatus
// added to every enum it declares open, which the breaking-change gate
// (make api/breaking) lets a release do. It fails the test unless every
// open enum openenum.Find sees was widened, and at least the statuses of
// orders, payments and refunds.
func laterContract(t *testing.T) *openapi3.T {
	t.Helper()
	raw, doc := loadContract(t)
	open, err := openenum.Find(raw)
	require.NoError(t, err, "the open enums of openapi.yaml")
	require.Subset(t, open, []string{
		"/components/schemas/Order/properties/status",
		"/components/schemas/Payment/properties/status",
		"/components/schemas/Refund/properties/status",
	}, "the statuses of orders, payments and refunds are open enums")
	widened := 0
	for _, schema := range doc.Components.Schemas {
		widened += widenOpenEnums(schema, newStatus)
	}
	require.Equal(t, len(open), widened, "every open enum of openapi.yaml (%v) gained %q", open, newStatus)
	require.NoError(t, doc.Validate(t.Context()), "the later contract is a valid contract")
	return doc
}

// widenOpenEnums adds value to every open enum in ref and the schemas
// written inside it, and returns how many it widened. A $ref is left
// alone: it names a component, widened as one of them, once.
func widenOpenEnums(ref *openapi3.SchemaRef, value string) int {
	if ref == nil || ref.Ref != "" || ref.Value == nil {
		return 0
	}
	s, widened := ref.Value, 0
	if open, _ := s.Extensions[openenum.Marker].(bool); open && len(s.Enum) > 0 {
		s.Enum = append(s.Enum, value)
		widened++
	}
	inside := []*openapi3.SchemaRef{s.Items, s.Not, s.AdditionalProperties.Schema}
	for _, p := range s.Properties {
		inside = append(inside, p)
	}
	for _, refs := range []openapi3.SchemaRefs{s.AllOf, s.AnyOf, s.OneOf} {
		inside = append(inside, refs...)
	}
	for _, r := range inside {
		widened += widenOpenEnums(r, value)
	}
	return widened
}

// validatingClient is an HTTP client to baseURL that checks every answer
// against doc (status, headers, body), as a client receives it; the test
// ends with how many were checked and what violated doc.
func validatingClient(t *testing.T, doc *openapi3.T, baseURL string) (*http.Client, *conformance.ValidatingTransport) {
	t.Helper()
	transport, err := conformance.NewValidatingTransport(doc, baseURL, nil)
	require.NoError(t, err, "a transport that validates against the contract")
	return &http.Client{Transport: transport}, transport
}
