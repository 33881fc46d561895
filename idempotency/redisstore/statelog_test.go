package redisstore

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/internal/testharness"
)

// TestStateLogHoldsFlaps: a change is a line at once, unless a line of its
// kind came less than every ago; then the changes are held, and the state
// they leave is one line when the interval ends, with their count.
func TestStateLogHoldsFlaps(t *testing.T) {
	t.Parallel()
	logs := &testharness.Logs{}
	l := &stateLog{log: slog.New(slog.NewTextHandler(logs, nil)), every: 200 * time.Millisecond}
	lines := func() []string { return strings.Split(strings.TrimSpace(logs.String()), "\n") }
	down := errors.New("dial tcp: connection refused")

	l.changed(true, down)
	l.changed(false, nil)
	require.Len(t, lines(), 2, "the first failure and the first recovery are logged at once:\n%s", logs)
	require.Contains(t, lines()[0], "Redis tier failing")
	require.Contains(t, lines()[0], "connection refused")
	require.Contains(t, lines()[1], "Redis tier recovered")

	for range 5 { // flapping: failing again within the interval, and again
		l.changed(true, down)
		l.changed(false, nil)
	}
	l.changed(true, down)
	require.Len(t, lines(), 2, "flaps within the interval are held:\n%s", logs)
	require.Eventually(t, func() bool { return len(lines()) == 3 }, 5*time.Second, 10*time.Millisecond, "the held state is logged when the interval ends:\n%s", logs)
	require.Contains(t, lines()[2], "Redis tier failing")
	require.Contains(t, lines()[2], "changes=11")
}
