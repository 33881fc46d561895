package conformance_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/conformance"
)

// shop serves testdata/shop.yaml on the public engine: cards of customers,
// invoices of customers and their payments. Each operation answers 404 for
// a resource that does not exist, so a request whose ids the tool made up
// cannot run.
func shop(t *testing.T) http.Handler {
	t.Helper()
	mux, handle := engineMux(t, "shop.yaml", shopValid)
	var mu sync.Mutex
	things := map[string]map[string]any{} // by path
	invoices := 0
	newID := func(prefix string) string {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return prefix + hex.EncodeToString(b[:])
	}
	// made stores a new resource under path, if parent exists.
	made := func(w http.ResponseWriter, r *http.Request, parent, path string, v map[string]any, location bool) {
		slow(r)
		mu.Lock()
		defer mu.Unlock()
		if parent != "" && things[parent] == nil {
			notFoundProblem(w, parent)
			return
		}
		things[path] = v
		if !location {
			path = ""
		}
		answerJSON(w, http.StatusCreated, path, v)
	}
	body := func(r *http.Request) map[string]any {
		v := map[string]any{}
		_ = json.NewDecoder(r.Body).Decode(&v)
		return v
	}
	handle("POST /customers", func(w http.ResponseWriter, r *http.Request) {
		v := body(r)
		v["id"] = newID("cus_")
		made(w, r, "", "/customers/"+v["id"].(string), v, true)
	})
	handle("POST /customers/{customer}/cards", func(w http.ResponseWriter, r *http.Request) {
		v := body(r)
		v["id"], v["customer"], v["verified"] = newID("card_"), r.PathValue("customer"), false
		made(w, r, "/customers/"+r.PathValue("customer"), "/customers/"+r.PathValue("customer")+"/cards/"+v["id"].(string), v, true)
	})
	handle("POST /customers/{customer}/cards/{card}/verify", func(w http.ResponseWriter, r *http.Request) {
		slow(r)
		mu.Lock()
		defer mu.Unlock()
		card := things["/customers/"+r.PathValue("customer")+"/cards/"+r.PathValue("card")]
		if card == nil {
			notFoundProblem(w, "card of that customer")
			return
		}
		card["verified"] = true
		answerJSON(w, http.StatusOK, "", card)
	})
	handle("POST /invoices", func(w http.ResponseWriter, r *http.Request) {
		v := body(r)
		mu.Lock()
		invoices++
		v["number"] = fmt.Sprintf("INV-%d", invoices)
		mu.Unlock()
		customer, _ := v["customer_id"].(string)
		made(w, r, "/customers/"+customer, "/invoices/"+v["number"].(string), v, false)
	})
	handle("POST /invoices/{invoice}/payments", func(w http.ResponseWriter, r *http.Request) {
		v := map[string]any{"id": newID("pay_"), "invoice": r.PathValue("invoice")}
		made(w, r, "/invoices/"+r.PathValue("invoice"), "/payments/"+v["id"].(string), v, false)
	})
	for _, pattern := range []string{"GET /customers/{customer}", "GET /customers/{customer}/cards/{card}"} {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if v := things[r.URL.Path]; v != nil {
				answerJSON(w, http.StatusOK, "", v)
				return
			}
			notFoundProblem(w, r.URL.Path)
		})
	}
	return mux
}

var (
	errInvalidRequest = errors.New("invalid request")
	shopIDs           = regexp.MustCompile(`^/customers/cus_[0-9a-f]+(/cards(/card_[0-9a-f]+/verify)?)?$|^/customers$|^/invoices(/INV-[0-9]+/payments)?$`)
	shopBody          = map[string]func(map[string]any) bool{
		"/customers": func(v map[string]any) bool { name, ok := v["name"].(string); return ok && name != "" && len(v) == 1 },
		"/cards":     func(v map[string]any) bool { s, ok := v["last4"].(string); return ok && len(s) == 4 && len(v) == 1 },
		"/invoices": func(v map[string]any) bool {
			amount, ok := v["amount"].(float64)
			_, named := v["customer_id"].(string)
			return ok && named && amount >= 1 && len(v) == 2
		},
	}
)

// shopValid refuses, before a key is claimed, what the document refuses:
// an id of the wrong form, or a body without what it requires.
func shopValid(r *http.Request, body []byte) error {
	if !shopIDs.MatchString(r.URL.Path) {
		return fmt.Errorf("%w: no such resource %s", errInvalidRequest, r.URL.Path)
	}
	for suffix, valid := range shopBody {
		if strings.HasSuffix(r.URL.Path, suffix) {
			var v map[string]any
			if json.Unmarshal(body, &v) != nil || !valid(v) {
				return fmt.Errorf("%w: the body is not what %s takes", errInvalidRequest, r.URL.Path)
			}
		}
	}
	return nil
}

// engineMux is a ServeMux for a test API on the public engine, serving
// testdata/spec: handle routes a pattern through the protocol, with the
// accounts of testScope, duplicates in flight answered at once, and
// valid's refusals answered 400 before a key is claimed.
func engineMux(t *testing.T, spec string, valid func(*http.Request, []byte) error) (*http.ServeMux, func(string, http.HandlerFunc)) {
	t.Helper()
	engine := idempotency.New(idempotency.Config{
		Scope:    testScope,
		Wait:     time.Millisecond,
		Validate: valid,
		WriteError: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, errInvalidRequest) {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"title":%q,"status":400}`, err)
				return
			}
			idempotency.ProblemWriter("")(w, r, err)
		},
	})
	ops, err := oapi.New(loadSpec(t, spec), engine)
	require.NoError(t, err)
	oapi.BindRest(ops, idempotency.Store[*memstore.Tx](memstore.New()))
	middleware, err := ops.Middleware(nil)
	require.NoError(t, err)
	mux := http.NewServeMux()
	return mux, func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, middleware(h)) }
}

// answerJSON answers v with status, and a Location where path is given.
func answerJSON(w http.ResponseWriter, status int, path string, v map[string]any) {
	if path != "" {
		w.Header().Set("Location", path)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func notFoundProblem(w http.ResponseWriter, what string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, `{"title":"no such %s","status":404}`, what)
}

// TestChainsWithoutOverrides runs every check against an API whose
// operations need resources other operations make, with no overrides: a
// card is verified under the customer it was added to (the path of the
// request that made it, and the Location it answered with), an invoice
// names a customer by customer_id (a name match), and an invoice is paid
// by its number, which only the document's link says. Nothing fails and
// nothing needs an override.
func TestChainsWithoutOverrides(t *testing.T) {
	t.Parallel()
	results := check(t, shop(t), "shop.yaml", "", "oncekey")
	require.Empty(t, byStatus(results, conformance.Fail), reasons(results))
	for _, r := range results {
		if r.Check == "replay" || r.Check == "mismatch-request" || r.Check == "concurrent-once" || r.Check == "validation-not-stored" {
			require.Equal(t, conformance.Pass, r.Status, "%s on %s: %s", r.Check, r.Operation, r.Reason)
		}
	}
}

// TestPlanSaysWhereValuesComeFrom: --plan sends nothing and names, for
// each value, the source inference chose, in its order: override, link,
// Location, name match, example, schema.
func TestPlanSaysWhereValuesComeFrom(t *testing.T) {
	t.Parallel()
	plan := func(overrides string) map[string]map[string]string {
		t.Helper()
		o, err := conformance.ParseOverrides([]byte(overrides))
		require.NoError(t, err)
		plans, err := conformance.Plan(conformance.Config{Spec: loadSpec(t, "shop.yaml"), Overrides: o})
		require.NoError(t, err)
		out := map[string]map[string]string{}
		for _, p := range plans {
			out[p.Operation] = map[string]string{}
			for _, v := range p.Values {
				out[p.Operation][v.Where] = v.Source
			}
		}
		return out
	}
	got := plan("")
	require.Equal(t, map[string]map[string]string{
		"POST /customers":                                {"body": "example"},
		"POST /customers/{customer}/cards":               {"path customer": "Location", "body": "example"},
		"POST /customers/{customer}/cards/{card}/verify": {"path customer": "Location", "path card": "Location"},
		"POST /invoices":                                 {"body": "example", "body customer_id": "name match"},
		"POST /invoices/{invoice}/payments":              {"path invoice": "link"},
	}, got)

	got = plan(`
operations:
  payInvoice:
    path: {invoice: "{{create:POST /invoices .number}}"}
  createInvoice:
    body: {customer_id: cus_1, amount: 1}
`)
	require.Equal(t, "override", got["POST /invoices/{invoice}/payments"]["path invoice"])
	require.Equal(t, map[string]string{"body": "override"}, got["POST /invoices"], "an overridden body is taken as it is")

	got = plan(`
operations:
  verifyCard:
    path: {card: card_1}
`)
	require.Equal(t, map[string]string{"path customer": "example", "path card": "override"}, got["POST /customers/{customer}/cards/{card}/verify"],
		"a card the overrides name is under a customer the tool cannot make")

	var text bytes.Buffer
	plans, err := conformance.Plan(conformance.Config{Spec: loadSpec(t, "shop.yaml"), Only: []string{"verifyCard"}})
	require.NoError(t, err)
	require.NoError(t, conformance.WritePlan(&text, "text", plans))
	require.Equal(t, `POST /customers/{customer}/cards/{card}/verify (verifyCard)
  key                      header Idempotency-Key
  request                  POST /customers/{customer}/cards/{card}/verify
  path customer  Location  the path POST /customers/{customer}/cards was sent to when it made the card
  path card      Location  POST /customers/{customer}/cards answers with its Location, /customers/{customer}/cards/{card}
  needs                    POST /customers/{customer}/cards, POST /customers

1 operations under the protocol
`, text.String())
}
