package conformance_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// formsDoc declares two ways to send an API key, a header and a query
// parameter, either of which POST /notes takes.
const formsDoc = `openapi: 3.0.3
info: {title: Notes, version: "1"}
security: [{header: []}, {query: []}]
paths:
  /notes:
    post:
      parameters: [{name: Idempotency-Key, in: header, required: true, schema: {type: string}}]
      requestBody:
        required: true
        content: {application/json: {schema: {type: object, properties: {text: {type: string, example: hi}}}}}
      responses:
        '201': {description: Made., content: {application/json: {schema: {type: object, properties: {id: {type: string}}}}}}
        '401': {description: Who?, content: {application/json: {schema: {type: object}}}}
components:
  securitySchemes:
    header: {type: apiKey, in: header, name: X-API-Key}
    query: {type: apiKey, in: query, name: api_key}
`

// notesAPI takes its callers' API key in the header or the query. It
// keeps keys per caller, except where scopedByHeader: then a key is the
// header's caller's, and every caller sending the key in the query shares
// one scope (the empty header), a leak that only the query form shows.
func notesAPI(scopedByHeader bool) http.Handler {
	var mu sync.Mutex
	answers := map[string]string{}
	n := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		caller := r.Header.Get("X-API-Key")
		if caller == "" {
			caller = r.URL.Query().Get("api_key")
		}
		if caller == "" {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{}`)
			return
		}
		scope := caller
		if scopedByHeader {
			scope = r.Header.Get("X-API-Key")
		}
		key := scope + " " + r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		if b, ok := answers[key]; ok && r.Header.Get("Idempotency-Key") != "" {
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, b)
			return
		}
		n++
		answers[key] = fmt.Sprintf(`{"id":"note_%d"}`, n)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, answers[key])
	})
}

// TestIsolationUnderEveryCredentialForm: with bare credentials and a
// document that takes them in a header or in the query,
// credential-isolation runs both callers in each form. An API whose keys
// are scoped by the header alone keeps header callers apart and lets
// query callers see each other's answers: it fails, naming the form.
func TestIsolationUnderEveryCredentialForm(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(formsDoc))
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		broken bool
		status conformance.Status
	}{
		{"keys per caller", false, conformance.Pass},
		{"keys per header", true, conformance.Fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(notesAPI(tc.broken))
			t.Cleanup(srv.Close)
			results, err := conformance.Run(context.Background(), conformance.Config{
				Spec: doc, BaseURL: srv.URL, Auth: "alice", Auth2: "bob", Profile: conformance.Profiles["stripe"],
				Only: []string{"credential-isolation"},
			})
			require.NoError(t, err)
			require.Len(t, results, 1)
			require.Equal(t, tc.status, results[0].Status, results[0].Reason)
			if tc.broken {
				require.Contains(t, results[0].Reason, `both credentials sent by security scheme query (apiKey in query api_key): the second credential's request under the first's key was answered with a replay`)
			}
		})
	}
}
