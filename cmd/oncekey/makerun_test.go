package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/servicetest"
)

// quickStartRe is the README's quick start: its first command block.
var quickStartRe = regexp.MustCompile("(?s)## Quick start.*?```sh\\n(.*?)```")

// TestMakeRun does what the README's quick start says on a fresh machine:
// it runs the quick start's `make run` line as printed, in the repository's
// root, with none of the service's variables set but its address; then the
// README's first example, and the curl line make run printed; then Ctrl-C
// (SIGINT to the foreground process group, as a terminal sends it). make
// must end without an error message, serve having shut down cleanly. It
// serves on a free port (ONCEKEY_ADDR, which serve reads) and sends the
// README's example there, not to the README's 127.0.0.1:8080: a make run of
// the reader's own may be serving there while make test runs.
func TestMakeRun(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	quick := quickStartRe.FindStringSubmatch(string(readme))
	require.NotNil(t, quick, "the README has a quick start with a command block")
	var line string
	for l := range strings.Lines(quick[1]) {
		if strings.HasPrefix(l, "make run") {
			line = strings.TrimSpace(l)
		}
	}
	require.NotEmpty(t, line, "the quick start says make run")
	examples := exampleRe.FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, examples)
	first := readmeExample{command: examples[0][1], response: examples[0][2]}

	addr := freeAddr(t)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // a cold build included
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir = "../.."
	cmd.Env = append(freshEnvironment(), "ONCEKEY_ADDR="+addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's foreground job
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr servicetest.SyncBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	var printed strings.Builder
	tryIt := make(chan string, 1)
	go func() {
		// Everything make run prints, until it prints the curl line to paste.
		var pasted strings.Builder
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			printed.WriteString(scanner.Text() + "\n")
			switch l := scanner.Text(); {
			case strings.HasPrefix(l, "  curl "):
				pasted.WriteString(strings.TrimSuffix(strings.TrimPrefix(l, "  "), "\\") + " ")
			case pasted.Len() > 0 && strings.HasPrefix(l, "    "):
				pasted.WriteString(strings.TrimSpace(l))
				tryIt <- pasted.String()
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

	var pasted string
	select {
	case pasted = <-tryIt:
	case err := <-exited:
		t.Fatalf("make run exited before serving: %v\n%s%s", err, printed.String(), stderr.String())
	case <-ctx.Done():
		t.Fatalf("make run printed no curl line:\n%s%s", printed.String(), stderr.String())
	}

	out, err := exec.Command("bash", "-c", strings.ReplaceAll(first.command, readmeURL, "http://"+addr)).Output()
	require.NoError(t, err, "the README's first example, sent to make run's address")
	got, want := parseHTTP(t, string(out)), parseHTTP(t, first.response)
	require.Equal(t, want.status, got.status, "the README's first example after make run:\n%s", out)
	require.Equal(t, want.header["Idempotency-Key"], got.header["Idempotency-Key"])

	out, err = exec.Command("bash", "-c", pasted).Output()
	require.NoError(t, err, "the line make run printed: %s", pasted)
	require.True(t, strings.HasPrefix(string(out), "HTTP/1.1 201 Created"), "the pasted line creates an order:\n%s", out)

	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGINT), "Ctrl-C")
	select {
	case err = <-exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("make run did not stop within 15s of Ctrl-C:\n%s", stderr.String())
	}
	var exit *exec.ExitError
	if err != nil {
		// make ends as its SIGINT asks; a shell prints nothing for that.
		require.ErrorAs(t, err, &exit)
		status := exit.Sys().(syscall.WaitStatus)
		require.True(t, status.Signaled() && status.Signal() == syscall.SIGINT, "make run ended with %v after Ctrl-C:\n%s", err, stderr.String())
	}
	require.NotContains(t, stderr.String(), "make: ***", "make reports a failure")
	require.NotContains(t, stderr.String(), "wait: ", "the shell reports a lost child")
	require.Contains(t, stderr.String(), `"msg":"shut down"`, "serve shut down cleanly")
}

// freshEnvironment is this process's environment without any of the
// service's settings, as in a new user's shell, which has none of what
// an outer make (make test) hands its children either (MAKEFLAGS, with its
// jobserver, and MAKELEVEL).
func freshEnvironment() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "ONCEKEY_") || strings.HasPrefix(name, "IDEMPOTENCY_") ||
			strings.HasPrefix(name, "FAKEPROVIDER_") || name == "DATABASE_URL" || name == "REDIS_URL" ||
			name == "MAKEFLAGS" || name == "MFLAGS" || name == "MAKELEVEL" {
			continue
		}
		env = append(env, kv)
	}
	return env
}
