package provider_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/provider"
)

// TestListen runs the sandbox as Oncekey's serve does when no provider URL
// is configured, and stops it while a timeout fault holds an answer: the
// held answer is dropped rather than holding up the shutdown.
func TestListen(t *testing.T) {
	t.Parallel()
	srv := provider.NewServer(provider.NewMemoryStore(), provider.Faults{TimeoutRate: 1}, nil)
	url, stop, err := provider.Listen(t.Context(), "127.0.0.1:0", srv, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = stop(context.Background()) })
	require.NotContains(t, url, ":0", "the URL has the real port: %s", url)

	c := provider.NewClient(url, nil) // 10s: longer than the test waits
	held := make(chan error, 1)
	go func() {
		_, err := c.Charge(context.Background(), "key", rub("pay"))
		held <- err
	}()
	require.Eventually(t, func() bool { return srv.Stats().Faults.Timeout == 1 }, 5*time.Second, 10*time.Millisecond,
		"the charge should be made and its answer held")

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	start := time.Now()
	require.NoError(t, stop(ctx), "a graceful stop despite the held answer")
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, <-held, provider.ErrUnavailable, "the held answer is dropped, never sent")
	require.NoError(t, stop(ctx), "stop again is harmless")

	_, _, err = provider.Listen(t.Context(), "127.0.0.1:-1", srv, nil)
	require.Error(t, err, "a bad address is reported")
}
