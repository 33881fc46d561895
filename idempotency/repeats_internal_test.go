package idempotency

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRepeatsStayBounded: however many requests arrive within a window,
// the engine remembers maxRepeats of them at most, and its order of
// arrival never holds more than twice as many slots; once the window has
// gone by, a new request finds the old ones forgotten.
func TestRepeatsStayBounded(t *testing.T) {
	t.Parallel()
	r := newRepeats()
	now := time.Now()
	var id repeatID
	for i := range 3 * maxRepeats {
		binary.BigEndian.PutUint64(id[:], uint64(i))
		_, found, seq := r.enter(id, keyHash{1}, now, time.Hour, false)
		require.False(t, found)
		if i%2 == 0 {
			r.done(id, seq, 201, "")
		}
		require.LessOrEqual(t, len(r.entries), maxRepeats)
		require.LessOrEqual(t, len(r.order)-r.head, maxRepeats)
		require.LessOrEqual(t, len(r.order), 2*maxRepeats+1)
	}
	require.Len(t, r.entries, maxRepeats, "the newest are remembered")

	binary.BigEndian.PutUint64(id[:], uint64(3*maxRepeats-1))
	_, found, _ := r.enter(id, keyHash{2}, now.Add(time.Hour+time.Second), time.Hour, true)
	require.False(t, found, "past its window a request is no repeat")
	require.Len(t, r.entries, 1, "and the rest are forgotten with it")
}
