package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/servicetest"
)

// readmeExample is a command block of README.md and the response printed
// under it.
type readmeExample struct {
	command  string
	response string
}

var exampleRe = regexp.MustCompile("(?s)<!-- readme-test: example -->\\s*```sh\\n(.*?)```\\s*```http\\n(.*?)```")

// TestReadmeExamples runs the README's curl examples against `oncekey serve`
// on the in-memory store, as `make run` starts it, and checks that each
// answer matches what the README prints: the status line, every printed
// header, and the body (ignoring the id and created_at that differ per run,
// but checking that the replay has the first response's id).
func TestReadmeExamples(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("curl is needed to run the README examples: %v", err)
	}
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	var examples []readmeExample
	for _, m := range exampleRe.FindAllStringSubmatch(string(readme), -1) {
		examples = append(examples, readmeExample{command: m[1], response: m[2]})
	}
	require.Len(t, examples, 3, "README.md should have three marked curl examples")

	addr, _ := startServe(t, map[string]string{"ONCEKEY_DEMO_API_KEY": "ok_try_me"})

	var firstID string
	for i, ex := range examples {
		cmd := strings.ReplaceAll(ex.command, "http://localhost:8080", "http://"+addr)
		out, err := exec.Command("bash", "-c", cmd).Output()
		require.NoError(t, err, "example %d: %s", i+1, cmd)
		got := parseHTTP(t, string(out))
		want := parseHTTP(t, ex.response)

		require.Equal(t, want.status, got.status, "example %d status", i+1)
		for name, value := range want.header {
			switch name {
			case "Location":
				require.True(t, strings.HasPrefix(got.header[name], "/orders/"), "example %d: Location %q", i+1, got.header[name])
			default:
				require.Equal(t, value, got.header[name], "example %d: header %s", i+1, name)
			}
		}
		var wantBody, gotBody map[string]any
		require.NoError(t, json.Unmarshal([]byte(want.body), &wantBody), "example %d: README body", i+1)
		require.NoError(t, json.Unmarshal([]byte(got.body), &gotBody), "example %d: server body %s", i+1, got.body)
		if id, ok := gotBody["id"].(string); ok {
			if firstID == "" {
				firstID = id
			}
			require.Equal(t, firstID, id, "example %d: the retry must return the first order", i+1)
			require.Equal(t, "/orders/"+id, got.header["Location"])
		}
		for _, volatile := range []string{"id", "created_at"} {
			delete(wantBody, volatile)
			delete(gotBody, volatile)
		}
		require.Equal(t, wantBody, gotBody, "example %d body", i+1)
	}
}

type httpMessage struct {
	status string
	header map[string]string
	body   string
}

// parseHTTP splits `curl -si` output (or the README's rendering of it).
func parseHTTP(t *testing.T, s string) httpMessage {
	t.Helper()
	s = strings.ReplaceAll(s, "\r\n", "\n")
	head, body, ok := strings.Cut(s, "\n\n")
	require.True(t, ok, "no blank line between head and body in %q", s)
	lines := strings.Split(head, "\n")
	m := httpMessage{status: lines[0], header: map[string]string{}, body: strings.TrimSpace(body)}
	for _, line := range lines[1:] {
		name, value, ok := strings.Cut(line, ":")
		require.True(t, ok, "bad header line %q", line)
		m.header[http.CanonicalHeaderKey(name)] = strings.TrimSpace(value)
	}
	return m
}

// startServe runs `oncekey serve` in-process on a free loopback port with
// env and returns its address once it answers /healthz, and a function that
// sends the shutdown signal and returns serve's result. Cleanup shuts it down
// if the test did not.
func startServe(t *testing.T, env map[string]string) (addr string, shutdown func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr = ln.Addr().String()
	require.NoError(t, ln.Close())

	env["ONCEKEY_ADDR"] = addr
	getenv := func(k string) string { return env[k] }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stdout, stderr servicetest.SyncBuffer
	go func() {
		done <- run(ctx, []string{"serve"}, getenv, strings.NewReader(""), &stdout, &stderr)
	}()
	var once sync.Once
	var result error
	shutdown = func() error {
		once.Do(func() {
			cancel() // what SIGTERM does through signal.NotifyContext
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				result = errors.New("serve did not shut down within 30s")
			}
		})
		return result
	}
	t.Cleanup(func() {
		require.NoError(t, shutdown(), "serve should shut down cleanly")
		if t.Failed() {
			t.Logf("serve's log:\n%s", stderr.String())
		}
	})

	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return addr, shutdown
		}
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not answer on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var paymentFlowRe = regexp.MustCompile("(?s)<!-- readme-test: payment-flow -->\\s*```sh\\n(.*?)```")

// TestReadmePaymentFlow runs the README's payment walk-through as printed
// against `oncekey serve` on the in-memory default (the sandbox provider
// in-process) and checks what each step prints: 202 with the pending
// payment, the final payment from polling, 200 with it on the retry.
func TestReadmePaymentFlow(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := paymentFlowRe.FindStringSubmatch(string(readme))
	require.NotNil(t, m, "README.md should have the marked payment flow")

	addr, _ := startServe(t, map[string]string{"ONCEKEY_DEMO_API_KEY": "ok_try_me"})
	script := strings.ReplaceAll(m[1], "http://localhost:8080", "http://"+addr)
	cmd := exec.Command("bash", "-c", "set -eo pipefail\n"+script)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the payment flow failed:\n%s", out)
	text := strings.ReplaceAll(string(out), "\r\n", "\n")

	accepted, rest, ok := strings.Cut(text, "\n\n")
	require.True(t, ok, "no response head in:\n%s", text)
	require.True(t, strings.HasPrefix(accepted, "HTTP/1.1 202 Accepted"), "step 1 answers 202:\n%s", text)
	require.Regexp(t, `(?m)^Location: /payments/[0-9a-f-]{36}$`, accepted)
	require.Regexp(t, `(?m)^Retry-After: 1$`, accepted)
	require.Contains(t, rest, `"status":"pending"`, "step 1's body is the pending payment")

	before, retry, ok := strings.Cut(rest, "HTTP/1.1 200 OK")
	require.True(t, ok, "step 3 answers 200:\n%s", text)
	retry = "HTTP/1.1 200 OK" + retry
	lines := strings.Split(strings.TrimSpace(before), "\n")
	polled := strings.TrimSpace(lines[len(lines)-1])
	require.Contains(t, polled, `"status":"succeeded"`, "step 2 ends with the final payment:\n%s", text)
	require.Regexp(t, `(?m)^Idempotent-Replayed: true$`, retry)
	_, retryBody, _ := strings.Cut(retry, "\n\n")
	require.Equal(t, polled, strings.TrimSpace(retryBody), "the retry answers with the final payment, as GET shows it")
}
