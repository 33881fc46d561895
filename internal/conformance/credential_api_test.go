package conformance_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/conformance"
)

// presenters read the credential a request carries where each security
// scheme of testdata/transfers.yaml puts it ("": none there).
var presenters = map[string]func(r *http.Request) string{
	"apiKeyHeader": func(r *http.Request) string { return r.Header.Get("X-API-Key") },
	"apiKeyQuery":  func(r *http.Request) string { return r.URL.Query().Get("api_key") },
	"apiKeyCookie": func(r *http.Request) string {
		c, err := r.Cookie("session_key")
		if err != nil {
			return ""
		}
		return c.Value
	},
	"basic": func(r *http.Request) string {
		user, password, ok := r.BasicAuth()
		if !ok {
			return ""
		}
		return user + ":" + password
	},
	"bearer": bearer,
	"oauth":  bearer,
}

func bearer(r *http.Request) string {
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return token
}

var errBadTransfer = errors.New("invalid transfer")

// transferParams reads a transfer's parameters: an integer amount from 1
// to 1000000 and a currency, EUR or USD, and nothing else.
func transferParams(body []byte) (map[string]any, error) {
	var in struct {
		Amount   int    `json:"amount"`
		Currency string `json:"currency"`
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadTransfer, err)
	}
	if in.Amount < 1 || in.Amount > 1_000_000 || (in.Currency != "EUR" && in.Currency != "USD") {
		return nil, fmt.Errorf("%w: amount from 1 to 1000000 in EUR or USD", errBadTransfer)
	}
	return map[string]any{"amount": in.Amount, "currency": in.Currency}, nil
}

// transfersAPI is an API of transfers built on the idempotency package as
// an outside service would be, which reads its callers' credentials where
// the security scheme named says (and answers 401 without one it knows):
// accounts maps each credential, as the API reads it, to its account, the
// scope of its keys and the owner of its transfers.
func transfersAPI(t *testing.T, doc *openapi3.T, scheme string, accounts map[string]string) http.Handler {
	t.Helper()
	presented := presenters[scheme]
	require.NotNil(t, presented, "no presenter for scheme %s", scheme)
	account := func(r *http.Request) string {
		if c := presented(r); c != "" {
			return accounts[c]
		}
		return ""
	}
	engine := idempotency.New(idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			if a := account(r); a != "" {
				return a, nil
			}
			return "", idempotency.ErrNoScope
		},
		Wait: time.Millisecond,
		Validate: func(_ *http.Request, body []byte) error {
			_, err := transferParams(body)
			return err
		},
		WriteError: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, errBadTransfer) {
				problem(w, http.StatusBadRequest, err.Error())
				return
			}
			idempotency.ProblemWriter("")(w, r, err)
		},
	})
	ops, err := oapi.New(doc, engine)
	require.NoError(t, err)
	create, err := oapi.Bind(ops, "createTransfer", idempotency.Store[*memstore.Tx](memstore.New()))
	require.NoError(t, err)
	middleware, err := ops.Middleware(nil)
	require.NoError(t, err)

	var mu sync.Mutex
	transfers, owners := map[string]map[string]any{}, map[string]string{}
	write := func(w http.ResponseWriter, status int, tr map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(tr)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slow(r)
		body, _ := io.ReadAll(r.Body)
		tr, err := transferParams(body)
		if err != nil {
			problem(w, http.StatusBadRequest, err.Error())
			return
		}
		id := uuid.NewString()
		tr["id"] = id
		mu.Lock()
		transfers[id], owners[id] = tr, account(r)
		mu.Unlock()
		if tx, ok := create.Unit(r.Context()); ok {
			tx.OnRollback(func() { mu.Lock(); delete(transfers, id); mu.Unlock() })
		}
		w.Header().Set("Location", "/transfers/"+id)
		write(w, http.StatusCreated, tr)
	})))
	mux.HandleFunc("GET /transfers/{id}", func(w http.ResponseWriter, r *http.Request) {
		a := account(r)
		if a == "" {
			problem(w, http.StatusUnauthorized, "who are you?")
			return
		}
		mu.Lock()
		defer mu.Unlock()
		id := r.PathValue("id")
		if tr := transfers[id]; tr != nil && owners[id] == a {
			write(w, http.StatusOK, tr)
			return
		}
		problem(w, http.StatusNotFound, "no such transfer")
	})
	return mux
}

// transfersDoc is testdata/transfers.yaml with security: the one scheme
// named.
func transfersDoc(t *testing.T, scheme string) *openapi3.T {
	t.Helper()
	doc := loadSpec(t, "transfers.yaml")
	doc.Security = openapi3.SecurityRequirements{{scheme: []string{}}}
	return doc
}

const transfersOverrides = `
operations:
  createTransfer:
    slow: {header: {X-Slow: 300ms}}
`

// runTransfers runs every check against h under the credentials given.
func runTransfers(t *testing.T, h http.Handler, doc *openapi3.T, auth, auth2 string) []conformance.Result {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	o, err := conformance.ParseOverrides([]byte(transfersOverrides))
	require.NoError(t, err)
	results, err := conformance.Run(context.Background(), conformance.Config{
		Spec: doc, BaseURL: srv.URL, Auth: auth, Auth2: auth2, Overrides: o,
	})
	require.NoError(t, err)
	return results
}

func basicOf(userPassword string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(userPassword))
}

// An API that takes its credentials in a header of its own, the query, a
// cookie, Basic or Bearer, as its document declares, passes every check
// with the credentials given bare (placed as the document says) or as the
// header they go in: the two accounts' keys stay apart wherever they are
// sent.
func TestCredentialsWhereTheDocumentSays(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, scheme string
		accounts     map[string]string // as the API reads them
		auth, auth2  string
	}{
		{"api key header, bare", "apiKeyHeader", map[string]string{"key-a": "a", "key-b": "b"}, "key-a", "key-b"},
		{"api key header, as the header", "apiKeyHeader", map[string]string{"key-a": "a", "key-b": "b"}, "X-API-Key: key-a", "X-API-Key: key-b"},
		{"api key in the query, bare", "apiKeyQuery", map[string]string{"key&a=b+c%": "a", "key-b": "b"}, "key&a=b+c%", "key-b"},
		{"api key cookie, bare", "apiKeyCookie", map[string]string{"key-a": "a", "key-b": "b"}, "key-a", "key-b"},
		{"api key cookie, as the Cookie header", "apiKeyCookie", map[string]string{"key-a": "a", "key-b": "b"}, "Cookie: session_key=key-a", "Cookie: session_key=key-b"},
		{"basic, bare user:password", "basic", map[string]string{"alice:pw-a": "a", "bob:pw:b": "b"}, "alice:pw-a", "bob:pw:b"},
		{"basic, bare key without password", "basic", map[string]string{"sk_test_a:": "a", "sk_test_b:": "b"}, "sk_test_a", "sk_test_b"},
		{"basic, as Basic", "basic", map[string]string{"alice:pw-a": "a", "bob:pw-b": "b"}, basicOf("alice:pw-a"), basicOf("bob:pw-b")},
		{"bearer, bare", "bearer", map[string]string{"tok-a": "a", "tok-b": "b"}, "tok-a", "tok-b"},
		{"bearer, as Bearer", "bearer", map[string]string{"tok-a": "a", "tok-b": "b"}, "Bearer tok-a", "Bearer tok-b"},
		{"bearer, as the Authorization header", "bearer", map[string]string{"tok-a": "a", "tok-b": "b"}, "Authorization: Bearer tok-a", "Authorization: Bearer tok-b"},
		{"oauth2, bare", "oauth", map[string]string{"tok-a": "a", "tok-b": "b"}, "tok-a", "tok-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := transfersDoc(t, tt.scheme)
			results := runTransfers(t, transfersAPI(t, doc, tt.scheme, tt.accounts), doc, tt.auth, tt.auth2)
			require.Empty(t, byStatus(results, conformance.Fail), reasons(results))
			passed := map[string]bool{}
			for _, r := range results {
				passed[r.Check] = r.Status == conformance.Pass
			}
			for _, id := range []string{"replay", "credential-isolation", "concurrent-once", "validation-not-stored", "response-valid"} {
				require.True(t, passed[id], "%s passes:\n%s", id, reasons(results))
			}
		})
	}
}

// A credential sent where the API does not read it is refused, and the
// checks say so: the header named is not the API's, or the document says
// the query where the API reads a header.
func TestCredentialsMisplacedAreRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, declared, read string // the document's scheme; the API's
		auth                 string
	}{
		{"another header", "apiKeyHeader", "apiKeyHeader", "X-Api-Token: key-a"},
		{"the document says the query, the API reads a header", "apiKeyQuery", "apiKeyHeader", "key-a"},
		{"Bearer where the API takes Basic", "basic", "basic", "Bearer key-a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := transfersDoc(t, tt.declared)
			api := transfersAPI(t, doc, tt.read, map[string]string{"key-a": "a"})
			results := runTransfers(t, api, doc, tt.auth, "")
			found := false
			for _, r := range results {
				if r.Check == "replay" {
					found = true
					require.Equal(t, conformance.Error, r.Status, "a refused credential is a setup error:\n%s", reasons(results))
					require.Contains(t, r.Reason, "credential (--auth) was refused", "the reason says why")
					require.Contains(t, r.Reason, "401", "the reason shows the answer")
				}
			}
			require.True(t, found, "replay ran:\n%s", reasons(results))
		})
	}
}

// A credential in the query never shows in a reason, even where the
// request failed and its error names the URL.
func TestQueryCredentialStaysOutOfReasons(t *testing.T) {
	t.Parallel()
	// The base URL answers (Run's probe sees an API there); every request
	// of an operation has its connection closed without an answer, a
	// transport error that names the URL.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			http.NotFound(w, r)
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	const secret = "sk_live_do_not_show"
	results, err := conformance.Run(context.Background(), conformance.Config{
		Spec: transfersDoc(t, "apiKeyQuery"), BaseURL: srv.URL, Auth: secret, Auth2: secret + "2",
	})
	require.NoError(t, err)
	failed := 0
	for _, r := range results {
		require.NotContains(t, r.Reason, secret, "%s on %s shows the credential", r.Check, r.Operation)
		if r.Status == conformance.Fail && strings.Contains(r.Reason, "/transfers") {
			failed++
		}
	}
	require.Positive(t, failed, "the checks failed naming the URL they could not reach:\n%s", reasons(results))
}
