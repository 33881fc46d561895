// Package redistest gives tests Redis servers: the machine's shared one, a
// redis-server of a test's own that it may flush, pause or kill, and a Redis
// Cluster of its own whose nodes it may kill. Every server it starts listens
// on a free loopback port and is killed when the test ends.
//
// The shared server is REDIS_URL (default redis://127.0.0.1:6379/0). When it
// cannot be reached, the test is skipped, except when CI is set, where it
// fails: a suite that silently skips its Redis tests in CI proves nothing.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/redisstore"
)

// SharedURL is the machine's Redis, on which tests keep apart through keys
// of their own.
func SharedURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// Shared is a client of the machine's Redis, closed when the test ends.
func Shared(t testing.TB) redis.UniversalClient {
	t.Helper()
	rdb, err := redisstore.NewClient(SharedURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Redis is required in CI: %v", err)
		}
		t.Skipf("Redis unavailable (set CI=1 to make this fatal): %v", err)
	}
	return rdb
}

// Server is a redis-server of a test's own, which the test may flush, pause
// (SIGSTOP) or kill through Process.
type Server struct {
	URL     string
	Process *os.Process
}

// Start starts a Server and waits until it answers.
func Start(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	require.NoError(t, cmd.Start(), "redis-server must be installed")
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // a paused server dies too
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitListening(t, fmt.Sprintf("127.0.0.1:%d", port), "redis-server")
	return &Server{URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), Process: cmd.Process}
}

// waitListening waits (up to 5s) until what was started accepts
// connections at addr.
func waitListening(t testing.TB, addr, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "%s on %s", what, addr)
}
