package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/gateway"
)

// TestRoutesSetRepeats: a routes file's repeat_window (a duration, or off)
// and refuse_repeats are the route's; anything else is refused, with the
// route or the line named.
func TestRoutesSetRepeats(t *testing.T) {
	t.Parallel()
	rs, err := gateway.ReadRoutes(strings.NewReader(`routes:
  - {method: POST, path: /orders, repeat_window: 10m, refuse_repeats: true}
  - {method: POST, path: /top-ups, repeat_window: "off"}
  - {method: POST, path: /charges}
`))
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, rs[0].RepeatWindow)
	require.True(t, rs[0].RefuseRepeats)
	require.Negative(t, rs[1].RepeatWindow, "off")
	require.False(t, rs[1].RefuseRepeats)
	require.Zero(t, rs[2].RepeatWindow, "the gateway's")

	for bad, says := range map[string]string{
		"repeat_window: soon":   "route 1: repeat_window",
		"repeat_window: -1m":    "route 1: repeat_window",
		"refuse_repeats: maybe": "line 2: cannot unmarshal",
	} {
		_, err := gateway.ReadRoutes(strings.NewReader("routes:\n  - {method: POST, path: /orders, " + bad + "}\n"))
		require.ErrorContains(t, err, says, bad)
	}
}
