package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// ordersDoc is the document of ordersAPI: POST /orders answers an order
// wrapped as Square's answers are ({"order": {"id": …}}), and GET
// /orders/{id} reads it the same way.
const ordersDoc = `openapi: 3.0.3
info: {title: Orders, version: "1"}
paths:
  /orders:
    post:
      operationId: createOrder
      parameters: [{name: Idempotency-Key, in: header, required: true, schema: {type: string}}]
      requestBody:
        required: true
        content:
          application/json:
            schema: {type: object, required: [amount], properties: {amount: {type: integer, minimum: 1, example: 100}}}
      responses:
        '201':
          description: Made.
          headers: {Location: {schema: {type: string}}}
          content: {application/json: {schema: {$ref: '#/components/schemas/Wrapped'}}}
        '400': {description: Refused., content: {application/json: {schema: {type: object}}}}
        '409': {description: In flight., content: {application/json: {schema: {type: object}}}}
        '422': {description: Reused., content: {application/json: {schema: {type: object}}}}
  /orders/{id}:
    get:
      parameters: [{name: id, in: path, required: true, schema: {type: string}}]
      responses:
        '200': {description: An order., content: {application/json: {schema: {$ref: '#/components/schemas/Wrapped'}}}}
        '404': {description: None., content: {application/json: {schema: {type: object}}}}
components:
  schemas:
    Wrapped:
      type: object
      properties:
        order: {type: object, properties: {id: {type: string}, amount: {type: integer}}}
        errors: {type: array, items: {type: object}}
`

// ordersAPI keeps the protocol as the ietf profile has it, but for what
// broken says: "two-run" runs identical requests that arrive together
// each (its check and its write of the key are apart), "shared-keys"
// keys are not the caller's (another account's request under a key gets
// the first's order), "invalid-consumes" a request refused as invalid
// takes its key (the valid one under it is 422, "key reused"). Its replays differ from the first answer in their
// headers: the first carries a Location and its replays none (but
// Idempotent-Replayed), as a middleware that replays the body alone does.
func ordersAPI(broken string) http.Handler {
	var mu sync.Mutex
	orders := map[string][]byte{}
	keys := map[string]string{}           // scope+key → order id
	running := map[string]chan struct{}{} // scope+key → closed when it ends
	n := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", fmt.Sprint(time.Now().UnixNano()))
		if r.Method == http.MethodGet {
			mu.Lock()
			b, ok := orders[strings.TrimPrefix(r.URL.Path, "/orders/")]
			mu.Unlock()
			if !ok {
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, `{}`)
				return
			}
			_, _ = w.Write(b)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		if key == "" || len(key) > 255 {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"errors":[{"code":"BAD_KEY"}]}`)
			return
		}
		var in struct {
			Amount int `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount < 1 {
			if broken == "invalid-consumes" {
				mu.Lock()
				keys[r.Header.Get("Authorization")+" "+key] = "refused"
				mu.Unlock()
			}
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"errors":[{"code":"BAD_AMOUNT"}]}`)
			return
		}
		scoped := r.Header.Get("Authorization") + " " + key
		if broken == "shared-keys" {
			scoped = key
		}
		mu.Lock()
		if wait, ok := running[scoped]; ok {
			mu.Unlock()
			<-wait // a duplicate waits for the first, then replays it
			mu.Lock()
		}
		if id, ok := keys[scoped]; ok {
			b := orders[id]
			mu.Unlock()
			var o struct{ Order struct{ Amount int } }
			_ = json.Unmarshal(b, &o)
			if o.Order.Amount != in.Amount {
				w.WriteHeader(http.StatusUnprocessableEntity)
				fmt.Fprint(w, `{"errors":[{"code":"KEY_REUSED"}]}`)
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(b)
			return
		}
		done := make(chan struct{})
		if broken != "two-run" {
			running[scoped] = done
		}
		n++
		id := fmt.Sprintf("ord_%d", n)
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // pacing: the order takes a while, so that duplicates arrive while it runs
		b, _ := json.Marshal(map[string]any{"order": map[string]any{"id": id, "amount": in.Amount}})
		mu.Lock()
		orders[id], keys[scoped] = b, id
		delete(running, scoped)
		close(done)
		mu.Unlock()
		w.Header().Set("Location", "/orders/"+id) // on the first answer alone
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	})
}

// TestChecksCountWhatRan: concurrent-once and in-flight count what ran by
// the resources the answers name, found where the answer keeps its id
// (here wrapped, {"order": {"id": …}}): an API whose replays differ from
// the first answer in their headers alone (no Location) passes them, and
// fails replay;
// one that runs two of the identical requests fails, saying how many it
// made. credential-isolation finds the wrapped id too: it passes where
// keys are the caller's, and fails where another account gets the
// first's order, with no replay header to go by (profile ietf). And
// validation-not-stored fails an API whose invalid request takes its key
// whatever status the valid one gets then.
func TestChecksCountWhatRan(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(ordersDoc))
	require.NoError(t, err)
	runAs := func(t *testing.T, profile, broken string, only ...string) map[string]conformance.Result {
		srv := httptest.NewServer(ordersAPI(broken))
		t.Cleanup(srv.Close)
		results, err := conformance.Run(context.Background(), conformance.Config{
			Spec: doc, BaseURL: srv.URL, Auth: "Bearer a", Auth2: "Bearer b", Profile: conformance.Profiles[profile], Only: only,
		})
		require.NoError(t, err)
		byCheck := map[string]conformance.Result{}
		for _, r := range results {
			byCheck[r.Check] = r
		}
		return byCheck
	}
	run := func(t *testing.T, broken string, only ...string) map[string]conformance.Result {
		return runAs(t, "ietf", broken, only...)
	}
	t.Run("correct", func(t *testing.T) {
		t.Parallel()
		r := run(t, "")
		for id, r := range r {
			if id == "replay" {
				continue
			}
			require.Contains(t, []conformance.Status{conformance.Pass, conformance.Skip}, r.Status, "%s: %s", id, r.Reason)
		}
		require.Equal(t, conformance.Pass, r["concurrent-once"].Status, r["concurrent-once"].Reason)
		// Where the profile marks replays, the one that ran is the one
		// answer not marked, however the answers came back in order.
		for range 3 {
			once := runAs(t, "stripe", "", "concurrent-once")["concurrent-once"]
			require.Equal(t, conformance.Pass, once.Status, "stripe: %s", once.Reason)
		}
		require.Equal(t, conformance.Pass, r["credential-isolation"].Status, "the wrapped id is found: %s", r["credential-isolation"].Reason)
		// The replay without the first's Location is the replay check's
		// finding, and its reason says so.
		require.Equal(t, conformance.Fail, r["replay"].Status)
		require.Contains(t, r["replay"].Reason, `the same answer with another Location: "", first "/orders/ord_`)
	})
	t.Run("two run", func(t *testing.T) {
		t.Parallel()
		r := run(t, "two-run", "concurrent-once")["concurrent-once"]
		require.Equal(t, conformance.Fail, r.Status)
		require.Regexp(t, `^10 identical requests sent at once made \d+ resources \(ord_\d+, .*\): more than one ran$`, r.Reason)
	})
	t.Run("shared keys", func(t *testing.T) {
		t.Parallel()
		r := run(t, "shared-keys", "credential-isolation")["credential-isolation"]
		require.Equal(t, conformance.Fail, r.Status)
		require.Contains(t, r.Reason, "got the first's resource ord_")
	})
	// A valid request refused under the key of an invalid one consumed
	// it, whatever the status says so: 422 where profile oncekey's
	// mismatch is 409 is no pass.
	t.Run("an invalid request consumes its key", func(t *testing.T) {
		t.Parallel()
		for _, profile := range []string{"oncekey", "ietf", "stripe"} {
			require.Equal(t, conformance.Pass, runAs(t, profile, "", "validation-not-stored")["validation-not-stored"].Status, profile)
			r := runAs(t, profile, "invalid-consumes", "validation-not-stored")["validation-not-stored"]
			require.Equal(t, conformance.Fail, r.Status, profile)
			require.Contains(t, r.Reason, "the refused request consumed the key: the valid request under it got 422", profile)
		}
	})
}
