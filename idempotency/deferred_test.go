package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/idempotency"
)

// scriptedStore answers each claim with the next step of a script: a
// deferred lease whose Commit returns commitErr, or a record.
type scriptedStore struct {
	mu     sync.Mutex
	steps  []step
	claims []idempotency.ClaimRequest
}

type step struct {
	commitErr error               // a lease whose Commit returns this
	rec       *idempotency.Record // or this record
}

func (s *scriptedStore) Claim(_ context.Context, req idempotency.ClaimRequest) (idempotency.Lease, *idempotency.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims = append(s.claims, req)
	next := s.steps[0]
	s.steps = s.steps[1:]
	if next.rec != nil {
		return nil, next.rec, nil
	}
	return scriptedLease{err: next.commitErr}, nil, nil
}

type scriptedLease struct{ err error }

func (l scriptedLease) Context(ctx context.Context) context.Context        { return ctx }
func (l scriptedLease) Commit(context.Context, idempotency.Response) error { return l.err }
func (l scriptedLease) Rollback(context.Context) error                     { return nil }
func (l scriptedLease) ClaimedAt() time.Time                               { return time.Now() }

// A deferred commit that finds the key taken discards the operation's own
// response and answers from what holds the key: a replay, a 409, a 202, or
// (when the commit could not say) whatever a second, ordinary claim finds.
func TestLostDeferredClaim(t *testing.T) {
	t.Parallel()
	const body = `{"a":1}`
	fp, err := idempotency.ComputeFingerprint(http.MethodPost, "/things", "/things", nil, []byte(body))
	require.NoError(t, err)
	stored := idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"winner"}`)}
	winner := &idempotency.Record{Fingerprint: fp, Response: stored, ExpiresAt: time.Now().Add(time.Hour)}
	other := &idempotency.Record{Fingerprint: idempotency.Fingerprint{9}, Response: stored, ExpiresAt: time.Now().Add(time.Hour)}

	tests := []struct {
		name       string
		steps      []step
		wantStatus int
		wantBody   string
		replayed   bool
		deferred   []bool // Deferred of each claim made
	}{
		{name: "committed", steps: []step{{}}, wantStatus: http.StatusCreated, wantBody: `{"id":"mine"}`, deferred: []bool{true}},
		{name: "taken by a completed record", steps: []step{{commitErr: &idempotency.TakenError{Record: winner}}},
			wantStatus: http.StatusCreated, wantBody: `{"id":"winner"}`, replayed: true, deferred: []bool{true}},
		{name: "taken by a different request", steps: []step{{commitErr: &idempotency.TakenError{Record: other}}},
			wantStatus: http.StatusConflict, deferred: []bool{true}},
		{name: "held in flight", steps: []step{{commitErr: idempotency.ErrInFlight}},
			wantStatus: http.StatusAccepted, deferred: []bool{true}},
		{name: "changed under the commit: claimed again", steps: []step{{commitErr: &idempotency.TakenError{}}, {rec: winner}},
			wantStatus: http.StatusCreated, wantBody: `{"id":"winner"}`, replayed: true, deferred: []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &scriptedStore{steps: tt.steps}
			mw := idempotency.New(idempotency.Config{
				Store:      store,
				Account:    func(context.Context) (uuid.UUID, bool) { return uuid.UUID{1}, true },
				Route:      func(r *http.Request) string { return r.URL.Path },
				Deferrable: func(op string) bool { return op == "POST /things" },
			})
			h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"id":"mine"}`))
			}))
			req := httptest.NewRequest(http.MethodPost, "/things", strings.NewReader(body))
			req.Header.Set(idempotency.HeaderKey, "k")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)

			require.Equal(t, tt.wantStatus, rec.Code, "status; body %s", rec.Body)
			if tt.wantBody != "" {
				require.Equal(t, tt.wantBody, rec.Body.String(), "body")
			}
			require.Equal(t, tt.replayed, rec.Header().Get(idempotency.HeaderReplayed) == "true", "Idempotent-Replayed")
			var deferred []bool
			for _, c := range store.claims {
				deferred = append(deferred, c.Deferred)
			}
			require.Equal(t, tt.deferred, deferred, "claims made, by Deferred")
		})
	}
}
