package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// scriptedStore answers each claim with the next step of a script: a
// lease deferred to its commit, whose Commit returns commitErr, or a record.
// It notes which way each claim came (now: AtOnce). The engine asks it
// nothing but claims (the embedded Store is nil).
type scriptedStore struct {
	idempotency.Store[struct{}]
	mu    sync.Mutex
	steps []step
	now   []bool // each claim made: AtOnce
}

type step struct {
	commitErr error               // a lease whose Commit returns this
	rec       *idempotency.Record // or this record
}

func (s *scriptedStore) Claim(_ context.Context, req idempotency.ClaimRequest) (idempotency.Lease[struct{}], *idempotency.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = append(s.now, req.AtOnce)
	next := s.steps[0]
	s.steps = s.steps[1:]
	if next.rec != nil {
		return nil, next.rec, nil
	}
	return scriptedLease{err: next.commitErr}, nil, nil
}

type scriptedLease struct{ err error }

func (l scriptedLease) Unit() struct{}                                     { return struct{}{} }
func (l scriptedLease) Ref() idempotency.Ref                               { return idempotency.Ref{ClaimedAt: time.Now()} }
func (l scriptedLease) Commit(context.Context, idempotency.Response) error { return l.err }
func (l scriptedLease) Rollback(context.Context) error                     { return nil }
func (l scriptedLease) WritePiece(context.Context, int, []byte) error {
	return errors.ErrUnsupported
}

// A deferred commit that finds the key taken discards the operation's own
// response and answers from what holds the key: a replay, a 409, a 202, or
// (when the commit could not say) whatever a second, ordinary claim finds.
func TestLostDeferredClaim(t *testing.T) {
	t.Parallel()
	const body = `{"a":1}`
	fp, err := idempotency.Request{Method: http.MethodPost, Route: "/things", Path: "/things", Body: []byte(body)}.Fingerprint()
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
		now        []bool // each claim made: AtOnce
	}{
		{name: "committed", steps: []step{{}}, wantStatus: http.StatusCreated, wantBody: `{"id":"mine"}`, now: []bool{false}},
		{name: "taken by a completed record", steps: []step{{commitErr: &idempotency.TakenError{Record: winner}}},
			wantStatus: http.StatusCreated, wantBody: `{"id":"winner"}`, replayed: true, now: []bool{false}},
		{name: "taken by a different request", steps: []step{{commitErr: &idempotency.TakenError{Record: other}}},
			wantStatus: http.StatusConflict, now: []bool{false}},
		{name: "held in flight", steps: []step{{commitErr: idempotency.ErrInFlight}},
			wantStatus: http.StatusAccepted, now: []bool{false}},
		{name: "changed under the commit: claimed again", steps: []step{{commitErr: &idempotency.TakenError{}}, {rec: winner}},
			wantStatus: http.StatusCreated, wantBody: `{"id":"winner"}`, replayed: true, now: []bool{false, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := &scriptedStore{steps: tt.steps}
			engine := idempotency.New(idempotency.Config{
				Scope: func(*http.Request) (string, error) { return "tenant", nil },
			})
			h := idempotency.NewOperation(engine, store, idempotency.OperationConfig{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
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
			require.Equal(t, tt.now, store.now, "claims made, and whether AtOnce")
		})
	}
}
