package httpapi_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/wire/problem"
)

// A body is read as its bytes, never decoded: one labelled with a content
// coding other than identity is refused with 415 and the codings that are
// accepted (RFC 9110 §15.5.16), whether it really is encoded or not, and
// the key stays free.
func TestContentEncoding(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		var gzipped bytes.Buffer
		zw := gzip.NewWriter(&gzipped)
		_, err := zw.Write([]byte(seedBody))
		require.NoError(t, err)
		require.NoError(t, zw.Close())
		key := uuid.NewString()
		for _, tc := range []struct {
			name, body, coding string
		}{
			{"a gzipped body", gzipped.String(), "gzip"},
			{"a plain body labelled gzip", seedBody, "gzip"},
			{"a coding after identity", seedBody, "identity, br"},
		} {
			r := b.postOrder(t, key, tc.body, "Content-Encoding", tc.coding)
			requireProblem(t, r, problem.UnsupportedMediaType, tc.name)
			require.Equal(t, "identity", r.Header.Get("Accept-Encoding"), "%s: the 415 says what is accepted", tc.name)
		}
		requireFresh(t, b.postOrder(t, key, seedBody, "Content-Encoding", "identity"), "identity is no coding, and the key is still free")
	})
}

// Which of two Content-Type headers wins differs between proxies and
// servers, so a body with two is refused with 400, and the key stays free.
func TestTwoContentTypes(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		key := uuid.NewString()
		r := b.postOrder(t, key, seedBody, "Content-Type", "application/json", "Content-Type", "text/plain")
		d := requireProblem(t, r, problem.Validation, "two Content-Type headers")
		require.Contains(t, d.Detail, "exactly one Content-Type")
		requireFresh(t, b.postOrder(t, key, seedBody), "the key is still free")
	})
}

// A path id is one id however it is spelled: a retry that respells it in
// upper case is the same request, replayed, not a 409.
func TestPathIDsAreFingerprintedCanonically(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		id, key := b.newOrderID(t), uuid.NewString()
		first := b.patchOrder(t, strings.ToUpper(id), key, `{"amount":1300}`)
		require.Equal(t, http.StatusOK, first.Status, "%s", first)
		require.Equal(t, id, decodeOrder(t, first).Id, "the order the upper-case id names")
		requireReplayOf(t, first, b.patchOrder(t, id, key, `{"amount":1300}`), "the retry in lower case")
		requireProblem(t, b.patchOrder(t, "not-"+id, uuid.NewString(), `{"amount":1300}`), problem.Validation, "an id that is no UUID")
	})
}

// Every answer of an authenticated operation holds one account's data:
// Cache-Control: no-store, replays and problems included. The service's
// public pages may be cached.
func TestAnswersAreNotCached(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, be backendCase) {
		b := setup(t, be.open(t), options{})
		key := uuid.NewString()
		created := b.postOrder(t, key, seedBody)
		id := requireFresh(t, created, "an order").Id
		for what, r := range map[string]reply{
			"201":       created,
			"a replay":  b.postOrder(t, key, seedBody),
			"a 409":     b.postOrder(t, key, strings.Replace(seedBody, "1200", "1201", 1)),
			"GET":       b.get(t, "/orders/"+id),
			"a 404":     b.get(t, "/orders/"+uuid.NewString()),
			"a GET 401": b.do(t, b.newRequest(t, http.MethodGet, "/orders", nil, "Authorization", "Bearer nope")),
		} {
			require.Equal(t, "no-store", r.Header.Get("Cache-Control"), "%s: %s", what, r)
		}
		require.Empty(t, b.get(t, "/healthz").Header.Get("Cache-Control"), "a public page")
	})
}
