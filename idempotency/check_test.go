package idempotency_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// errInvalidBody is what the checks of these tests refuse a body with.
var errInvalidBody = errors.New("the amount must be positive")

// TestRequestCheck: Request.Check runs when the protocol has decided to run
// a request and before it answers a mismatch, never for a replay; its
// error refuses the request and consumes no key. Through the core (Begin)
// and through the HTTP layer (Serve), which must hand the check on.
func TestRequestCheck(t *testing.T) {
	t.Parallel()
	const valid, other, invalid = `{"amount":5}`, `{"amount":7}`, `{"amount":0}`
	type attempt struct {
		body       string
		wantErr    error // nil: wantStatus
		wantStatus int   // 201 ran, 200 replayed
		wantChecks int   // Check calls so far
	}
	steps := []attempt{
		{body: invalid, wantErr: errInvalidBody, wantChecks: 1},      // refused, the key stays free
		{body: valid, wantStatus: http.StatusCreated, wantChecks: 2}, // the same key runs
		{body: valid, wantStatus: http.StatusOK, wantChecks: 2},      // a replay is not checked
		{body: invalid, wantErr: errInvalidBody, wantChecks: 3},      // invalid before it is a mismatch
		{body: other, wantErr: idempotency.ErrKeyMismatch, wantChecks: 4},
	}
	check := func(calls *int, body string) func() error {
		return func() error {
			*calls++
			if body == invalid {
				return errInvalidBody
			}
			return nil
		}
	}

	t.Run("Begin", func(t *testing.T) {
		t.Parallel()
		op := idempotency.NewOperation(idempotency.New(idempotency.Config{}), memstore.New(), idempotency.OperationConfig{Name: "charge"})
		ctx := t.Context()
		calls := 0
		for i, step := range steps {
			d, err := op.Begin(ctx, idempotency.Request{
				Scope: "acme", Key: "k", Method: "POST", Route: "/charges", Path: "/charges",
				Body: []byte(step.body), Check: check(&calls, step.body),
			})
			require.Equal(t, step.wantChecks, calls, "step %d (%s): Check calls", i, step.body)
			if step.wantErr != nil {
				require.ErrorIs(t, err, step.wantErr, "step %d (%s)", i, step.body)
				continue
			}
			require.NoError(t, err, "step %d (%s)", i, step.body)
			if step.wantStatus == http.StatusOK {
				require.NotNil(t, d.Replay, "step %d (%s): want a replay", i, step.body)
				continue
			}
			require.Nil(t, d.Replay, "step %d (%s): want a run", i, step.body)
			require.NoError(t, d.Finish(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"id":1}`)}))
		}
	})

	t.Run("Serve", func(t *testing.T) {
		t.Parallel()
		op := idempotency.NewOperation(idempotency.New(idempotency.Config{}), memstore.New(), idempotency.OperationConfig{Name: "charge"})
		calls, runs := 0, 0
		next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			runs++
			w.WriteHeader(http.StatusCreated)
		})
		for i, step := range steps {
			r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(step.body))
			w := httptest.NewRecorder()
			op.Serve(w, r, idempotency.Request{Scope: "acme", Key: "k", Body: []byte(step.body), Check: check(&calls, step.body)}, next)
			require.Equal(t, step.wantChecks, calls, "step %d (%s): Check calls", i, step.body)
			switch {
			case errors.Is(step.wantErr, errInvalidBody):
				// Not one of the protocol's errors: the writer's 500, and
				// nothing ran.
				require.Equal(t, http.StatusInternalServerError, w.Code, "step %d (%s): %s", i, step.body, w.Body)
			case step.wantErr != nil:
				require.Equal(t, idempotency.ProblemOf(step.wantErr).Status, w.Code, "step %d (%s): %s", i, step.body, w.Body)
			case step.wantStatus == http.StatusOK:
				require.Equal(t, "true", w.Header().Get(idempotency.HeaderReplayed), "step %d (%s): want a replay", i, step.body)
			default:
				require.Equal(t, http.StatusCreated, w.Code, "step %d (%s): %s", i, step.body, w.Body)
			}
		}
		require.Equal(t, 1, runs, "the operation runs once, for the valid body")
	})
}
