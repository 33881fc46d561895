package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/conformance"
)

// receiptsDoc is one operation under the protocol whose handler can be
// made to fail (X-Fail) or to answer large (X-Large) from outside.
const receiptsDoc = `openapi: 3.0.3
info: {title: Receipts, version: "1"}
paths:
  /receipts:
    post:
      operationId: createReceipt
      parameters: [{name: Idempotency-Key, in: header, required: true, schema: {type: string}}]
      requestBody:
        required: true
        content: {application/json: {schema: {type: object, properties: {total: {type: integer, example: 5}}}}}
      responses:
        '201': {description: Made., content: {application/json: {schema: {type: object}}}}
        '202': {description: In flight., content: {application/problem+json: {schema: {type: object}}}}
        '409': {description: Reused., content: {application/problem+json: {schema: {type: object}}}}
        '500': {description: Failed., content: {application/json: {schema: {type: object}}}}
`

// TestNewChecksAgainstTheEngine: error-not-stored, large-answer and
// retention pass against an API on Oncekey's engine (oapi's middleware,
// memstore), whose handler fails or answers large when asked to: the
// engine stores no 5xx, replays a 1.5 MiB answer whole and keeps its keys
// for their TTL. (Oncekey's own service cannot be made to fail or to
// answer large from outside, so against it the first two are skipped; the
// gateway runs them in TestConformanceThroughTheProxy.)
func TestNewChecksAgainstTheEngine(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(receiptsDoc))
	require.NoError(t, err)
	engine := idempotency.New(idempotency.Config{Scope: testScope, Wait: time.Millisecond})
	ops, err := oapi.New(doc, engine)
	require.NoError(t, err)
	oapi.BindRest(ops, idempotency.Store[*memstore.Tx](memstore.New()))
	middleware, err := ops.Middleware(nil)
	require.NoError(t, err)
	var made atomic.Int64
	mux := http.NewServeMux() // the middleware runs where the route is known
	mux.Handle("POST /receipts", middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("X-Fail") != "" {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":"asked to fail"}`)
			return
		}
		v := map[string]any{"id": fmt.Sprintf("rc_%d", made.Add(1))}
		if r.Header.Get("X-Large") != "" {
			v["note"] = strings.Repeat("x", 3<<19)
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(v)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	o, err := conformance.ParseOverrides([]byte(`
operations:
  createReceipt:
    fail: {header: {X-Fail: "1"}}
    large: {header: {X-Large: "1"}}
`))
	require.NoError(t, err)
	results, err := conformance.Run(context.Background(), conformance.Config{
		Spec: doc, BaseURL: srv.URL, Auth: "Bearer a", Profile: conformance.Profiles["oncekey"], Overrides: o,
		RetentionWait: 300 * time.Millisecond, Only: []string{"error-not-stored", "large-answer", "retention"},
	})
	require.NoError(t, err)
	require.Len(t, results, 3)
	for _, r := range results {
		require.Equal(t, conformance.Pass, r.Status, "%s: %s", r.Check, r.Reason)
	}
}
