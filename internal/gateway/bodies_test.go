package gateway_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// formSpec is an upstream's document whose covered operation takes a form,
// as Stripe's do.
const formSpec = `
openapi: 3.0.3
info: {title: Charges, version: "1"}
paths:
  /charges:
    post:
      parameters: [{name: Idempotency-Key, in: header, required: true, schema: {type: string}}]
      requestBody:
        required: true
        content:
          application/x-www-form-urlencoded:
            schema:
              type: object
              required: [amount, currency]
              additionalProperties: false
              properties:
                amount: {type: integer, minimum: 1}
                currency: {type: string, enum: [eur, rub]}
                description: {type: string}
      responses:
        '201': {description: A charge.}
`

// TestBodiesOtherThanJSON: covered routes take form bodies and bodies of
// any type. A form is validated against the document as a form, forwarded
// as sent, and replayed however its fields are spelled, but not reordered;
// other bodies go upstream as sent too.
func TestBodiesOtherThanJSON(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	var mu sync.Mutex
	var got []string // Content-Type and body of each request upstream
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Header.Get("Content-Type")+" "+string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"` + uuid.NewString() + `"}`))
	}))
	t.Cleanup(upstream.Close)
	doc, err := openapi3.NewLoader().LoadFromData([]byte(formSpec))
	require.NoError(t, err)
	rs, err := gateway.SpecRoutes(doc)
	require.NoError(t, err)
	rs = append(rs, gateway.Route{Method: "POST", Path: "/uploads"})
	gw := httptest.NewServer(newGateway(t, gateway.Config{Upstream: mustURL(t, upstream.URL), Routes: rs, Scope: keyscope.Header("X-Account-Id")}, memstore.New()))
	t.Cleanup(gw.Close)
	c := client{t, gw.URL, "acct-" + rand.Text()}
	upstreamSaw := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}

	key := uuid.NewString()
	first, body := c.post("/charges", key, "amount=500&currency=eur&description=gift+wrap", "Content-Type", form)
	require.Equal(t, http.StatusCreated, first.StatusCode, "%s", body)
	again, replayed := c.post("/charges", key, "amount=500&&currency=%65ur&description=gift%20wrap", "Content-Type", form+"; charset=UTF-8")
	require.Equal(t, http.StatusCreated, again.StatusCode, "%s", replayed)
	require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), "the form respelled is the same request")
	require.Equal(t, body, replayed)
	require.Equal(t, []string{form + " amount=500&currency=eur&description=gift+wrap"}, upstreamSaw(), "the upstream ran it once, on the form as sent")

	for _, other := range []string{"amount=501&currency=eur&description=gift+wrap", "description=gift+wrap&currency=eur&amount=500"} {
		resp, body := c.post("/charges", key, other, "Content-Type", form)
		require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "the ietf profile: %s: %s", other, body)
		require.Equal(t, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, problemType(t, body))
	}

	// The engine's own answer to a form it cannot fingerprint.
	_, malformed := idempotency.Request{Method: http.MethodPost, Route: "/charges", Path: "/charges", ContentType: form, Body: []byte("amount=500&currency=%zz")}.Fingerprint()
	require.Error(t, malformed)
	for _, refused := range []struct{ name, body, slug string }{
		{"against the document", "amount=many&currency=eur", problem.Validation.Slug},
		{"a required field left out", "amount=500", problem.Validation.Slug},
		{"malformed", "amount=500&currency=%zz", idempotency.ProblemOf(malformed).Slug},
	} {
		key := uuid.NewString()
		resp, body := c.post("/charges", key, refused.body, "Content-Type", form)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", refused.name, body)
		require.Equal(t, refused.slug, problemType(t, body), refused.name)
		resp, body = c.post("/charges", key, "amount=500&currency=rub", "Content-Type", form)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s: the key was not consumed: %s", refused.name, body)
		require.Empty(t, resp.Header.Get(idempotency.HeaderReplayed), refused.name)
	}

	const upload = "--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\n\x00\xff\r\n--b--\r\n"
	key = uuid.NewString()
	resp, _ := c.post("/uploads", key, upload, "Content-Type", "multipart/form-data; boundary=b")
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, _ = c.post("/uploads", key, upload, "Content-Type", "multipart/form-data; boundary=b")
	require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed))
	require.Contains(t, upstreamSaw(), "multipart/form-data; boundary=b "+upload, "other bodies go upstream as sent")
	resp, body = c.post("/uploads", key, upload, "Content-Type", "application/octet-stream")
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "the same bytes as another type: %s", body)
}

// TestUpstreamReceivesTheBytesSent: whatever the fingerprint makes of a
// body, the upstream receives the client's bytes: decimals beyond a
// double, -0, a form whose order Rack reads, and a JSON body labelled a
// form (as curl -d sends it), each byte for byte, with the Content-Type
// and Content-Length sent. A retry spelled differently but meaning the
// same replays without reaching the upstream.
func TestUpstreamReceivesTheBytesSent(t *testing.T) {
	t.Parallel()
	for _, store := range stores {
		t.Run(store.name, func(t *testing.T) {
			t.Parallel()
			upstreamReceivesTheBytesSent(t, store.open(t))
		})
	}
}

func upstreamReceivesTheBytesSent(t *testing.T, open func(gateway.Config) http.Handler) {
	var mu sync.Mutex
	var got []string // Content-Type, Content-Length and raw body of each request upstream
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		mu.Lock()
		got = append(got, fmt.Sprintf("%s|%d|%s", r.Header.Get("Content-Type"), r.ContentLength, b))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(upstream.Close)
	rs := []gateway.Route{{Method: "POST", Path: "/orders"}}
	gw := httptest.NewServer(open(gateway.Config{Upstream: mustURL(t, upstream.URL), Routes: rs, Scope: keyscope.Header("X-Account-Id")}))
	t.Cleanup(gw.Close)
	c := client{t, gw.URL, "acct-" + rand.Text()}

	const form = "application/x-www-form-urlencoded"
	for _, tc := range []struct{ name, contentType, body, retry string }{
		{"decimals", "application/json", `{"amount":123456789.123456789123,"rate":1.00000000000000000001}`, ` {"rate":1.00000000000000000001,"amount":123456789.1234567891230}`},
		{"negative zero", "application/json", `-0`, `0`},
		{"Rack's arrays of hashes", form, "order[items][][sku]=A&order[items][][qty]=1&order[items][][sku]=B&order[items][][qty]=5", "order%5Bitems%5D%5B%5D%5Bsku%5D=A&order[items][][qty]=1&&order[items][][sku]=B&order[items][][qty]=5"},
		{"JSON sent as a form, as curl -d does", form, `{"amount":123456789.123456789123}`, ""},
	} {
		key := uuid.NewString()
		resp, body := c.post("/orders", key, tc.body, "Content-Type", tc.contentType)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "%s: %s", tc.name, body)
		mu.Lock()
		last := got[len(got)-1]
		n := len(got)
		mu.Unlock()
		require.Equal(t, fmt.Sprintf("%s|%d|%s", tc.contentType, len(tc.body), tc.body), last, "%s: the upstream receives the bytes sent", tc.name)
		if tc.retry != "" {
			resp, body = c.post("/orders", key, tc.retry, "Content-Type", tc.contentType)
			require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed), "%s: the same request respelled replays: %s", tc.name, body)
			mu.Lock()
			require.Len(t, got, n, "%s: the retry did not reach the upstream", tc.name)
			mu.Unlock()
		}
	}
}
