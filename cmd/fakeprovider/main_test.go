package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// waitListening reads lines from r until "listening on URL" and returns
// the URL. It keeps draining r afterwards, so the writer never blocks.
func waitListening(t *testing.T, r io.Reader) string {
	t.Helper()
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sent := false
		for sc.Scan() {
			if url, ok := strings.CutPrefix(sc.Text(), "listening on "); ok && !sent {
				found <- url
				sent = true
			}
		}
		if !sent {
			close(found)
		}
	}()
	select {
	case url, ok := <-found:
		require.True(t, ok, "the output ended without a listening line")
		require.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), "url %q", url)
		require.NotEqual(t, "http://127.0.0.1:0", url, "the real port, not the one asked for")
		return url
	case <-time.After(15 * time.Second):
		require.FailNow(t, "no listening line within 15s")
		return ""
	}
}

// TestBinary builds the command and runs it as an operator would. The
// subtests share the binary; they run in parallel and the parent's
// TempDir outlives them.
func TestBinary(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "fakeprovider")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	start := func(t *testing.T, env []string, args ...string) (*exec.Cmd, string, *bytes.Buffer) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			if cmd.ProcessState == nil { // the test failed before stopping it
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		})
		return cmd, waitListening(t, stdout), &stderr
	}

	chargeRefundThenTerminate := func(t *testing.T, env []string) {
		t.Helper()
		cmd, url, stderr := start(t, env, "-addr", "127.0.0.1:0")
		client := provider.NewClient(url, nil)
		key, ref := "cmd-"+time.Now().Format(time.RFC3339Nano), "pay-cmd"
		ch, err := client.Charge(t.Context(), key, provider.ChargeRequest{Amount: 1200, Currency: "RUB", Reference: ref})
		require.NoError(t, err, "charge through the command")
		require.Equal(t, provider.StatusSucceeded, ch.Status)
		list, err := client.ChargesByReference(t.Context(), ref)
		require.NoError(t, err)
		require.Contains(t, list, ch)
		re, err := client.Refund(t.Context(), key, provider.RefundRequest{ChargeID: ch.ID, Amount: 1200, Reference: ref})
		require.NoError(t, err, "refund through the command")
		require.Equal(t, provider.StatusSucceeded, re.Status)
		_, err = client.Refund(t.Context(), key+"-again", provider.RefundRequest{ChargeID: ch.ID, Amount: 1, Reference: ref})
		require.ErrorIs(t, err, provider.ErrRefundExceedsCharge, "the charge is refunded in full")
		refunds, err := client.RefundsByReference(t.Context(), ref)
		require.NoError(t, err)
		require.Contains(t, refunds, re)

		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, cmd.Wait(), "SIGTERM is a clean exit; stderr: %s", stderr)
		require.Contains(t, stderr.String(), "fakeprovider shutting down")
	}

	t.Run("memory store, charge, refund, SIGTERM", func(t *testing.T) {
		t.Parallel()
		chargeRefundThenTerminate(t, nil)
	})

	t.Run("PostgreSQL store from the environment", func(t *testing.T) {
		t.Parallel()
		chargeRefundThenTerminate(t, []string{"FAKEPROVIDER_DATABASE_URL=" + testdb.URL(t)})
	})

	t.Run("a bad rate exits non-zero with a message", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name string
			env  []string
			args []string
			want string
		}{
			{"flag out of range", nil, []string{"-fail-rate", "1.5"}, "fail rate 1.5 is outside [0, 1]"},
			{"flag not a number", nil, []string{"-decline-rate", "half"}, `invalid value "half" for flag -decline-rate`},
			{"env out of range", []string{"FAKEPROVIDER_TIMEOUT_RATE=2"}, nil, "FAKEPROVIDER_TIMEOUT_RATE"},
		}
		for _, tt := range tests {
			cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, tt.args...)...)
			cmd.Env = append(os.Environ(), tt.env...)
			out, err := cmd.CombinedOutput()
			var exitErr *exec.ExitError
			require.ErrorAs(t, err, &exitErr, "%s: the command must fail; output %s", tt.name, out)
			require.NotZero(t, exitErr.ExitCode(), tt.name)
			require.Contains(t, string(out), tt.want, tt.name)
			require.NotContains(t, string(out), "listening on", "%s: nothing is served", tt.name)
		}
	})
}

// TestFlagErrors covers the command line in-process: every malformed or
// out-of-range setting is an error naming it, before anything listens.
func TestFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"fail rate above one", nil, []string{"-fail-rate", "1.01"}, "fail rate"},
		{"negative timeout rate", nil, []string{"-timeout-rate=-0.5"}, "timeout rate"},
		{"decline rate not a number", nil, []string{"-decline-rate", "x"}, "-decline-rate"},
		{"negative latency", nil, []string{"-latency", "-1s"}, "latency"},
		{"hold without a unit", nil, []string{"-timeout-hold", "30"}, "-timeout-hold"},
		{"seed not an integer", nil, []string{"-seed", "abc"}, "-seed"},
		{"unknown flag", nil, []string{"-rate", "1"}, "-rate"},
		{"stray argument", nil, []string{"serve"}, "unexpected arguments"},
		{"malformed env", map[string]string{"FAKEPROVIDER_LATENCY": "soon"}, nil, "FAKEPROVIDER_LATENCY"},
		{"env rate out of range", map[string]string{"FAKEPROVIDER_DECLINE_RATE": "7"}, nil, "FAKEPROVIDER_DECLINE_RATE"},
		{"bad address", nil, []string{"-addr", "127.0.0.1:-1"}, "listen"},
		{"bad database URL", nil, []string{"-addr", "127.0.0.1:0", "-database-url", "postgres://%zz"}, "database URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tt.args, func(k string) string { return tt.env[k] }, &stdout, &stderr)
			require.Error(t, err)
			require.Contains(t, err.Error()+stderr.String(), tt.want)
			require.NotContains(t, stdout.String(), "listening on")
		})
	}
}

// TestFlagWinsOverEnv sets a fail rate of 1 in the environment: alone it
// fails every charge; with -fail-rate 0 the flag wins and charges succeed.
func TestFlagWinsOverEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"FAKEPROVIDER_FAIL_RATE": "1", "FAKEPROVIDER_ADDR": "127.0.0.1:0"}
	tests := []struct {
		name    string
		args    []string
		wantErr error
	}{
		{"env alone", nil, provider.ErrUnavailable},
		{"flag over env", []string{"-fail-rate", "0"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			stdoutR, stdoutW := io.Pipe()
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, tt.args, func(k string) string { return env[k] }, stdoutW, io.Discard)
				stdoutW.Close()
			}()
			stopped := sync.OnceValue(func() error { cancel(); return <-done })
			t.Cleanup(func() { _ = stopped() })
			url := waitListening(t, stdoutR)

			_, err := provider.NewClient(url, nil).Charge(t.Context(), "key", provider.ChargeRequest{Amount: 1, Currency: "RUB", Reference: "p"})
			if tt.wantErr == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tt.wantErr)
			}
			require.NoError(t, stopped(), "run returns cleanly once its context ends")
		})
	}
}

func TestHelpIsNoError(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	err := run(t.Context(), []string{"-h"}, func(string) string { return "" }, io.Discard, &stderr)
	require.ErrorIs(t, err, flag.ErrHelp, "main exits 0 on -h")
	for _, name := range []string{"-addr", "-database-url", "-fail-rate", "-timeout-rate", "-timeout-hold", "-latency", "-decline-rate", "-seed", "FAKEPROVIDER_ADDR"} {
		require.Contains(t, stderr.String(), name, "the usage documents %s", name)
	}
	require.Contains(t, stderr.String(), "new charges and refunds declined", "the usage says the faults apply to refunds too")
}
