package jobs_test

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/jobs"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// abandoned counts the tasks a worker gave up (payments.Observer).
type abandoned struct {
	mu    sync.Mutex
	kinds []string
}

func (a *abandoned) TaskAbandoned(kind string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.kinds = append(a.kinds, kind)
}

func (a *abandoned) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.kinds...)
}

// A job whose payment the primary does not hold is not cancelled at its
// first attempt, as it was when a lagging replica made a payment just
// accepted look gone: it is retried with the policy's backoff for all of
// its attempts, and only then given up, told to the observer (a metric and
// an alert) and listed among the jobs given up (`oncekey payments stuck`).
func TestJobOfAMissingPaymentIsRetriedThenGivenUpLoudly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := testdb.Fresh(t)
	policy := payments.RetryPolicy{Attempts: 3, Base: 5 * time.Millisecond, Limit: 20 * time.Millisecond, Timeout: 5 * time.Second}
	runner, err := jobs.New(pool, jobs.Config{Policy: policy, PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	seen := &abandoned{}
	worker := payments.NewWorker(payments.WorkerConfig{
		Repo: postgres.New(pool, runner), Observer: seen, Logger: slog.New(slog.DiscardHandler),
		Provider: provider.NewClient("http://127.0.0.1:1", &http.Client{Timeout: time.Second}), // never asked
		Render:   func(payments.Payment) (idempotency.Response, error) { return idempotency.Response{}, nil },
		RenderRefund: func(payments.Refund) (idempotency.Response, error) {
			return idempotency.Response{}, nil
		},
	})
	missing := payments.Ref{AccountID: uuid.New(), PaymentID: uuid.New()}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return runner.InsertCharge(ctx, tx, missing) }))
	require.NoError(t, runner.Start(ctx, worker))
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, runner.Stop(stop))
	})

	var given []jobs.GivenUp
	require.Eventually(t, func() bool {
		given, err = runner.GivenUp(ctx, 10)
		return err == nil && len(given) == 1
	}, 10*time.Second, 10*time.Millisecond, "the job is given up in the end: %v", err)
	g := given[0]
	require.Equal(t, payments.ChargeTask(missing), g.Task, "the job names its payment")
	require.Equal(t, "cancelled", g.State)
	require.Equal(t, policy.Attempts, g.Attempts, "every charge attempt was made before giving up")
	require.Contains(t, g.Error, payments.ErrGone.Error())
	require.Equal(t, []string{"charge"}, seen.seen(), "giving up was told once")
}
