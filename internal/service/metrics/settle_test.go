package metrics_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/metrics"
)

// TestSettleFamilies: a gateway's settle families exist only once its
// held operations are declared, each series at zero from the start, and
// move as the engine reports.
func TestSettleFamilies(t *testing.T) {
	t.Parallel()
	const op = "POST /transfers"
	m := metrics.New()
	for _, name := range []string{"oncekey_idempotency_settle_failures_total", "oncekey_idempotency_settles_pending", "oncekey_idempotency_settles_dropped_total"} {
		require.Nil(t, scrapeMetrics(t, m)[name], "%s before any held operation: the service has none", name)
	}
	m.HeldOperations(op)
	m.HeldOperations(op) // declared again: registered once
	f := scrapeMetrics(t, m)
	require.Zero(t, f.value(t, "oncekey_idempotency_settle_failures_total", "operation", op))
	require.Zero(t, f.value(t, "oncekey_idempotency_settles_pending"))
	reasons := []string{"bound", "shutdown", "expired"} // idempotency.Observer.SettleDropped's
	for _, reason := range reasons {
		require.Zero(t, f.value(t, "oncekey_idempotency_settles_dropped_total", "operation", op, "reason", reason), reason)
	}

	var settles idempotency.Observer = m
	settles.SettleFailed(op)
	settles.SettleFailed(op)
	settles.SettlesPending(1)
	settles.SettlesPending(1)
	settles.SettlesPending(-1)
	settles.SettleDropped(op, "shutdown")
	f = scrapeMetrics(t, m)
	require.Equal(t, 2.0, f.value(t, "oncekey_idempotency_settle_failures_total", "operation", op))
	require.Equal(t, 1.0, f.value(t, "oncekey_idempotency_settles_pending"))
	require.Equal(t, 1.0, f.value(t, "oncekey_idempotency_settles_dropped_total", "operation", op, "reason", "shutdown"))
}
