package payments_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/payments"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	noJitter := func(int64) int64 { return 0 }
	fullJitter := func(n int64) int64 { return n - 1 } // rand.Int64N(n) is at most n-1
	for _, tc := range []struct {
		name    string
		attempt int
		jitter  func(int64) int64
		want    time.Duration
	}{
		{"first retry waits the base", 1, noJitter, time.Second},
		{"doubles per attempt", 3, noJitter, 4 * time.Second},
		{"capped at the limit", 10, noJitter, time.Minute},
		{"jitter takes at most a quarter", 3, fullJitter, 3*time.Second + 1},
		{"no jitter function, no jitter", 2, nil, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, payments.Backoff(tc.attempt, time.Second, time.Minute, tc.jitter))
		})
	}
}

func TestRetryPolicyDefaults(t *testing.T) {
	t.Parallel()
	p := payments.RetryPolicy{Attempts: 3}.WithDefaults()
	require.Equal(t, payments.RetryPolicy{Attempts: 3, Base: payments.DefaultBase, Limit: payments.DefaultLimit, Timeout: payments.DefaultTimeout}, p)
	// The whole schedule of the defaults settles a payment long before a
	// key expires (48h), so the final answer lands on the key.
	var total time.Duration
	d := payments.RetryPolicy{}.WithDefaults()
	for a := 1; a <= d.Attempts; a++ {
		total += d.Timeout + payments.Backoff(a, d.Base, d.Limit, nil)
	}
	require.Less(t, total, time.Hour, "the default schedule takes %s", total)
}
