package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/internal/conformance"
	"github.com/oncekey/oncekey/internal/gateway"
)

// thingsAPI makes things: POST /things creates one (201, its id and a
// Location), GET /things/{id} reads it. It knows nothing of keys: a
// gateway in front of it keeps the protocol, or nothing does.
func thingsAPI() http.Handler {
	var mu sync.Mutex
	things := map[string][]byte{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		mu.Lock()
		defer mu.Unlock()
		if r.Method == http.MethodGet {
			b, ok := things[strings.TrimPrefix(r.URL.Path, "/things/")]
			if !ok {
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, `{"title":"no such thing"}`)
				return
			}
			_, _ = w.Write(b)
			return
		}
		var in struct {
			Name string `json:"name"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Name == "" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"title":"a thing has a name"}`)
			return
		}
		id := fmt.Sprintf("th_%d", len(things)+1)
		things[id], _ = json.Marshal(map[string]string{"id": id, "name": in.Name})
		w.Header().Set("Location", "/things/"+id)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(things[id])
	})
}

// thingsDoc is thingsAPI's document with key, the parameters and
// extension of POST /things.
func thingsDoc(t *testing.T, key string) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(`openapi: 3.0.3
info: {title: Things, version: "1"}
paths:
  /things:
    post:
      operationId: createThing` + key + `
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [name]
              properties:
                name: {type: string, minLength: 1, example: lamp}
                idempotency_key: {type: string}
      responses:
        '201':
          description: Made.
          headers: {Location: {schema: {type: string}}}
          content: {application/json: {schema: {$ref: '#/components/schemas/Thing'}}}
        '400': {description: Refused., content: {application/json: {schema: {type: object}}, application/problem+json: {schema: {type: object}}}}
        '409': {description: In flight., content: {application/problem+json: {schema: {type: object}}}}
        '422': {description: Reused., content: {application/problem+json: {schema: {type: object}}}}
  /things/{id}:
    get:
      parameters: [{name: id, in: path, required: true, schema: {type: string}}]
      responses:
        '200': {description: A thing., content: {application/json: {schema: {$ref: '#/components/schemas/Thing'}}}}
        '404': {description: None., content: {application/json: {schema: {type: object}}}}
components:
  schemas:
    Thing: {type: object, properties: {id: {type: string}, name: {type: string}}}
`))
	require.NoError(t, err)
	return doc
}

// TestKeyPlaces: a document that declares X-Idempotency-Key, one whose
// x-idempotency puts the key in a body field, and one that declares none,
// run with --key-header or --key-field, each plan their key where it goes
// and pass against a gateway that reads it there and refuses a request
// without it (so a check that sent it elsewhere would be refused). Against
// the API alone, which reads no key, replay fails.
func TestKeyPlaces(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, decl string
		cfg        conformance.Config
		place      frontdoor.KeyPlace // where the correct gateway reads it
		plan       string
	}{
		{
			name:  "a declared X-Idempotency-Key",
			decl:  "\n      parameters: [{name: X-Idempotency-Key, in: header, required: true, schema: {type: string}}]",
			place: frontdoor.KeyPlace{Header: "X-Idempotency-Key"}, plan: "header X-Idempotency-Key",
		},
		{
			name:  "x-idempotency's key-field",
			decl:  "\n      x-idempotency: {key-field: idempotency_key}",
			place: frontdoor.KeyPlace{BodyField: "/idempotency_key"}, plan: "body field idempotency_key",
		},
		{
			name:  "none, and --key-header",
			cfg:   conformance.Config{KeyHeader: "X-Request-Key"},
			place: frontdoor.KeyPlace{Header: "X-Request-Key"}, plan: "header X-Request-Key",
		},
		{
			name:  "none, and --key-field",
			cfg:   conformance.Config{KeyField: "/idempotency_key"},
			place: frontdoor.KeyPlace{BodyField: "/idempotency_key"}, plan: "body field idempotency_key",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doc := thingsDoc(t, tc.decl)
			cfg := tc.cfg
			cfg.Spec, cfg.Profile = doc, conformance.Profiles["ietf"]
			plans, err := conformance.Plan(cfg)
			require.NoError(t, err)
			require.Len(t, plans, 1, "POST /things is covered, and nothing else")
			require.Equal(t, tc.plan, plans[0].Key)

			// Correct: a gateway that reads the key where the document
			// says, and refuses a request without one there.
			for _, r := range runThrough(t, cfg, tc.place) {
				require.Contains(t, []conformance.Status{conformance.Pass, conformance.Skip}, r.Status, "%s: %s", r.Check, r.Reason)
				if r.Check == "replay" {
					require.Equal(t, conformance.Pass, r.Status)
				}
			}
			// Broken: the API alone, which reads no key.
			api := httptest.NewServer(thingsAPI())
			t.Cleanup(api.Close)
			cfg.BaseURL, cfg.Auth = api.URL, "Bearer a"
			results, err := conformance.Run(context.Background(), cfg)
			require.NoError(t, err)
			require.Equal(t, conformance.Fail, statusOf(t, results, "replay"), "an API that reads no key fails")
		})
	}
}

// runThrough runs every check of cfg against a gateway that reads keys at
// place, scoped by the credential, in front of a thingsAPI of its own.
func runThrough(t *testing.T, cfg conformance.Config, place frontdoor.KeyPlace) []conformance.Result {
	t.Helper()
	api := httptest.NewServer(thingsAPI())
	t.Cleanup(api.Close)
	upstream, err := url.Parse(api.URL)
	require.NoError(t, err)
	gw, err := gateway.New(gateway.Config{
		Upstream: upstream, Profile: frontdoor.IETF,
		Routes: []gateway.Route{{Method: http.MethodPost, Path: "/things", Key: place}},
		Scope:  func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	}, memstore.New())
	require.NoError(t, err)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	cfg.BaseURL, cfg.Auth, cfg.Auth2 = srv.URL, "Bearer a", "Bearer b"
	results, err := conformance.Run(context.Background(), cfg)
	require.NoError(t, err)
	return results
}

// statusOf is the status of check id, which must have run once.
func statusOf(t *testing.T, results []conformance.Result, id string) conformance.Status {
	t.Helper()
	var got []conformance.Status
	for _, r := range results {
		if r.Check == id {
			got = append(got, r.Status)
		}
	}
	require.Len(t, got, 1, "check %s ran once", id)
	return got[0]
}
