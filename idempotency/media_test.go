package idempotency_test

import (
	"encoding/json"
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
)

// Pinned fingerprints, computed before bodies other than JSON were read: a
// key stored by an older engine must still replay after an upgrade, so a
// JSON body's fingerprint never changes.
const (
	pinnedJSON  = "a20ea71cab2b0ce05dfc5997af772e2aa5e399c7ebffebeb033d0d5b96723ad3"
	pinnedEmpty = "c9c6df65596b897cb9f4a8418204230153904a47136befe10b275191c536271e"
	pinnedBody  = `{"currency":"RUB","amount":1.2e3,"items":[{"qty":2,"sku":"SKU-1"}]}`
)

var pinnedQuery = url.Values{"b": {"2"}, "a": {"1", "0"}}

func TestJSONFingerprintsArePinned(t *testing.T) {
	t.Parallel()
	fp, err := idempotency.ComputeFingerprint("POST", "/orders/{id}", "/orders/42", pinnedQuery, []byte(pinnedBody))
	require.NoError(t, err)
	require.Equal(t, pinnedJSON, fp.String(), "ComputeFingerprint of a JSON body changed: stored keys would no longer replay")
	for _, contentType := range []string{"", "application/json", "application/json; charset=utf-8", "Application/JSON", "application/merge-patch+json", "application/json; =broken"} {
		fp, err := idempotency.ComputeFingerprintFor("POST", "/orders/{id}", "/orders/42", pinnedQuery, contentType, []byte(pinnedBody))
		require.NoError(t, err, "Content-Type %q", contentType)
		require.Equal(t, pinnedJSON, fp.String(), "a JSON body sent as %q", contentType)
	}
	// A body without content is no body, whatever it is labelled: "curl -d ''"
	// sends an empty form, and its key was stored as no body.
	for _, tc := range []struct{ contentType, body string }{
		{"", ""}, {"application/json", " \n"}, {"application/x-www-form-urlencoded", ""},
		{"application/x-www-form-urlencoded", "&&"}, {"application/octet-stream", ""}, {"not a media type", ""},
	} {
		fp, err := idempotency.ComputeFingerprintFor("POST", "/things", "/things", url.Values{}, tc.contentType, []byte(tc.body))
		require.NoError(t, err, "Content-Type %q, body %q", tc.contentType, tc.body)
		require.Equal(t, pinnedEmpty, fp.String(), "Content-Type %q, body %q", tc.contentType, tc.body)
	}
}

func TestComputeFingerprintFor(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"
	fp := func(t *testing.T, contentType, body string) idempotency.Fingerprint {
		t.Helper()
		f, err := idempotency.ComputeFingerprintFor("POST", "/v1/customers", "/v1/customers", url.Values{}, contentType, []byte(body))
		require.NoError(t, err, "Content-Type %q, body %q", contentType, body)
		return f
	}
	tests := []struct {
		name     string
		a, b     [2]string // Content-Type, body
		sameMean bool
	}{
		{"form fields reordered", [2]string{form, "email=a%40b.c&name=Jenny+Rosen"}, [2]string{form, "name=Jenny%20Rosen&email=a@b.c"}, true},
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
			_, err := idempotency.ComputeFingerprintFor("POST", "/x", "/x", nil, tt.contentType, []byte(tt.body))
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

// TestFormBodies: a form is one request however its fields are ordered and
// spelled; the operation reads its canonical form; a changed value is
// another request; a form with no certain meaning runs nothing and
// consumes no key.
func TestFormBodies(t *testing.T) {
	t.Parallel()
	const form = "application/x-www-form-urlencoded"

	t.Run("reordered fields replay", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		first := b.send(t, "k", "name=Jenny+Rosen&email=jenny%40example.com&tags[]=a&tags[]=b", form)
		require.Equal(t, http.StatusCreated, first.Code, "%s", first.Body)
		again := b.send(t, "k", "tags[]=a&email=jenny@example.com&&tags[]=b&name=Jenny%20Rosen", form+"; charset=utf-8")
		require.Equal(t, http.StatusCreated, again.Code, "%s", again.Body)
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "the same form, reordered, is the same request")
		require.Equal(t, first.Body.String(), again.Body.String())
		require.EqualValues(t, 1, b.runs.Load(), "the operation ran once")
		require.Equal(t, []string{"email=jenny%40example.com&name=Jenny+Rosen&tags%5B%5D=a&tags%5B%5D=b"}, b.handed(), "the operation reads the canonical form")
	})

	t.Run("a changed value is another request", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		require.Equal(t, http.StatusCreated, b.send(t, "k", "amount=1200&currency=rub", form).Code)
		for _, other := range []string{"amount=1201&currency=rub", "currency=rub&amount", "amount=1200&currency=rub&currency=rub"} {
			requireProblem(t, b.send(t, "k", other, form), idempotency.ProblemKeyMismatch)
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
				requireProblem(t, b.send(t, "k", tc.body, tc.contentType), idempotency.ProblemMalformedForm)
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
		requireProblem(t, b.send(t, "k", "\x00\x01binary", "application/protobuf"), idempotency.ProblemKeyMismatch)
		requireProblem(t, b.send(t, "k", "\x00\x01binary!", "application/octet-stream"), idempotency.ProblemKeyMismatch)
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
				requireProblem(t, b.send(t, "k", `{"a":1}`, tc.contentTypes...), idempotency.ProblemMalformedContentType)
				require.Zero(t, b.runs.Load(), "nothing ran")
				require.Equal(t, http.StatusCreated, b.send(t, "k", `{"a":1}`, "application/json").Code, "the key was not consumed")
			})
		}
	})

	t.Run("JSON is read as before", func(t *testing.T) {
		t.Parallel()
		b := setupMedia(t)
		require.Equal(t, http.StatusCreated, b.send(t, "k", `{"b":1, "a":2.0}`).Code)
		again := b.send(t, "k", `{"a":2,"b":1}`, "application/json; charset=utf-8")
		require.Equal(t, "true", again.Header().Get(idempotency.HeaderReplayed), "no Content-Type is JSON, and so is application/json")
		requireProblem(t, b.send(t, "k2", "a=1", "application/json"), idempotency.ProblemMalformedBody)
		require.Equal(t, []string{`{"a":2,"b":1}`}, b.handed(), "the operation reads canonical JSON")
	})
}

// TestDescribeKnowsTheMediaProblems: the default writer and applications'
// own writers tell the new refusals apart from a 500.
func TestDescribeKnowsTheMediaProblems(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]idempotency.Problem{
		idempotency.ErrMalformedForm:        idempotency.ProblemMalformedForm,
		idempotency.ErrMalformedContentType: idempotency.ProblemMalformedContentType,
	} {
		got, known := idempotency.Describe(err)
		require.True(t, known, "%v", err)
		require.Equal(t, want, got, "%v", err)
		require.Equal(t, http.StatusBadRequest, got.Status)
	}
}
