package conformance_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
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
// as an outside service would be: parameters come as forms, the key is
// optional, a reused key with other parameters is 400, a duplicate in
// flight 409, errors are Stripe's {"error": {...}} objects, and its
// document is OpenAPI 3.1.
func stripeLike(t *testing.T, doc *openapi3.T) http.Handler {
	t.Helper()
	engine := idempotency.New(idempotency.Config{
		Scope:      testScope,
		Wait:       time.Millisecond,
		WriteError: stripeError,
		Validate: func(_ *http.Request, body []byte) error {
			_, err := customerParams(body)
			return err
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
		c, ok := readParams(w, r)
		if !ok {
			return
		}
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
		params, ok := readParams(w, r)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		c := customers[r.PathValue("id")]
		if c == nil {
			stripeErrorStatus(w, 404, "invalid_request_error", "No such customer")
			return
		}
		maps.Copy(c, params)
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

var errInvalid = errors.New("invalid request parameters")

// customerParams reads a customer's parameters from a form body (the
// engine hands the operation and Validate its canonical form): email,
// required; name; balance, an integer from 0 to 999999; nothing else, and
// each once.
func customerParams(body []byte) (map[string]any, error) {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalid, err)
	}
	if !form.Has("email") {
		return nil, fmt.Errorf("%w: missing required param: email", errInvalid)
	}
	c := map[string]any{}
	for name, values := range form {
		if len(values) != 1 {
			return nil, fmt.Errorf("%w: %s is given %d times", errInvalid, name, len(values))
		}
		switch v := values[0]; name {
		case "email", "name":
			c[name] = v
		case "balance":
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n >= 1_000_000 {
				return nil, fmt.Errorf("%w: balance must be an integer from 0 to 999999", errInvalid)
			}
			c[name] = n
		default:
			return nil, fmt.Errorf("%w: received unknown parameter: %s", errInvalid, name)
		}
	}
	return c, nil
}

// readParams reads the request's parameters, or answers 400: a request
// without a key reaches the handler without Validate.
func readParams(w http.ResponseWriter, r *http.Request) (map[string]any, bool) {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		var c map[string]any
		if c, err = customerParams(body); err == nil {
			return c, true
		}
	}
	stripeErrorStatus(w, http.StatusBadRequest, "invalid_request_error", err.Error())
	return nil, false
}

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
// long as X-Slow says. Every upstream of this package's tests runs its
// operations through it.
func slow(r *http.Request) {
	d, err := time.ParseDuration(r.Header.Get("X-Slow"))
	if err != nil {
		d = 50 * time.Millisecond
	}
	// pacing: an upstream slow on purpose, as the conformance tool expects
	// of the API it checks (its duplicates must meet a first request in
	// flight); the tool waits, this does not.
	time.Sleep(d)
}

// stripeError answers the protocol's refusals with Stripe's statuses.
func stripeError(w http.ResponseWriter, _ *http.Request, err error) {
	p := idempotency.ProblemOf(err)
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

// stripeOverrides give bodies with a space to spell as "+" or "%20", and
// values that mismatch-request changes (name, balance).
const stripeOverrides = `
operations:
  updateCustomer:
    path: {id: "{{create:POST /v1/customers .id}}"}
    body: {email: jenny.rosen@example.com, balance: 100}
    slow: {header: {X-Slow: 300ms}}
  createCustomer:
    body: {email: jenny.rosen@example.com, name: Jenny Rosen}
    slow: {header: {X-Slow: 300ms}}
`

// TestProfiles checks an API of another manner than Oncekey's: it keeps
// the promises as the stripe profile describes them, and the oncekey
// profile fails it on exactly the answers in which the two differ. Its
// bodies are forms: a form with its fields spelled otherwise
// replays (canonical-form), one with a value changed is refused
// (mismatch-request), on every operation.
func TestProfiles(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t, "customers.yaml")
	tests := []struct {
		profile string
		failed  []string
		passed  []string // on every operation
	}{
		{"stripe", nil, []string{"canonical-form", "mismatch-request", "replay", "validation-not-stored"}},
		{"oncekey", []string{"concurrent-once", "in-flight", "key-required", "mismatch-operation", "mismatch-request"}, []string{"canonical-form", "replay"}},
	}
	for _, tt := range tests {
		t.Run(tt.profile, func(t *testing.T) {
			t.Parallel()
			results := check(t, stripeLike(t, doc), "customers.yaml", stripeOverrides, tt.profile)
			require.Equal(t, tt.failed, byStatus(results, conformance.Fail), reasons(results))
			for _, r := range results {
				if slices.Contains(tt.passed, r.Check) {
					require.Equal(t, conformance.Pass, r.Status, "%s on %s: %s", r.Check, r.Operation, r.Reason)
				}
			}
		})
	}
}
