package idempotency_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// TestJSONMediaTypes: application/json, with or without charset=utf-8
// (JSON's one encoding), and no Content-Type are one media type; every
// other JSON type, and any other charset, is its own request.
func TestJSONMediaTypes(t *testing.T) {
	t.Parallel()
	const body = `{"currency":"RUB","amount":1.2e3}`
	fp := func(contentType string) idempotency.Fingerprint {
		f, err := idempotency.Request{Method: "POST", Route: "/orders/{id}", Path: "/orders/42", ContentType: contentType, Body: []byte(body)}.Fingerprint()
		require.NoError(t, err, "Content-Type %q", contentType)
		return f
	}
	plain := fp("application/json")
	for _, same := range []string{"", "application/json; charset=utf-8", "Application/JSON", "application/json;charset=UTF-8"} {
		require.Equal(t, plain, fp(same), "%q is application/json", same)
	}
	seen := map[idempotency.Fingerprint]string{plain: "application/json"}
	for _, other := range []string{
		"application/merge-patch+json", "application/json-patch+json", "application/vnd.api+json",
		"application/json; charset=iso-8859-1", "application/json; profile=x", "application/json; =broken",
	} {
		f := fp(other)
		require.NotContains(t, seen, f, "%q shares a fingerprint with %q", other, seen[f])
		seen[f] = other
	}
	require.Equal(t, fp("application/merge-patch+json"), fp("Application/Merge-Patch+JSON; charset=utf-8"), "a JSON type is normalised, charset=utf-8 dropped")

	// A body without content is no body, whatever it is labelled: "curl
	// -d ''" sends an empty form.
	var empty []idempotency.Fingerprint
	for _, tc := range []struct{ contentType, body string }{
		{"", ""}, {"application/json", " \n"}, {"application/merge-patch+json", ""}, {"application/x-www-form-urlencoded", ""},
		{"application/x-www-form-urlencoded", "&&"}, {"application/octet-stream", ""}, {"not a media type", ""},
	} {
		f, err := idempotency.Request{Method: "POST", Route: "/things", Path: "/things", Query: url.Values{}.Encode(), ContentType: tc.contentType, Body: []byte(tc.body)}.Fingerprint()
		require.NoError(t, err, "Content-Type %q, body %q", tc.contentType, tc.body)
		empty = append(empty, f)
	}
	for i := range empty {
		require.Equal(t, empty[0], empty[i], "every body without content is no body (case %d)", i)
	}
}

func TestRequestFingerprintMedia(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	fp := func(t *testing.T, contentType, body string) idempotency.Fingerprint {
		t.Helper()
		f, err := idempotency.Request{Method: "POST", Route: "/v1/customers", Path: "/v1/customers", Query: url.Values{}.Encode(), ContentType: contentType, Body: []byte(body)}.Fingerprint()
		require.NoError(t, err, "Content-Type %q, body %q", contentType, body)
		return f
	}
	tests := []struct {
		name     string
		a, b     [2]string // Content-Type, body
		sameMean bool
	}{
		{"form fields respelled", [2]string{form, "email=a%40b.c&name=Jenny+Rosen"}, [2]string{form, "email=a@b.c&&name=Jenny%20Rosen"}, true},
		{"form fields reordered", [2]string{form, "email=a%40b.c&name=Jenny+Rosen"}, [2]string{form, "name=Jenny%20Rosen&email=a@b.c"}, false},
		{"Rack's arrays of hashes sorted", [2]string{form, "o[][sku]=A&o[][qty]=1&o[][sku]=B&o[][qty]=5"}, [2]string{form, "o[][qty]=1&o[][qty]=5&o[][sku]=A&o[][sku]=B"}, false},
		{"JSON numbers spelled differently", [2]string{"application/json", `{"a":1.0,"b":12e2}`}, [2]string{"", `{"b":1200,"a":1}`}, true},
		{"JSON decimals beyond a double", [2]string{"application/json", `{"amount":123456789.123456789123}`}, [2]string{"application/json", `{"amount":123456789.12345679}`}, false},
		{"JSON and a tiny fraction", [2]string{"application/json", `1.00000000000000000001`}, [2]string{"application/json", `1`}, false},
		{"JSON integers beyond 2^53", [2]string{"application/json", `9007199254740993`}, [2]string{"application/json", `9007199254740992`}, false},
		{"JSON -0 and 0", [2]string{"application/json", `-0`}, [2]string{"application/json", `0`}, true},
		{"form charset utf-8 or none", [2]string{form, "a=1"}, [2]string{form + "; charset=UTF-8", "a=1"}, true},
		{"form type case", [2]string{form, "a=1"}, [2]string{"Application/X-WWW-Form-URLEncoded", "a=1"}, true},
		{"form value changed", [2]string{form, "a=1"}, [2]string{form, "a=2"}, false},
		{"form values of one key reordered", [2]string{form, "a[]=1&a[]=2"}, [2]string{form, "a[]=2&a[]=1"}, false},
		{"form a and a=", [2]string{form, "a"}, [2]string{form, "a="}, false},
		// A JSON text never starts with a letter, but the media type part
		// keeps the two apart however the bytes look.
		{"form and JSON of the same bytes", [2]string{form, "1"}, [2]string{"application/json", "1"}, false},
		{"multipart type spelled differently", [2]string{"multipart/form-data; boundary=X", "--X--"}, [2]string{"Multipart/Form-Data; BOUNDARY=X", "--X--"}, true},
		{"parameter order", [2]string{"text/plain; a=1; b=2", "x"}, [2]string{"text/plain; b=2; a=1", "x"}, true},
		{"parameter value case", [2]string{"multipart/form-data; boundary=x", "--x--"}, [2]string{"multipart/form-data; boundary=X", "--x--"}, false},
		{"same bytes, another type", [2]string{"application/octet-stream", "abc"}, [2]string{"text/plain", "abc"}, false},
		{"raw bytes are not canonicalised", [2]string{"text/plain", "a=1&b=2"}, [2]string{"text/plain", "b=2&a=1"}, false},
		{"raw bytes and a form", [2]string{"text/plain", "a=1"}, [2]string{form, "a=1"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a, b := fp(t, tt.a[0], tt.a[1]), fp(t, tt.b[0], tt.b[1])
			if tt.sameMean {
				require.Equal(t, a, b, "%q and %q", tt.a, tt.b)
			} else {
				require.NotEqual(t, a, b, "%q and %q", tt.a, tt.b)
			}
		})
	}

	refused := []struct {
		name, contentType, body string
		want                    error
	}{
		{"form with a bad escape", form, "a=%zz", idempotency.ErrMalformedForm},
		{"form with a semicolon", form, "a=1;b=2", idempotency.ErrMalformedForm},
		{"form that is not UTF-8", form, "a=%ff", idempotency.ErrMalformedForm},
		{"form in another charset", form + "; charset=iso-8859-1", "a=1", idempotency.ErrMalformedForm},
		{"media type without a subtype", "text", "x", idempotency.ErrMalformedContentType},
		{"broken parameter", "text/plain; =x", "x", idempotency.ErrMalformedContentType},
		{"JSON that is not", "application/json", "a=1", idempotency.ErrMalformedBody},
	}
	for _, tt := range refused {
		t.Run("refused/"+tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idempotency.Request{Method: "POST", Route: "/x", Path: "/x", ContentType: tt.contentType, Body: []byte(tt.body)}.Fingerprint()
			require.ErrorIs(t, err, tt.want, "Content-Type %q, body %q", tt.contentType, tt.body)
		})
	}
}

// mediaBundle is an operation on memstore whose handler answers 201 and
// keeps every body it was handed.
type mediaBundle struct {
	*middlewareBundle
	mu     sync.Mutex
	bodies []string
}

func setupMedia(t *testing.T) *mediaBundle {
	t.Helper()
	b := &mediaBundle{}
	var n atomic.Int64
	b.middlewareBundle = setupMiddleware(t, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		b.mu.Lock()
		b.bodies = append(b.bodies, string(body))
		b.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"run":` + strconv.FormatInt(n.Add(1), 10) + `}`))
	})
	return b
}

// send posts body under key with the Content-Type headers given.
func (b *mediaBundle) send(t *testing.T, key, body string, contentTypes ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(body))
	req.Header.Set(idempotency.HeaderKey, key)
	for _, ct := range contentTypes {
		req.Header.Add("Content-Type", ct)
	}
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

func (b *mediaBundle) handed() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.bodies...)
}

// requireProblem checks that rec is the default writer's answer p.
func requireProblem(t *testing.T, rec *httptest.ResponseRecorder, p idempotency.Problem) {
	t.Helper()
	require.Equal(t, p.Status, rec.Code, "%s", rec.Body)
	var doc struct{ Title string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &doc), "%s", rec.Body)
	require.Equal(t, p.Title, doc.Title, "%s", rec.Body)
}

// TestFormBodies: a form is one request however its fields are spelled,
// but not reordered; the operation reads it as sent; a changed value is
// another request; a form with no certain meaning runs nothing and
// consumes no key.
func TestFormBodies(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"

	t.Run("respelled fields replay, reordered ones do not", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		const sent = "name=Jenny+Rosen&email=jenny%40example.com&tags[]=a&tags[]=b"
		first := b.send(t, "k", sent, form)
		require.Equal(t, http.StatusCreated, first.Code, "%s", first.Body)
		again := b.send(t, "k", "name=Jenny%20Rosen&&email=jenny@example.com&tags%5B%5D=a&tags[]=b", form+"; charset=utf-8")
		require.Equal(t, http.StatusCreated, again.Code, "%s", again.Body)
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "the same form, respelled, is the same request")
		require.Equal(t, first.Body.String(), again.Body.String())
		requireProblem(t, b.send(t, "k", "tags[]=a&email=jenny@example.com&tags[]=b&name=Jenny+Rosen", form), idempotency.ProblemOf(idempotency.ErrKeyMismatch))
		require.EqualValues(t, 1, b.runs.Load(), "the operation ran once")
		require.Equal(t, []string{sent}, b.handed(), "the operation reads the form as sent")
	})

	t.Run("a changed value is another request", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		require.Equal(t, http.StatusCreated, b.send(t, "k", "amount=1200&currency=rub", form).Code)
		for _, other := range []string{"amount=1201&currency=rub", "currency=rub&amount", "amount=1200&currency=rub&currency=rub"} {
			requireProblem(t, b.send(t, "k", other, form), idempotency.ProblemOf(idempotency.ErrKeyMismatch))
		}
		require.EqualValues(t, 1, b.runs.Load())
	})

	t.Run("an invalid form runs nothing and consumes no key", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ name, body, contentType string }{
			{"bad escape", "a=%zz", form},
			{"semicolon", "a=1;b=2", form},
			{"not UTF-8", "a=%ff%fe", form},
			{"another charset", "a=1", form + "; charset=windows-1252"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setupMedia(t)
				requireProblem(t, b.send(t, "k", tc.body, tc.contentType), idempotency.ProblemOf(idempotency.ErrMalformedForm))
				require.Zero(t, b.runs.Load(), "nothing ran")
				require.Equal(t, idempotency.OutcomeRejected, b.outcomes.last())
				fixed := b.send(t, "k", "a=1", form)
				require.Equal(t, http.StatusCreated, fixed.Code, "%s", fixed.Body)
				require.Empty(t, fixed.Header().Get(idempotency.HeaderReplayed), "the key was free: the valid form ran")
			})
		}
	})
}

// TestOtherMediaTypes: a body of any other type is its exact bytes and its
// media type: the same bytes replay, the same bytes as another type are
// another request, and the operation reads the bytes as sent.
func TestOtherMediaTypes(t *testing.T) {
	t.Parallel()
	const multipart = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.bin\"\r\n\r\n\x00\x01\xff\r\n--XyZ--\r\n"

	t.Run("the same bytes and type replay", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		first := b.send(t, "k", multipart, "multipart/form-data; boundary=XyZ")
		require.Equal(t, http.StatusCreated, first.Code, "%s", first.Body)
		again := b.send(t, "k", multipart, "Multipart/Form-Data; Boundary=XyZ")
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "%s", again.Body)
		require.Equal(t, first.Body.String(), again.Body.String())
		require.Equal(t, []string{multipart}, b.handed(), "the operation reads the bytes as sent")
	})

	t.Run("the same bytes as another type are another request", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		require.Equal(t, http.StatusCreated, b.send(t, "k", "\x00\x01binary", "application/octet-stream").Code)
		requireProblem(t, b.send(t, "k", "\x00\x01binary", "application/protobuf"), idempotency.ProblemOf(idempotency.ErrKeyMismatch))
		requireProblem(t, b.send(t, "k", "\x00\x01binary!", "application/octet-stream"), idempotency.ProblemOf(idempotency.ErrKeyMismatch))
		require.EqualValues(t, 1, b.runs.Load())
	})

	t.Run("a Content-Type that cannot be read runs nothing", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name         string
			contentTypes []string
		}{
			{"no subtype", []string{"text"}},
			{"broken parameter", []string{"text/plain; charset"}},
			{"two headers", []string{"application/json", "application/x-www-form-urlencoded"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setupMedia(t)
				requireProblem(t, b.send(t, "k", `{"a":1}`, tc.contentTypes...), idempotency.ProblemOf(idempotency.ErrMalformedContentType))
				require.Zero(t, b.runs.Load(), "nothing ran")
				require.Equal(t, http.StatusCreated, b.send(t, "k", `{"a":1}`, "application/json").Code, "the key was not consumed")
			})
		}
	})

	t.Run("JSON is read as sent", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		require.Equal(t, http.StatusCreated, b.send(t, "k", `{"b":1, "a":2.0}`).Code)
		again := b.send(t, "k", `{"a":2,"b":1}`, "application/json; charset=utf-8")
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "no Content-Type is JSON, and so is application/json")
		requireProblem(t, b.send(t, "k", `{"a":2,"b":1}`, "application/merge-patch+json"), idempotency.ProblemOf(idempotency.ErrKeyMismatch))
		requireProblem(t, b.send(t, "k2", "a=1", "application/json"), idempotency.ProblemOf(idempotency.ErrMalformedBody))
		require.Equal(t, []string{`{"b":1, "a":2.0}`}, b.handed(), "the operation reads the JSON as sent")
	})
}

// TestProblemOfKnowsTheMediaProblems: the default writer and applications'
// own writers tell the new refusals apart from a 500, and from each other.
func TestProblemOfKnowsTheMediaProblems(t *testing.T) {
	t.Parallel()
	slugs := map[string]error{}
	for _, err := range []error{idempotency.ErrMalformedForm, idempotency.ErrMalformedContentType, idempotency.ErrMalformedQuery} {
		got := idempotency.ProblemOf(fmt.Errorf("%w: why", err))
		require.Equal(t, http.StatusBadRequest, got.Status, "%v", err)
		require.Equal(t, err.Error()+": why", got.Detail, "a client error's detail is its message")
		require.NotContains(t, slugs, got.Slug, "%v shares its problem with %v", err, slugs[got.Slug])
		slugs[got.Slug] = err
	}
}

// TestOperationReadsTheBytesSent: the operation, and Config.Validate, read
// exactly the bytes the client sent, whatever the fingerprint makes of
// them: decimals beyond a double, -0, a form whose order Rack reads, a
// JSON body labelled a form (as curl -d sends it).
func TestOperationReadsTheBytesSent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, contentType, body string }{
		{"decimals", "application/json", `{"amount":123456789.123456789123,"rate":1.00000000000000000001}`},
		{"negative zero", "application/json", `-0`},
		{"JSON with spaces and no type", "", "{ \"b\" : 1.50 ,\n \"a\": \"\\u0041\" }"},
		{"Rack's arrays of hashes", "application/x-www-form-urlencoded", "order[items][][sku]=A&order[items][][qty]=1&order[items][][sku]=B&order[items][][qty]=5"},
		{"JSON sent as a form, as curl -d does", "application/x-www-form-urlencoded", `{"amount":123456789.123456789123}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var read, validated atomic.Value
			engine := idempotency.New(idempotency.Config{
				Scope: func(*http.Request) (string, error) { return "tenant", nil },
				Validate: func(_ *http.Request, body []byte) error {
					validated.Store(string(body))
					return nil
				},
			})
			op := idempotency.NewOperation(engine, memstore.New(), idempotency.OperationConfig{})
			handler := op.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, err := io.ReadAll(r.Body)
				require.NoError(t, err)
				require.EqualValues(t, len(body), r.ContentLength, "Content-Length is the body's")
				read.Store(string(body))
				w.WriteHeader(http.StatusCreated)
			}))
			req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(tc.body))
			req.Header.Set(idempotency.HeaderKey, "k")
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			rec := httptest.NewRecorder()
			handler.ServeHTTP(rec, req)
			require.Equal(t, http.StatusCreated, rec.Code, "%s", rec.Body)
			require.Equal(t, tc.body, read.Load(), "the operation reads the bytes sent")
			require.Equal(t, tc.body, validated.Load(), "Validate reads the bytes sent")
		})
	}
}

// TestMalformedQueryIsRefused: a query that does not parse (what Go's
// parser would drop, and a proxy forwards) runs nothing, consumes no key
// and is 400 malformed-query; before it, "?to=alice;" and "?to=bob;"
// shared a fingerprint.
func TestMalformedQueryIsRefused(t *testing.T) {
	t.Parallel()
	b := setupMedia(t)
	send := func(target string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(`{}`))
		req.Header.Set(idempotency.HeaderKey, "k")
		rec := httptest.NewRecorder()
		b.handler.ServeHTTP(rec, req)
		return rec
	}
	for _, target := range []string{"/things?to=alice;", "/things?to=bob;", "/things?a=%zz", "/things?a=1&b=%"} {
		requireProblem(t, send(target), idempotency.ProblemOf(idempotency.ErrMalformedQuery))
	}
	require.Zero(t, b.runs.Load(), "nothing ran")
	require.Equal(t, http.StatusCreated, send("/things?to=alice%3B").Code, "the key was not consumed")
	requireProblem(t, send("/things?to=bob%3B"), idempotency.ProblemOf(idempotency.ErrKeyMismatch))
}
