package conformance_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/conformance"
)

// loadSpec reads a spec of testdata.
func loadSpec(t *testing.T, name string) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("testdata/" + name)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(loader.Context), "testdata/%s", name)
	return doc
}

const toyOverrides = `
operations:
  POST /widgets/{id}/paint:
    path: {id: "{{create:POST /widgets .id}}"}
    slow: {header: {X-Slow: 300ms}}
    fail: {header: {X-Fail: "1"}}
    large: {header: {X-Large: "1"}}
  createWidget:
    slow: {header: {X-Slow: 300ms}}
    fail: {header: {X-Fail: "1"}}
    large: {header: {X-Large: "1"}}
`

// toyRetention is how long retention waits against the test APIs: longer
// than a toy that forgets keys keeps one (keptFor), and short enough to
// wait for each operation of every run.
const toyRetention = keptFor + 200*time.Millisecond

// check runs every check against h with the spec and profile given.
func check(t *testing.T, h http.Handler, spec, overrides, profile string) []conformance.Result {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	o, err := conformance.ParseOverrides([]byte(overrides))
	require.NoError(t, err)
	p, err := conformance.ProfileNamed(profile)
	require.NoError(t, err)
	results, err := conformance.Run(context.Background(), conformance.Config{
		Spec: loadSpec(t, spec), BaseURL: srv.URL, Auth: "Bearer a", Auth2: "Bearer b", Profile: p, Overrides: o,
		RetentionWait: toyRetention,
	})
	require.NoError(t, err)
	return results
}

// testScope is the scope of the test APIs built on the engine: the two
// accounts check passes, and 401 for anything else.
func testScope(r *http.Request) (string, error) {
	if a := r.Header.Get("Authorization"); a == "Bearer a" || a == "Bearer b" {
		return a, nil
	}
	return "", idempotency.ErrNoScope
}

// byStatus returns the ids of the checks with status (on any operation).
func byStatus(results []conformance.Result, status conformance.Status) []string {
	ids := map[string]bool{}
	for _, r := range results {
		if r.Status == status {
			ids[r.Check] = true
		}
	}
	return slices.Sorted(maps.Keys(ids))
}

func reasons(results []conformance.Result) string {
	var b []byte
	for _, r := range results {
		if r.Status != conformance.Pass {
			b = append(b, string(r.Status)+" "+r.Check+" "+r.Operation+": "+r.Reason+"\n"...)
		}
	}
	return string(b)
}

// TestChecksFailWhenTheyShould runs every check against a toy API that
// keeps the protocol, then against copies of it each broken in one way:
// the checks that fail are exactly the ones that should (none is an error:
// their requests work), and every check fails against at least one broken
// API.
func TestChecksFailWhenTheyShould(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		bugs   bugs
		failed []string
	}{
		{"keeps the protocol", bugs{}, nil},
		{"runs every duplicate", bugs{runsEveryDuplicate: true},
			[]string{"canonical-form", "canonical-json", "concurrent-once", "in-flight", "large-answer", "mismatch-operation", "mismatch-request", "replay", "retention"}},
		{"replays a different body", bugs{replaysDifferentBody: true}, []string{"canonical-form", "canonical-json", "concurrent-once", "large-answer", "replay", "response-valid", "retention"}},
		{"ignores the fingerprint", bugs{ignoresFingerprint: true}, []string{"mismatch-operation", "mismatch-request", "response-valid"}},
		{"leaks across credentials", bugs{leaksAcrossCredentials: true}, []string{"credential-isolation"}},
		{"refuses another caller's key", bugs{refusesOthersKeys: true}, []string{"credential-isolation"}},
		{"stores validation errors", bugs{storesValidationErrors: true}, []string{"validation-not-stored"}},
		{"replays Set-Cookie", bugs{replaysSetCookie: true}, []string{"no-set-cookie"}},
		{"runs requests without a key", bugs{acceptsNoKey: true}, []string{"key-required"}},
		{"takes any key", bugs{acceptsAnyKey: true}, []string{"key-malformed"}},
		{"compares body bytes", bugs{comparesBytes: true}, []string{"canonical-form", "canonical-json"}},
		{"answers a duplicate in flight 409", bugs{inFlightAs409: true}, []string{"concurrent-once", "in-flight"}},
		{"leaves Retry-After out", bugs{noRetryAfter: true}, []string{"retry-after"}},
		{"answers off its spec", bugs{answersOffSpec: true}, []string{"response-valid"}},
		{"stores a 5xx", bugs{storesServerErrors: true}, []string{"error-not-stored"}},
		{"forgets keys", bugs{forgetsKeys: true}, []string{"retention"}},
		{"truncates a large answer", bugs{truncatesLarge: true}, []string{"large-answer", "response-valid"}},
	}
	var mu sync.Mutex
	failing := map[string]bool{}
	t.Run("apis", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				results := check(t, newToy(tt.bugs), "widgets.yaml", toyOverrides, "oncekey")
				failed := byStatus(results, conformance.Fail)
				require.Equal(t, tt.failed, failed, reasons(results))
				// Every request the checks need works: a broken promise
				// is a failure, never an error.
				require.Empty(t, byStatus(results, conformance.Error), reasons(results))
				if tt.failed == nil {
					require.Empty(t, byStatus(results, conformance.Skip), reasons(results))
				}
				mu.Lock()
				defer mu.Unlock()
				for _, id := range failed {
					failing[id] = true
				}
			})
		}
	})
	for _, c := range conformance.Checks() {
		require.True(t, failing[c.ID], "no broken API makes check %s fail", c.ID)
	}
}

var update = flag.Bool("update", false, "rewrite the checks table of docs/conformance.md")

// TestChecksReference keeps the table of checks in docs/conformance.md
// equal to the checks the code runs.
func TestChecksReference(t *testing.T) {
	const path = "../../docs/conformance.md"
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	var table strings.Builder
	table.WriteString("| Id | Rationale | Source |\n| --- | --- | --- |\n")
	for _, c := range conformance.Checks() {
		fmt.Fprintf(&table, "| `%s` | %s | %s |\n", c.ID, c.Rationale, c.Source)
	}
	re := regexp.MustCompile(`(?s)(<!-- checks:[^\n]*-->\n).*?(<!-- /checks -->)`)
	require.True(t, re.Match(doc), "%s has no checks markers", path)
	want := re.ReplaceAllString(string(doc), "${1}"+strings.ReplaceAll(table.String(), "$", "$$")+"${2}")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
		return
	}
	require.Equal(t, want, string(doc), "docs/conformance.md's checks are stale: go test ./internal/conformance -run TestChecksReference -update")
}

// thief is another host that counts what reaches it and the credentials
// that came along.
type thief struct {
	mu    sync.Mutex
	seen  int
	creds []string
}

func (th *thief) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	th.mu.Lock()
	defer th.mu.Unlock()
	th.seen++
	if a := r.Header.Get("Authorization"); a != "" {
		th.creds = append(th.creds, a)
	}
	w.WriteHeader(http.StatusOK)
}

// An API under test that names another host (or another port, or http
// for https) in a Location gets no request there: the tool is pointed at
// other people's APIs, and its credentials go to the API under test alone.
// The checks that would have followed it cannot run, and say so.
func TestCredentialsStayWithTheAPIUnderTest(t *testing.T) {
	t.Parallel()
	th := &thief{}
	elsewhere := httptest.NewServer(th)
	t.Cleanup(elsewhere.Close)
	toy := newToy(bugs{})
	hostile := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		toy.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		if loc := rec.Header().Get("Location"); loc != "" {
			w.Header().Set("Location", elsewhere.URL+"/steal"+loc)
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
	results := check(t, hostile, "widgets.yaml", toyOverrides, "oncekey")
	require.Zero(t, th.seen, "nothing reached the other host; credentials sent there: %v", th.creds)
	found := false
	for _, r := range results {
		if r.Status == conformance.Skip && strings.Contains(r.Reason, "credentials are sent to the API under test alone") {
			found = true
		}
	}
	require.True(t, found, "a check says why it could not run:\n%s", reasons(results))
}

// An answer's body is read up to a bound, however much the API sends: of a
// body of 64 MiB, no answer got much further than the bound before the
// tool hung up.
func TestAnswersAreReadUpToABound(t *testing.T) {
	t.Parallel()
	var most, gets atomic.Int64 // the most written to one answer; answers sent
	toy := newToy(bugs{})
	endless := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			toy.ServeHTTP(w, r)
			return
		}
		gets.Add(1)
		w.Header().Set("Content-Type", "application/json")
		chunk := []byte(strings.Repeat("a", 64<<10))
		var written int64
		defer func() {
			for old := most.Load(); written > old && !most.CompareAndSwap(old, written); old = most.Load() {
			}
		}()
		for range 1024 {
			n, err := w.Write(chunk)
			written += int64(n)
			if err != nil {
				return
			}
		}
	})
	check(t, endless, "widgets.yaml", toyOverrides, "oncekey")
	require.Positive(t, gets.Load(), "the checks read resources")
	// The bound, and what the connection's buffers held when it closed.
	require.Less(t, most.Load(), int64(conformance.MaxAnswerBytes+8<<20), "an answer was read far past the bound")
}
