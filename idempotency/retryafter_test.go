package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// failingStore answers every claim with err; the engine asks it nothing
// else (the embedded Store is nil).
type failingStore struct {
	idempotency.Store[struct{}]
	err error
}

func (s failingStore) Claim(context.Context, idempotency.ClaimRequest) (idempotency.Lease[struct{}], *idempotency.Record, error) {
	return nil, nil, s.err
}

// The engine itself sets Retry-After, from Config.RetryAfter rounded up to
// whole seconds, on the answers that tell a client to come back: 503 when
// the store is unavailable or timed out, and 202 for a duplicate still in
// flight. A writer that sets no header of its own (the default, or a bare
// one) still sends it: a service whose own error writer sets it again
// cannot hide its loss here. A store that failed otherwise (500) promises
// nothing, and gets none.
func TestRetryAfterIsTheEnginesOwn(t *testing.T) {
	t.Parallel()
	bare := func(w http.ResponseWriter, _ *http.Request, err error) {
		p := idempotency.ProblemOf(err)
		w.WriteHeader(p.Status)
	}
	writers := []struct {
		name  string
		write func(http.ResponseWriter, *http.Request, error)
	}{{"the default writer", nil}, {"a bare writer", bare}}
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		retryAfter string
	}{
		{"store unavailable", fmt.Errorf("%w: the database is restarting", idempotency.ErrUnavailable), http.StatusServiceUnavailable, "3"},
		{"claim timed out", fmt.Errorf("claim: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, "3"},
		{"duplicate in flight", idempotency.ErrInFlight, http.StatusAccepted, "3"},
		{"store failed", errors.New("disk on fire"), http.StatusInternalServerError, ""},
	} {
		for _, wr := range writers {
			t.Run(tc.name+", "+wr.name, func(t *testing.T) {
				t.Parallel()
				engine := idempotency.New(idempotency.Config{
					Scope:      func(*http.Request) (string, error) { return "tenant", nil },
					RetryAfter: 2500 * time.Millisecond,
					WriteError: wr.write,
				})
				var runs atomic.Int64
				h := idempotency.NewOperation[struct{}](engine, failingStore{err: tc.err}, idempotency.OperationConfig{}).
					Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
						runs.Add(1)
						w.WriteHeader(http.StatusCreated)
					}))
				req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(`{}`))
				req.Header.Set(idempotency.HeaderKey, "k")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				require.Equal(t, tc.status, rec.Code, "%s", rec.Body)
				require.Equal(t, tc.retryAfter, rec.Header().Get("Retry-After"), "Retry-After of the engine's %d", tc.status)
				require.Zero(t, runs.Load(), "nothing ran")
			})
		}
	}
}
