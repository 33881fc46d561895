package gateway_test

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// holdingUpstream answers 201 with a fresh id to every request, after
// holding it until release is closed when it asks to be held (X-Hold),
// and records what it received: the raw bodies and headers, by the value
// of the header or body field the test keys by.
type holdingUpstream struct {
	*httptest.Server
	arrived chan struct{} // a held request is upstream
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	got     []*http.Request
	bodies  [][]byte
}

func startHoldingUpstream(t *testing.T) *holdingUpstream {
	t.Helper()
	u := &holdingUpstream{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got, u.bodies = append(u.got, r), append(u.bodies, body)
		u.mu.Unlock()
		if r.Header.Get("X-Hold") != "" {
			u.arrived <- struct{}{}
			<-u.release
		} else {
			// pacing: an upstream slow on purpose, long enough for
			// duplicates to meet it in flight; nothing is waited for.
			time.Sleep(50 * time.Millisecond)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"` + uuid.NewString() + `"}`))
	}))
	t.Cleanup(u.Close)
	// Before the server closes (cleanups run last first): a test that
	// fails while a request is held still lets it go, or closing the
	// server would wait for it for ever.
	t.Cleanup(u.free)
	return u
}

// free lets every held request go.
func (u *holdingUpstream) free() { u.once.Do(func() { close(u.release) }) }

// received is what the upstream received: each request's headers, and
// its body.
func (u *holdingUpstream) received() ([]http.Header, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	var hs []http.Header
	var bs []string
	for i, r := range u.got {
		hs, bs = append(hs, r.Header), append(bs, string(u.bodies[i]))
	}
	return hs, bs
}

// send posts body to url with the headers given in pairs.
func send(t *testing.T, url, body string, header ...string) (*http.Response, string) {
	t.Helper()
	resp, got, err := trySend(url, body, header...)
	require.NoError(t, err)
	return resp, got
}

// trySend is send for a goroutine of the test's, which must not stop the
// test itself.
func trySend(url, body string, header ...string) (*http.Response, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// sendHeld sends a request the upstream holds, and reports its status (0
// if it failed) on the channel returned.
func sendHeld(url, body string, header ...string) <-chan int {
	status := make(chan int, 1)
	go func() {
		resp, _, err := trySend(url, body, append(header, "X-Hold", "1")...)
		if err != nil {
			status <- 0
			return
		}
		status <- resp.StatusCode
	}()
	return status
}

// TestProfiles: ietf, the default, answers a duplicate in flight 409 with
// Retry-After once --wait has passed, a key reused with another request
// 422, a missing key 400; oncekey, for the gateway or a route marked so in
// the routes file, answers 202 with Retry-After and 409. No 2xx that the
// upstream did not send ever comes from a gateway under ietf.
func TestProfiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		gatewayProfile     frontdoor.Profile
		routeProfile       string // the routes file's profile line
		inFlight, mismatch int
	}{
		{"ietf by default", "", "", http.StatusConflict, http.StatusUnprocessableEntity},
		{"oncekey for the gateway", frontdoor.Oncekey, "", http.StatusAccepted, http.StatusConflict},
		{"oncekey for a route", frontdoor.IETF, "\n    profile: oncekey", http.StatusAccepted, http.StatusConflict},
		{"ietf for a route of an oncekey gateway", frontdoor.Oncekey, "\n    profile: ietf", http.StatusConflict, http.StatusUnprocessableEntity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := startHoldingUpstream(t)
			rs, err := gateway.ReadRoutes(strings.NewReader("routes:\n  - method: POST\n    path: /charges" + tc.routeProfile + "\n"))
			require.NoError(t, err)
			gw := httptest.NewServer(newGateway(t, gateway.Config{
				Upstream: mustURL(t, up.URL), Routes: rs, Scope: keyscope.Header("X-Account-Id"),
				Profile: tc.gatewayProfile, Wait: 100 * time.Millisecond,
			}, memstore.New()))
			t.Cleanup(gw.Close)
			scope, key := "acct-"+rand.Text(), uuid.NewString()

			first := sendHeld(gw.URL+"/charges", `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, key)
			<-up.arrived
			start := time.Now()
			resp, body := send(t, gw.URL+"/charges", `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, key)
			require.Equal(t, tc.inFlight, resp.StatusCode, "a duplicate in flight: %s", body)
			require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "it waited for the first")
			require.Equal(t, "1", resp.Header.Get("Retry-After"))
			require.Equal(t, idempotency.ProblemOf(idempotency.ErrInFlight).Slug, problemType(t, body))
			up.free()
			require.Equal(t, http.StatusCreated, <-first)

			resp, body = send(t, gw.URL+"/charges", `{"amount":2}`, "X-Account-Id", scope, idempotency.HeaderKey, key)
			require.Equal(t, tc.mismatch, resp.StatusCode, "a key reused with another request: %s", body)
			require.Equal(t, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, problemType(t, body))

			resp, body = send(t, gw.URL+"/charges", `{"amount":1}`, "X-Account-Id", scope)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "no key: %s", body)
			require.Equal(t, idempotency.ProblemOf(idempotency.ErrMissingKey).Slug, problemType(t, body))
			_, bodies := up.received()
			require.Len(t, bodies, 1, "the upstream ran the first request alone")
		})
	}
}

// specWith202 covers five operations: /queued declares a 202, /charges
// does not, /payments takes its key in X-Idempotency-Key, /transfers in
// the header its x-idempotency names, and /square in the body field its
// x-idempotency names.
const specWith202 = `
openapi: 3.0.3
info: {title: charges, version: "1"}
paths:
  /queued:
    post:
      parameters:
        - {name: Idempotency-Key, in: header, required: true, schema: {type: string}}
      responses:
        '201': {description: done}
        '202': {description: still running}
  /charges:
    post:
      parameters:
        - {name: Idempotency-Key, in: header, required: true, schema: {type: string}}
      responses:
        '201': {description: done}
  /payments:
    post:
      parameters:
        - {name: x-idempotency-key, in: header, required: true, schema: {type: string}}
      responses:
        '201': {description: done}
  /transfers:
    post:
      x-idempotency: {key-header: PayPal-Request-Id}
      responses:
        '201': {description: done}
  /square:
    post:
      x-idempotency: {key-field: idempotency_key}
      responses:
        '201': {description: done}
`

// TestSpecProfileRule: with a document and --profile oncekey, only an
// operation that declares a 202 gets the oncekey answers; the others get
// ietf's, so the gateway never answers 2xx where the document promises
// none. A key header the document declares (X-Idempotency-Key) is where
// the gateway reads the key.
func TestSpecProfileRule(t *testing.T) {
	t.Parallel()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(specWith202))
	require.NoError(t, err)
	rs, err := gateway.SpecRoutes(doc)
	require.NoError(t, err)
	for _, tc := range []struct {
		path, keyHeader, keyField string
		inFlight, mismatch        int
	}{
		{"/queued", idempotency.HeaderKey, "", http.StatusAccepted, http.StatusConflict},
		{"/charges", idempotency.HeaderKey, "", http.StatusConflict, http.StatusUnprocessableEntity},
		{"/payments", "X-Idempotency-Key", "", http.StatusConflict, http.StatusUnprocessableEntity},
		{"/transfers", "PayPal-Request-Id", "", http.StatusConflict, http.StatusUnprocessableEntity},
		{"/square", idempotency.HeaderKey, "idempotency_key", http.StatusConflict, http.StatusUnprocessableEntity},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			up := startHoldingUpstream(t)
			gw := httptest.NewServer(newGateway(t, gateway.Config{
				Upstream: mustURL(t, up.URL), Routes: rs, Scope: keyscope.Header("X-Account-Id"),
				Profile: frontdoor.Oncekey, Wait: 50 * time.Millisecond,
			}, memstore.New()))
			t.Cleanup(gw.Close)
			scope, key := "acct-"+rand.Text(), uuid.NewString()
			// keyed is a request of amount under key (none: ""), where the
			// route reads it.
			keyed := func(amount int, key string) (string, []string) {
				header := []string{"X-Account-Id", scope}
				if tc.keyField == "" {
					if key != "" {
						header = append(header, tc.keyHeader, key)
					}
					return fmt.Sprintf(`{"amount":%d}`, amount), header
				}
				if key == "" {
					return fmt.Sprintf(`{"amount":%d}`, amount), header
				}
				return fmt.Sprintf(`{%q:%q,"amount":%d}`, tc.keyField, key, amount), header
			}
			body, header := keyed(1, key)
			first := sendHeld(gw.URL+tc.path, body, header...)
			<-up.arrived
			resp, answer := send(t, gw.URL+tc.path, body, header...)
			require.Equal(t, tc.inFlight, resp.StatusCode, "a duplicate in flight: %s", answer)
			require.Equal(t, []string{key}, resp.Header.Values(tc.keyHeader), "the key repeated where it was read")
			if tc.keyHeader != idempotency.HeaderKey {
				require.Empty(t, resp.Header.Values(idempotency.HeaderKey), "and in no other header")
			}
			up.free()
			require.Equal(t, http.StatusCreated, <-first)
			body, header = keyed(2, key)
			resp, answer = send(t, gw.URL+tc.path, body, header...)
			require.Equal(t, tc.mismatch, resp.StatusCode, "a key reused: %s", answer)
			if tc.keyField != "" {
				// The key sent in a header is not the key.
				body, header = keyed(1, "")
				resp, answer = send(t, gw.URL+tc.path, body, append(header, idempotency.HeaderKey, key)...)
				require.Equal(t, http.StatusBadRequest, resp.StatusCode, "the key in a header, not the body: %s", answer)
			}
			body, header = keyed(1, "")
			resp, answer = send(t, gw.URL+tc.path, body, header...)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "no key: %s", answer)
		})
	}
}

// stripeTemplate is the template docs/gateway.md shows, as shipped.
func stripeTemplate(t *testing.T) *frontdoor.Template {
	t.Helper()
	tmpl, err := gateway.ReadErrorTemplate(filepath.Join("..", "..", "deploy", "gateway", "stripe-error-template.json"))
	require.NoError(t, err)
	return tmpl
}

// TestErrorTemplate: with the Stripe-shaped template, every answer the
// gateway writes itself is {"error": {"type": "idempotency_error", "code":
// <the problem's code>, "message": <its detail>}} as application/json,
// with the status and headers it has without the template; a route's own
// template (error_template in the routes file) wins over the gateway's.
func TestErrorTemplate(t *testing.T) {
	t.Parallel()
	up := startHoldingUpstream(t)
	doc, err := openapi3.NewLoader().LoadFromData([]byte(`
openapi: 3.0.3
info: {title: charges, version: "1"}
paths:
  /charges:
    post:
      parameters:
        - {name: Idempotency-Key, in: header, required: true, schema: {type: string}}
      requestBody:
        required: true
        content:
          application/json:
            schema: {type: object, required: [amount], properties: {amount: {type: integer}}}
      responses:
        '201': {description: done}
`))
	require.NoError(t, err)
	rs, err := gateway.SpecRoutes(doc)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "own.json"), []byte(`{"fault": "{code}", "status": "{status}"}`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "routes.yaml"), []byte("routes:\n  - method: POST\n    path: /own\n    error_template: own.json\n"), 0o600))
	own, err := gateway.ReadRoutesFile(filepath.Join(dir, "routes.yaml"))
	require.NoError(t, err)
	cfg := gateway.Config{
		Upstream: mustURL(t, up.URL), Routes: append(rs, own...), Scope: keyscope.Header("X-Account-Id"),
		ErrorTemplate: stripeTemplate(t), MaxBodyBytes: 64,
	}
	gw := httptest.NewServer(newGateway(t, cfg, memstore.New()))
	t.Cleanup(gw.Close)
	dead := cfg
	dead.Upstream = mustURL(t, "http://"+closedPort(t))
	deadGW := httptest.NewServer(newGateway(t, dead, memstore.New()))
	t.Cleanup(deadGW.Close)

	scope, used := "acct-"+rand.Text(), uuid.NewString()
	resp, body := send(t, gw.URL+"/charges", `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, used)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, `{"id"`, body[:5], "the upstream's own answers pass as they are")

	for _, tc := range []struct {
		name    string
		url     string
		body    string
		header  []string
		status  int
		code    string
		headers []string // headers the answer must carry
	}{
		{"mismatch", gw.URL + "/charges", `{"amount":2}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, used}, 422, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, []string{idempotency.HeaderKey}},
		{"missing key", gw.URL + "/charges", `{"amount":1}`, []string{"X-Account-Id", scope}, 400, idempotency.ProblemOf(idempotency.ErrMissingKey).Slug, nil},
		{"invalid key", gw.URL + "/charges", `{"amount":1}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, strings.Repeat("k", 256)}, 400, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug, nil},
		{"no credentials", gw.URL + "/charges", `{"amount":1}`, []string{idempotency.HeaderKey, uuid.NewString()}, 401, idempotency.ProblemOf(idempotency.ErrNoScope).Slug, nil},
		{"validation", gw.URL + "/charges", `{"amount":"one"}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, uuid.NewString()}, 400, problem.Validation.Slug, nil},
		{"malformed body", gw.URL + "/charges", `{"amount":`, []string{"X-Account-Id", scope, idempotency.HeaderKey, uuid.NewString()}, 400, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug, nil},
		{"too large", gw.URL + "/charges", `{"amount":1,"pad":"` + strings.Repeat("p", 100) + `"}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, uuid.NewString()}, 413, idempotency.ProblemOf(idempotency.ErrBodyTooLarge).Slug, nil},
		{"upstream unreachable", deadGW.URL + "/charges", `{"amount":1}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, uuid.NewString()}, 502, gateway.Unreachable.Slug, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, body := send(t, tc.url, tc.body, tc.header...)
			require.Equal(t, tc.status, resp.StatusCode, body)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var doc struct {
				Error struct{ Type, Code, Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &doc), body)
			require.Equal(t, "idempotency_error", doc.Error.Type, body)
			require.Equal(t, tc.code, doc.Error.Code, body)
			require.NotEmpty(t, doc.Error.Message, body)
			for _, h := range tc.headers {
				require.NotEmpty(t, resp.Header.Get(h), "%s kept", h)
			}
		})
	}
	resp, body = send(t, gw.URL+"/own", `{}`, "X-Account-Id", scope)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
	require.JSONEq(t, `{"fault": "`+idempotency.ProblemOf(idempotency.ErrMissingKey).Slug+`", "status": "400"}`, body, "the route's own template")
}

// keyRoutes are routes keyed where clients in the field put the key.
const keyRoutes = `
routes:
  - method: POST
    path: /open-banking
    key_header: X-Idempotency-Key
  - method: POST
    path: /paypal
    key_header: PayPal-Request-Id
  - method: POST
    path: /square
    key_body_field: /idempotency_key
`

// TestKeyPlaces: a route keyed by X-Idempotency-Key, one by
// PayPal-Request-Id and one by a body field each run once per key under
// 32 concurrent duplicates, refuse a missing key with 400, and forward the
// request upstream as the client sent it, the key where it was.
func TestKeyPlaces(t *testing.T) {
	t.Parallel()
	rs, err := gateway.ReadRoutes(strings.NewReader(keyRoutes))
	require.NoError(t, err)
	for _, tc := range []struct {
		path, header string // header: the key's; "" for the body field
	}{
		{"/open-banking", "X-Idempotency-Key"},
		{"/paypal", "PayPal-Request-Id"},
		{"/square", ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			up := startHoldingUpstream(t)
			gw := httptest.NewServer(newGateway(t, gateway.Config{
				Upstream: mustURL(t, up.URL), Routes: rs, Scope: keyscope.Header("X-Account-Id"), Wait: 5 * time.Second,
			}, memstore.New()))
			t.Cleanup(gw.Close)
			scope, key := "acct-"+rand.Text(), uuid.NewString()
			// Spaced, and a decimal beyond a double: what the fingerprint
			// reads canonically goes upstream as sent.
			body, header := `{ "amount": 100.100000000000000000001 }`, []string{"X-Account-Id", scope, tc.header, key}
			if tc.header == "" {
				body, header = `{ "amount": 100.100000000000000000001, "idempotency_key": "`+key+`" }`, header[:2]
			}
			const storm = 32
			var wg sync.WaitGroup
			answers := make([]*http.Response, storm)
			bodies := make([]string, storm)
			for i := range storm {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answers[i], bodies[i], _ = trySend(gw.URL+tc.path, body, header...)
				}()
			}
			wg.Wait()
			for i, resp := range answers {
				require.NotNil(t, resp, "duplicate %d got an answer", i)
				require.Equal(t, http.StatusCreated, resp.StatusCode, bodies[i])
				require.Equal(t, bodies[0], bodies[i], "every duplicate got the first answer")
				if tc.header != "" {
					require.Equal(t, key, resp.Header.Get(tc.header), "the key repeated in its header")
					require.Empty(t, resp.Header.Values(idempotency.HeaderKey), "and in no other")
				}
			}
			headers, ran := up.received()
			require.Equal(t, []string{body}, ran, "the upstream ran it once, on the bytes sent")
			if tc.header != "" {
				require.Equal(t, []string{key}, headers[0].Values(tc.header), "the key reaches the upstream in its header")
			}

			resp, got := send(t, gw.URL+tc.path, `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, uuid.NewString())
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "the key elsewhere is no key: %s", got)
			require.Equal(t, idempotency.ProblemOf(idempotency.ErrMissingKey).Slug, problemType(t, got))
			_, ran = up.received()
			require.Len(t, ran, 1, "a request without its key never reaches the upstream")
		})
	}
}
