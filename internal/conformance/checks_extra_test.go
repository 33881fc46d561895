package conformance_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// runOnly runs the check id alone against h (the widgets document, the
// oncekey profile unless profile names another) and returns its result on
// each operation.
func runOnly(t *testing.T, h http.Handler, id, overrides, profile string, wait time.Duration) []conformance.Result {
	t.Helper()
	return runOnlyDoc(t, h, loadSpec(t, "widgets.yaml"), id, overrides, profile, wait)
}

// runOnlyDoc is runOnly with the document doc.
func runOnlyDoc(t *testing.T, h http.Handler, doc *openapi3.T, id, overrides, profile string, wait time.Duration) []conformance.Result {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	o, err := conformance.ParseOverrides([]byte(overrides))
	require.NoError(t, err)
	p, err := conformance.ProfileNamed(profile)
	require.NoError(t, err)
	results, err := conformance.Run(context.Background(), conformance.Config{
		Spec: doc, BaseURL: srv.URL, Auth: "Bearer a", Auth2: "Bearer b", Profile: p,
		Overrides: o, Only: []string{id}, RetentionWait: wait,
	})
	require.NoError(t, err)
	require.Len(t, results, 2, "%s on both operations", id)
	return results
}

// requireAll requires every result to have status, with a reason that
// contains reason.
func requireAll(t *testing.T, results []conformance.Result, status conformance.Status, reason string) {
	t.Helper()
	for _, r := range results {
		require.Equal(t, status, r.Status, "%s on %s: %s", r.Check, r.Operation, r.Reason)
		require.Contains(t, r.Reason, reason, "%s on %s", r.Check, r.Operation)
	}
}

// overridesWith is the toy's overrides with each operation's fail or
// large trigger replaced by trigger ("": none).
func overridesWith(field, trigger string) string {
	var kept []string
	for line := range strings.SplitSeq(toyOverrides, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), field+":") {
			if trigger == "" {
				continue
			}
			line = "    " + field + ": " + trigger
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n")
}

// rewritten is h with every answer of status from rewritten to to.
type rewritten struct {
	h        http.Handler
	from, to int
}

func (rw rewritten) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := httptest.NewRecorder()
	rw.h.ServeHTTP(rec, r)
	for name, values := range rec.Header() {
		w.Header()[name] = values
	}
	if rec.Code == rw.from {
		rec.Code = rw.to
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// withTTL is h advertising that it keeps keys for ttl (Idempotency-TTL, in
// whole seconds) on every answer.
type withTTL struct {
	h   http.Handler
	ttl string
}

func (a withTTL) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Idempotency-TTL", a.ttl)
	a.h.ServeHTTP(w, r)
}

// error-not-stored: a retry after a 5xx runs, and one that gets the 5xx
// again or is refused for the key fails; without a fail override,
// and under the stripe profile (which replays 500s), it is skipped and
// says why; an override that does not make the request fail is an error,
// not a pass.
func TestErrorNotStored(t *testing.T) {
	t.Parallel()
	const id = "error-not-stored"
	requireAll(t, runOnly(t, newToy(bugs{}), id, toyOverrides, "oncekey", 0), conformance.Pass, "")
	requireAll(t, runOnly(t, newToy(bugs{storesServerErrors: true}), id, toyOverrides, "oncekey", 0), conformance.Fail, "the failure was stored")
	requireAll(t, runOnly(t, newToy(bugs{keepsKeyOnError: true}), id, toyOverrides, "oncekey", 0), conformance.Fail, "the failure consumed the key")
	requireAll(t, runOnly(t, newToy(bugs{}), id, overridesWith("fail", ""), "oncekey", 0), conformance.Skip, "give the operation a fail override")
	requireAll(t, runOnly(t, newToy(bugs{}), id, overridesWith("fail", `{header: {X-Not-Failing: "1"}}`), "oncekey", 0), conformance.Error, "not 5xx")
	requireAll(t, runOnly(t, newToy(bugs{storesServerErrors: true}), id, toyOverrides, "stripe", 0), conformance.Skip, "profile stripe stores a 5xx")
	// An API that fails every request stores nothing that a black box
	// can see: the same failure under the key is no finding.
	failing := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":"down"}`))
	})
	for _, r := range runOnly(t, failing, id, toyOverrides, "oncekey", 0) {
		require.Equal(t, conformance.Error, r.Status, "%s on %s: %s", r.Check, r.Operation, r.Reason)
		if r.Operation == "POST /widgets" { // the paint needs a widget first, and cannot make one
			require.Contains(t, r.Reason, "fails under a new key too")
		}
	}
}

// retention: without --retention-wait it is skipped and says how to run
// it; with one, a retry after it replays, and a key forgotten sooner
// fails. Where the answer advertises a shorter retention, the check waits
// for that instead (a second before it): with a wait of an hour, an API
// that advertises two seconds is checked in about one, and one that
// advertises two and forgets sooner fails.
func TestRetention(t *testing.T) {
	t.Parallel()
	const id = "retention"
	requireAll(t, runOnly(t, newToy(bugs{}), id, toyOverrides, "oncekey", 0), conformance.Skip, "give --retention-wait")
	requireAll(t, runOnly(t, newToy(bugs{}), id, toyOverrides, "oncekey", toyRetention), conformance.Pass, "")
	requireAll(t, runOnly(t, newToy(bugs{forgetsKeys: true}), id, toyOverrides, "oncekey", toyRetention), conformance.Fail, "a retry 700ms after the first request")

	for _, tt := range []struct {
		api    http.Handler
		status conformance.Status
	}{
		{withTTL{newToy(bugs{}), "2"}, conformance.Pass},
		{withTTL{newToy(bugs{forgetsKeys: true}), "2"}, conformance.Fail},
	} {
		results := runOnly(t, tt.api, id, toyOverrides, "oncekey", time.Hour)
		for _, r := range results {
			require.Equal(t, tt.status, r.Status, "%s on %s: %s", r.Check, r.Operation, r.Reason)
			// Less than the two seconds advertised, more than the
			// forgetful toy keeps a key.
			require.Greater(t, r.Duration, keptFor, "%s on %s waited", r.Check, r.Operation)
			require.Less(t, r.Duration, 2*time.Second, "%s on %s waited", r.Check, r.Operation)
		}
	}
}

// large-answer: an answer of 1.5 MiB replays byte for byte; one stored
// truncated fails; one not stored whose retries are refused with a status
// the document declares (409, as Oncekey's gateway does) passes, and with
// one it does not declare (507) fails; so does a first request refused
// (413) where the document does not declare it, and it passes where it
// does. Without a large override it is
// skipped and says how to run it, and an override that leaves the answer
// small, or makes it larger than the tool reads, is an error.
func TestLargeAnswer(t *testing.T) {
	t.Parallel()
	const id = "large-answer"
	requireAll(t, runOnly(t, newToy(bugs{}), id, toyOverrides, "oncekey", 0), conformance.Pass, "")
	requireAll(t, runOnly(t, newToy(bugs{truncatesLarge: true}), id, toyOverrides, "oncekey", 0), conformance.Fail, "has 262144 bytes")
	requireAll(t, runOnly(t, newToy(bugs{refusesLargeReplay: true}), id, toyOverrides, "oncekey", 0), conformance.Pass, "")
	requireAll(t, runOnly(t, rewritten{newToy(bugs{refusesLargeReplay: true}), 409, 507}, id, toyOverrides, "oncekey", 0), conformance.Fail, "507")
	// An API that refuses to run what it would answer large: 413, a pass
	// where the document declares it, a failure where it does not.
	toy := newToy(bugs{})
	tooLarge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Large") != "" {
			problem(w, http.StatusRequestEntityTooLarge, "the answer would be too large")
			return
		}
		toy.ServeHTTP(w, r)
	})
	requireAll(t, runOnly(t, tooLarge, id, toyOverrides, "oncekey", 0), conformance.Fail, "neither a 2xx nor a 4xx the operation's document declares")
	declared := loadSpec(t, "widgets.yaml")
	for _, path := range []string{"/widgets", "/widgets/{id}/paint"} {
		op := declared.Paths.Value(path).Post
		op.Responses.Set("413", op.Responses.Value("409"))
	}
	requireAll(t, runOnlyDoc(t, tooLarge, declared, id, toyOverrides, "oncekey", 0), conformance.Pass, "")
	// An answer past what the tool reads is the override's to shrink.
	huge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Large") != "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"id":"` + strings.Repeat("n", conformance.MaxAnswerBytes) + `"}`))
			return
		}
		toy.ServeHTTP(w, r)
	})
	requireAll(t, runOnly(t, huge, id, toyOverrides, "oncekey", 0), conformance.Error, "make the large override's answer at most 4194304 bytes")
	requireAll(t, runOnly(t, newToy(bugs{}), id, overridesWith("large", ""), "oncekey", 0), conformance.Skip, "give it a large override")
	requireAll(t, runOnly(t, newToy(bugs{}), id, overridesWith("large", `{query: {big: "yes"}}`), "oncekey", 0), conformance.Error, "fewer than 1048576")
}
