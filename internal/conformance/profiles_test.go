package conformance_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance"
)

// dialect is the toy API answering with another profile's statuses: its
// in-flight answer (a 202 problem), its refusal of a reused key (409) and
// of a request without a key (400) are rewritten to the statuses given (0:
// left as the toy answers), its replay marker can be taken off, and its
// keys can be held per path. So one API, whose every other promise the
// oncekey profile's tests show kept, speaks each profile, and each dialect
// can be broken in one way.
type dialect struct {
	api                       http.Handler
	inFlight, mismatch, noKey int
	unmarked                  bool // replays lose Idempotent-Replayed
	perPath                   bool // a key is the caller's on one path only, as ACP §6.1 scopes them
}

func (d dialect) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if key := r.Header.Get("Idempotency-Key"); d.perPath && key != "" {
		r.Header.Set("Idempotency-Key", key+" "+r.URL.Path)
	}
	rec := httptest.NewRecorder()
	d.api.ServeHTTP(rec, r)
	status := rec.Code
	problem := rec.Header().Get("Content-Type") == "application/problem+json"
	switch {
	case status == http.StatusAccepted && problem && d.inFlight != 0:
		status = d.inFlight
	case status == http.StatusConflict && d.mismatch != 0:
		status = d.mismatch
	case status == http.StatusBadRequest && r.Header.Values("Idempotency-Key") == nil && d.noKey != 0:
		status = d.noKey
	}
	if d.unmarked {
		rec.Header().Del("Idempotent-Replayed")
	}
	for name, values := range rec.Header() {
		w.Header()[name] = values
	}
	w.WriteHeader(status)
	_, _ = w.Write(rec.Body.Bytes())
}

// dialectDoc is the toy's document with the statuses the dialects answer
// besides the toy's own (422 for a reused key, 428 for a missing one), so
// that response-valid holds them to the document like every other answer.
func dialectDoc(t *testing.T) *openapi3.T {
	t.Helper()
	doc := loadSpec(t, "widgets.yaml")
	for _, path := range []string{"/widgets", "/widgets/{id}/paint"} {
		op := doc.Paths.Value(path).Post
		problem := op.Responses.Value("409")
		op.Responses.Set("422", problem)
		op.Responses.Set("428", problem)
	}
	return doc
}

// checkProfile runs every check against h with the dialects' document and
// the profile p, which need not be one --profile names.
func checkProfile(t *testing.T, h http.Handler, p conformance.Profile) []conformance.Result {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	o, err := conformance.ParseOverrides([]byte(toyOverrides))
	require.NoError(t, err)
	results, err := conformance.Run(context.Background(), conformance.Config{
		Spec: dialectDoc(t), BaseURL: srv.URL, Auth: "Bearer a", Auth2: "Bearer b", Profile: p, Overrides: o,
		RetentionWait: toyRetention,
	})
	require.NoError(t, err)
	return results
}

// TestProfilesIETF07AndAgentCommerce runs every check with each of the two
// newer profiles against the toy API speaking that profile, then against
// copies broken in one way: the API that keeps the profile fails nothing,
// and each broken one fails exactly the checks it should. None is an
// error: every request the checks need works.
func TestProfilesIETF07AndAgentCommerce(t *testing.T) {
	t.Parallel()
	// The draft's statuses: 409 in flight, 422 for a reused key; the toy
	// already refuses a request without a key with 400.
	ietf := func(b bugs) dialect { return dialect{api: newToy(b), inFlight: 409, mismatch: 422} }
	tests := []struct {
		profile string
		name    string
		api     http.Handler
		failed  []string
		skipped []string
	}{
		{"ietf-07", "keeps the profile", ietf(bugs{}), nil,
			// The draft leaves the fingerprint's form to the server and
			// says MAY of Retry-After.
			[]string{"canonical-form", "canonical-json", "retry-after"}},
		{"ietf-07", "answers a reused key 409", dialect{api: newToy(bugs{}), inFlight: 409}, []string{"mismatch-operation", "mismatch-request"}, nil},
		{"ietf-07", "answers a duplicate in flight 202", dialect{api: newToy(bugs{}), mismatch: 422}, []string{"concurrent-once", "in-flight"}, nil},
		{"ietf-07", "runs requests without a key", ietf(bugs{acceptsNoKey: true}), []string{"key-required"}, nil},

		{"agent-commerce", "keeps the profile", ietf(bugs{}), nil,
			// ACP's bodies are JSON, and its keys are held per path: no
			// other operation shares one with the toy's.
			[]string{"canonical-form", "mismatch-operation"}},
		{"agent-commerce", "refuses a request without a key 428", dialect{api: newToy(bugs{}), inFlight: 409, mismatch: 422, noKey: 428}, []string{"key-required"}, nil},
		{"agent-commerce", "runs requests without a key", ietf(bugs{acceptsNoKey: true}), []string{"key-required"}, nil},
		{"agent-commerce", "answers a reused key 409", dialect{api: newToy(bugs{}), inFlight: 409}, []string{"mismatch-request"}, nil},
		{"agent-commerce", "answers a duplicate in flight 202", dialect{api: newToy(bugs{}), mismatch: 422}, []string{"concurrent-once", "in-flight"}, nil},
		{"agent-commerce", "leaves Retry-After out", ietf(bugs{noRetryAfter: true}), []string{"retry-after"}, nil},
		{"agent-commerce", "does not mark replays", dialect{api: newToy(bugs{}), inFlight: 409, mismatch: 422, unmarked: true}, []string{"canonical-json", "large-answer", "replay", "retention"}, nil},
		{"agent-commerce", "compares body bytes", ietf(bugs{comparesBytes: true}), []string{"canonical-json"}, nil},
		// ACP §6.1 scopes a key to the caller and the endpoint's path, as
		// the profile does: the same key on another path runs, and passes.
		{"agent-commerce", "scopes keys per path as ACP says", dialect{api: newToy(bugs{}), inFlight: 409, mismatch: 422, perPath: true}, nil, []string{"canonical-form", "mismatch-operation"}},
	}
	for _, tt := range tests {
		t.Run(tt.profile+"/"+tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := conformance.ProfileNamed(tt.profile)
			require.NoError(t, err)
			results := checkProfile(t, tt.api, p)
			require.Equal(t, tt.failed, byStatus(results, conformance.Fail), reasons(results))
			require.Empty(t, byStatus(results, conformance.Error), reasons(results))
			if tt.failed == nil {
				require.Equal(t, tt.skipped, byStatus(results, conformance.Skip), reasons(results))
			}
		})
	}
}

// TestProfileMissingKeyStatus shows key-required holding an API to the
// profile's one status for a missing key, and to any 4xx without one: the
// API that answers 428 fails agent-commerce (400) and passes the same
// profile with the status left open.
func TestProfileMissingKeyStatus(t *testing.T) {
	t.Parallel()
	api := dialect{api: newToy(bugs{}), inFlight: 409, mismatch: 422, noKey: 428}
	strict, err := conformance.ProfileNamed("agent-commerce")
	require.NoError(t, err)
	require.Equal(t, 400, strict.MissingKeyStatus)
	open := strict
	open.MissingKeyStatus = 0
	for _, tt := range []struct {
		profile conformance.Profile
		want    conformance.Status
	}{{strict, conformance.Fail}, {open, conformance.Pass}} {
		results := checkProfile(t, api, tt.profile)
		n := 0
		for _, r := range results {
			if r.Check == "key-required" {
				n++
				require.Equal(t, tt.want, r.Status, "missing key status %d: %s", tt.profile.MissingKeyStatus, r.Reason)
			}
		}
		require.Equal(t, 2, n, "key-required ran on both operations")
	}
}

// TestProfileIETF07IsIETFUnderItsOwnName pins what reading -07 found: its
// text asks nothing of an API that -06's does not, so the two profiles
// expect the same answers; only their names differ.
func TestProfileIETF07IsIETFUnderItsOwnName(t *testing.T) {
	t.Parallel()
	six, seven := conformance.Profiles["ietf"], conformance.Profiles["ietf-07"]
	require.Equal(t, "ietf-07", seven.Name)
	seven.Name = six.Name
	require.Equal(t, six, seven)
}
