package metrics_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// cleanupLockID is the advisory lock PurgeExpired takes.
var cleanupLockID = pgstore.CleanupLock(pgstore.DefaultTable)

// insertExpired inserts n completed keys that expired an hour ago.
func insertExpired(t *testing.T, pool *pgxpool.Pool, prefix string, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO idempotency_keys
		(scope, idempotency_key, fingerprint, request_method, request_route, status,
		 response_status, response_headers, response_body, created_at, completed_at, expires_at)
		SELECT uuid_send(gen_random_uuid()), $1 || i, decode(repeat('ef', 32), 'hex'), 'POST', '/orders', 'completed',
		 201, '{}', '\x7b7d'::bytea, now() - interval '49 hours', now() - interval '49 hours', now() - interval '1 hour'
		FROM generate_series(1, $2::int) AS i`, prefix, n)
	require.NoError(t, err, "insert %d expired keys", n)
}

func countKeys(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM idempotency_keys").Scan(&n), "count keys")
	return n
}

// failingPurger is a Purger whose database fails after it deleted
// `deleted` keys (in the batches before the failing one).
type failingPurger struct{ deleted int64 }

func (p failingPurger) PurgeExpired(context.Context, int) (int64, error) {
	return p.deleted, errors.New("injected: purge failed")
}

func TestCleanupMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := testdb.Fresh(t) // whole-table figures need a table of the test's own
	store := postgres.New(pool, nil)
	m := metrics.New()
	quiet := slog.New(slog.DiscardHandler)
	cleanup := idempotency.Cleanup{Purge: store.PurgeExpired, Batch: 10, Observe: m.CleanupRun, Logger: quiet}

	// runs reads oncekey_cleanup_runs_total by result; every result exists
	// from the start.
	runs := func(f families) map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, r := range []string{"ok", "error", "skipped"} {
			out[r] = f.value(t, "oncekey_cleanup_runs_total", "result", r)
		}
		return out
	}

	f := scrapeMetrics(t, m)
	require.Equal(t, map[string]float64{"ok": 0, "error": 0, "skipped": 0}, runs(f), "no run yet")
	require.Zero(t, f.value(t, "oncekey_cleanup_deleted_keys_total"), "nothing deleted yet")
	require.Zero(t, f.value(t, "oncekey_cleanup_run_deleted_keys_count"), "no run observed yet")
	require.Zero(t, f.value(t, "oncekey_cleanup_run_duration_seconds_count"), "no run observed yet")
	require.Zero(t, f.value(t, "oncekey_cleanup_last_success_timestamp_seconds"), "0 until the first success")

	// ok: 25 expired keys, deleted in batches of 10.
	{
		insertExpired(t, pool, "ok-", 25)
		start := time.Now()
		n, err := cleanup.Once(ctx)
		end := time.Now()
		require.NoError(t, err, "the run succeeds")
		require.Equal(t, int64(25), n, "the run deletes all 25 expired keys, in batches of 10")
		require.Zero(t, countKeys(t, pool), "no key is left")

		f := scrapeMetrics(t, m)
		require.Equal(t, map[string]float64{"ok": 1, "error": 0, "skipped": 0}, runs(f), "one ok run")
		require.Equal(t, 25.0, f.value(t, "oncekey_cleanup_deleted_keys_total"), "deleted keys")
		require.Equal(t, 1.0, f.value(t, "oncekey_cleanup_run_deleted_keys_count"), "one run observed")
		require.Equal(t, 25.0, f.value(t, "oncekey_cleanup_run_deleted_keys_sum"), "its 25 deleted keys")
		require.Equal(t, 1.0, f.value(t, "oncekey_cleanup_run_duration_seconds_count"), "one run's duration observed")
		d := f.value(t, "oncekey_cleanup_run_duration_seconds_sum")
		require.Greater(t, d, 0.0, "the run took some time")
		require.LessOrEqual(t, d, end.Sub(start).Seconds(), "the duration is the run's, in seconds")
		last := f.value(t, "oncekey_cleanup_last_success_timestamp_seconds")
		require.GreaterOrEqual(t, last, float64(start.UnixMilli())/1000-1, "last success is the run's time")
		require.LessOrEqual(t, last, float64(end.UnixMilli())/1000+1, "last success is the run's time")
	}

	// skipped: another replica holds the cleanup lock.
	{
		before := scrapeMetrics(t, m)
		insertExpired(t, pool, "skipped-", 3)

		other, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
		require.NoError(t, err, "connect as another replica")
		t.Cleanup(func() { _ = other.Close(ctx) })
		_, err = other.Exec(ctx, "SELECT pg_advisory_lock($1)", cleanupLockID)
		require.NoError(t, err, "take the cleanup lock")

		n, err := cleanup.Once(ctx)
		require.ErrorIs(t, err, idempotency.ErrCleanupBusy, "the lock is held elsewhere")
		require.Zero(t, n, "nothing deleted")
		require.Equal(t, 3, countKeys(t, pool), "the expired keys are still there")

		f := scrapeMetrics(t, m)
		require.Equal(t, map[string]float64{"ok": 1, "error": 0, "skipped": 1}, runs(f), "one skipped run more")
		for _, name := range []string{"oncekey_cleanup_deleted_keys_total", "oncekey_cleanup_run_deleted_keys_count",
			"oncekey_cleanup_run_deleted_keys_sum", "oncekey_cleanup_run_duration_seconds_count",
			"oncekey_cleanup_last_success_timestamp_seconds"} {
			require.Equal(t, before.value(t, name), f.value(t, name), "a skipped run does not move %s", name)
		}

		_, err = other.Exec(ctx, "SELECT pg_advisory_unlock($1)", cleanupLockID)
		require.NoError(t, err, "release the cleanup lock")
		n, err = cleanup.Once(ctx)
		require.NoError(t, err, "the lock is free again")
		require.Equal(t, int64(3), n, "the next run deletes what the skipped one left")
		f = scrapeMetrics(t, m)
		require.Equal(t, map[string]float64{"ok": 2, "error": 0, "skipped": 1}, runs(f), "one ok run more")
		require.Equal(t, 28.0, f.value(t, "oncekey_cleanup_deleted_keys_total"), "deleted keys over both ok runs")
		require.Equal(t, 2.0, f.value(t, "oncekey_cleanup_run_deleted_keys_count"), "two runs observed")
	}

	// error: the purge fails, at once or after some batches.
	{
		before := scrapeMetrics(t, m)
		_, err := idempotency.Cleanup{Purge: failingPurger{}.PurgeExpired, Batch: 10, Observe: m.CleanupRun, Logger: quiet}.Once(ctx)
		require.Error(t, err, "the purge fails")
		n, err := idempotency.Cleanup{Purge: failingPurger{deleted: 7}.PurgeExpired, Batch: 10, Observe: m.CleanupRun, Logger: quiet}.Once(ctx)
		require.Error(t, err, "the purge fails after deleting some keys")
		require.Equal(t, int64(7), n, "the keys deleted before the failure are reported")

		f := scrapeMetrics(t, m)
		require.Equal(t, map[string]float64{"ok": 2, "error": 2, "skipped": 1}, runs(f), "two error runs more")
		require.Equal(t, before.value(t, "oncekey_cleanup_deleted_keys_total")+7, f.value(t, "oncekey_cleanup_deleted_keys_total"),
			"keys deleted by the batches before a failure were deleted, and are counted")
		for _, name := range []string{"oncekey_cleanup_run_deleted_keys_count", "oncekey_cleanup_run_duration_seconds_count",
			"oncekey_cleanup_last_success_timestamp_seconds"} {
			require.Equal(t, before.value(t, name), f.value(t, name), "a failed run does not move %s", name)
		}
	}
}
