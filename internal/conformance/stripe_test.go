package conformance_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/conformance"
)

// stripeLike is an API in Stripe's manner, built on the idempotency package
// as an outside service would be: the key is optional, a reused key with
// other parameters is 400, a duplicate in flight 409, errors are Stripe's
// {"error": {...}} objects, and its document is OpenAPI 3.1.
func stripeLike(t *testing.T, doc *openapi3.T) http.Handler {
	t.Helper()
	engine := idempotency.New(idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			if a := r.Header.Get("Authorization"); a == "Bearer a" || a == "Bearer b" {
				return a, nil
			}
			return "", idempotency.ErrNoScope
		},
		Wait:       time.Millisecond,
		WriteError: stripeError,
		Validate: func(_ *http.Request, body []byte) error {
			var p struct {
				Email *string `json:"email"`
			}
			if json.Unmarshal(body, &p) != nil || p.Email == nil {
				return errInvalid
			}
			return nil
		},
	})
	ops, err := oapi.New(doc, engine)
	require.NoError(t, err)
	store := idempotency.Store[*memstore.Tx](memstore.New())
	create, err := oapi.Bind(ops, "createCustomer", store)
	require.NoError(t, err)
	update, err := oapi.Bind(ops, "updateCustomer", store)
	require.NoError(t, err)
	middleware, err := ops.Middleware(nil)
	require.NoError(t, err)

	var mu sync.Mutex
	customers := map[string]map[string]any{}
	write := func(w http.ResponseWriter, c map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(c)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/customers", optionalKey(middleware, func(w http.ResponseWriter, r *http.Request) {
		slow(r)
		var c map[string]any
		json.NewDecoder(r.Body).Decode(&c)
		var id [6]byte
		_, _ = rand.Read(id[:])
		c["id"], c["object"] = "cus_"+hex.EncodeToString(id[:]), "customer"
		mu.Lock()
		customers[c["id"].(string)] = c
		mu.Unlock()
		if tx, ok := create.Unit(r.Context()); ok {
			tx.OnRollback(func() { mu.Lock(); delete(customers, c["id"].(string)); mu.Unlock() })
		}
		write(w, c)
	}))
	mux.Handle("POST /v1/customers/{id}", optionalKey(middleware, func(w http.ResponseWriter, r *http.Request) {
		slow(r)
		_, _ = update.Unit(r.Context())
		mu.Lock()
		defer mu.Unlock()
		c := customers[r.PathValue("id")]
		if c == nil {
			stripeErrorStatus(w, 404, "invalid_request_error", "No such customer")
			return
		}
		json.NewDecoder(r.Body).Decode(&c)
		write(w, c)
	}))
	mux.HandleFunc("GET /v1/customers/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if c := customers[r.PathValue("id")]; c != nil {
			write(w, c)
			return
		}
		stripeErrorStatus(w, 404, "invalid_request_error", "No such customer")
	})
	return mux
}

var errInvalid = errors.New("missing required param: email")

// optionalKey runs a request without an Idempotency-Key straight to the
// handler, as Stripe does; with one, through the protocol.
func optionalKey(middleware func(http.Handler) http.Handler, h http.HandlerFunc) http.Handler {
	protected := middleware(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.Header.Values(idempotency.HeaderKey)) == 0 {
			h(w, r)
			return
		}
		protected.ServeHTTP(w, r)
	})
}

// slow takes 50ms, so that identical requests sent at once overlap, or as
// long as X-Slow says.
func slow(r *http.Request) {
	d, err := time.ParseDuration(r.Header.Get("X-Slow"))
	if err != nil {
		d = 50 * time.Millisecond
	}
	time.Sleep(d)
}

// stripeError answers the protocol's refusals with Stripe's statuses.
func stripeError(w http.ResponseWriter, _ *http.Request, err error) {
	p, _ := idempotency.Describe(err)
	status := p.Status
	switch {
	case errors.Is(err, idempotency.ErrKeyMismatch), errors.Is(err, errInvalid):
		status = 400
	case errors.Is(err, idempotency.ErrInFlight):
		status = 409
	}
	stripeErrorStatus(w, status, "idempotency_error", err.Error())
}

func stripeErrorStatus(w http.ResponseWriter, status int, typ, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": typ, "message": message}})
}

const stripeOverrides = `
operations:
  updateCustomer:
    path: {id: "{{create:POST /v1/customers .id}}"}
    slow: {header: {X-Slow: 300ms}}
  createCustomer:
    slow: {header: {X-Slow: 300ms}}
`

// TestProfiles checks an API of another manner than Oncekey's: it keeps
// the promises as the stripe profile describes them, and the oncekey
// profile fails it on exactly the answers in which the two differ.
func TestProfiles(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t, "customers.yaml")
	tests := []struct {
		profile string
		failed  []string
	}{
		{"stripe", nil},
		{"oncekey", []string{"concurrent-once", "in-flight", "key-required", "mismatch-operation", "mismatch-request"}},
	}
	for _, tt := range tests {
		t.Run(tt.profile, func(t *testing.T) {
			t.Parallel()
			results := check(t, stripeLike(t, doc), "customers.yaml", stripeOverrides, tt.profile)
			require.Equal(t, tt.failed, byStatus(results, conformance.Fail), reasons(results))
		})
	}
}
