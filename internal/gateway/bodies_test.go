package gateway_test

import (
	"crypto/rand"
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
	"github.com/oncekey/oncekey/internal/keyscope"
	"github.com/oncekey/oncekey/internal/problem"
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
// in its canonical form, and replayed however its fields are ordered; other
// bodies go upstream as sent.
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
	again, replayed := c.post("/charges", key, "description=gift%20wrap&&currency=eur&amount=500", "Content-Type", form+"; charset=UTF-8")
	require.Equal(t, http.StatusCreated, again.StatusCode, "%s", replayed)
	require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), "the form reordered is the same request")
	require.Equal(t, body, replayed)
	require.Equal(t, []string{form + " amount=500&currency=eur&description=gift+wrap"}, upstreamSaw(), "the upstream ran it once, on the canonical form")

	resp, body := c.post("/charges", key, "amount=501&currency=eur&description=gift+wrap", "Content-Type", form)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "the ietf profile: %s", body)
	require.Equal(t, idempotency.ProblemKeyMismatch.Slug, problemType(t, body))

	for _, refused := range []struct{ name, body, slug string }{
		{"against the document", "amount=many&currency=eur", problem.Validation.Slug},
		{"a required field left out", "amount=500", problem.Validation.Slug},
		{"malformed", "amount=500&currency=%zz", idempotency.ProblemMalformedForm.Slug},
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
	resp, _ = c.post("/uploads", key, upload, "Content-Type", "multipart/form-data; boundary=b")
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, _ = c.post("/uploads", key, upload, "Content-Type", "multipart/form-data; boundary=b")
	require.Equal(t, "true", resp.Header.Get(idempotency.HeaderReplayed))
	require.Contains(t, upstreamSaw(), "multipart/form-data; boundary=b "+upload, "other bodies go upstream as sent")
	resp, body = c.post("/uploads", key, upload, "Content-Type", "application/octet-stream")
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, "the same bytes as another type: %s", body)
}
