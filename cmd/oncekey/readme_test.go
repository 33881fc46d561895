package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/servicetest"
)

// readmeExample is a marked command block of README.md or docs/service.md
// and the response printed under it.
type readmeExample struct {
	command  string
	response string
}

var exampleRe = regexp.MustCompile("(?s)<!-- readme-test: example -->\\s*```sh\\n(.*?)```\\s*```http\\n(.*?)```")

// readmeURL is where the README's examples send their requests: where
// `make run` serves.
const readmeURL = "http://127.0.0.1:8080"

// TestReadmeExamples runs the curl examples of the README (the first order)
// and of docs/service.md (its retry, the same key with another request), in
// that order, against one `oncekey serve` on the in-memory store, as `make
// run` starts it, and checks that each answer matches what the docs print:
// the status line, every printed header, and the body (ignoring the id and
// created_at that differ per run, but checking that the replay has the first
// response's id).
func TestReadmeExamples(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("curl is needed to run the README examples: %v", err)
	}
	var examples []readmeExample
	for _, doc := range []struct {
		path string
		n    int
	}{{"../../README.md", 1}, {"../../docs/service.md", 2}} {
		text, err := os.ReadFile(doc.path)
		require.NoError(t, err)
		found := exampleRe.FindAllStringSubmatch(string(text), -1)
		require.Len(t, found, doc.n, "%s's marked curl examples", doc.path)
		for _, m := range found {
			examples = append(examples, readmeExample{command: m[1], response: m[2]})
		}
	}

	addr, _ := startServe(t, map[string]string{}) // the demo key as make run has it

	var firstID string
	for i, ex := range examples {
		cmd := strings.ReplaceAll(ex.command, readmeURL, "http://"+addr)
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
		require.NoError(t, json.Unmarshal([]byte(want.body), &wantBody), "example %d: the documented body", i+1)
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

// freeAddr is a loopback address with a port free a moment ago, for a
// server of a test to listen on.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// freeAddrs is n distinct loopback addresses free a moment ago. Every
// listener stays open until all n are chosen: closed one at a time, the
// kernel may hand the same port out twice.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// startServe runs `oncekey serve` in-process on a free loopback port with
// env and returns its address once it answers /healthz, and a function that
// sends the shutdown signal and returns serve's result. Cleanup shuts it down
// if the test did not.
func startServe(t *testing.T, env map[string]string) (addr string, shutdown func() error) {
	t.Helper()
	return startCommand(t, env, "serve")
}

// startCommand is startServe for any command that serves HTTP on
// ONCEKEY_ADDR (serve, proxy): it is up once GET /healthz gets an answer,
// whatever it is.
func startCommand(t *testing.T, env map[string]string, args ...string) (addr string, shutdown func() error) {
	t.Helper()
	env = servePool(env)
	env["ONCEKEY_ADDR"] = "127.0.0.1:0" // the port it binds is in its log: see startListening
	getenv := func(k string) string { return env[k] }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stdout, stderr servicetest.SyncBuffer
	go func() {
		done <- run(ctx, args, getenv, strings.NewReader(""), &stdout, &stderr)
	}()
	var once sync.Once
	var result error
	shutdown = func() error {
		once.Do(func() {
			cancel() // what SIGTERM does through signal.NotifyContext
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				result = fmt.Errorf("%s did not shut down within 30s", args[0])
			}
		})
		return result
	}
	t.Cleanup(func() {
		require.NoError(t, shutdown(), "%s should shut down cleanly", args[0])
		if t.Failed() {
			t.Logf("%s's log:\n%s", args[0], stderr.String())
		}
	})

	// Polled until it listens and answers, or exits.
	deadline := time.Now().Add(30 * time.Second)
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		var err error = errors.New("not listening yet")
		if m := listeningRe.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
			var resp *http.Response
			if resp, err = http.Get("http://" + addr + "/healthz"); err == nil {
				resp.Body.Close()
				return addr, shutdown
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer: %v", args[0], err)
		}
		select {
		case err := <-done:
			t.Fatalf("%s exited: %v", args[0], err)
		case <-poll.C:
		}
	}
}

var scriptRe = regexp.MustCompile("(?s)<!-- readme-test: script -->\\s*```sh\\n(.*?)```\\s*prints[^\\n]*\\n\\s*```text\\n(.*?)```")

// TestReadmeScripts runs each of docs/service.md's marked scripts (order
// changes, the payment flow, refunds, the bonus ledger) as printed against
// `oncekey serve` on the in-memory default, as `make run` starts it (the
// sandbox provider in-process), and compares what it prints with the output
// the page shows under it. Only ids, times, Date and Content-Length may differ, and
// an id or time repeated in the README must be repeated in the output: the
// retry's payment is the polled one.
func TestReadmeScripts(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/service.md")
	require.NoError(t, err)
	scripts := scriptRe.FindAllStringSubmatch(string(doc), -1)
	require.Len(t, scripts, 4, "docs/service.md should have four marked scripts with their output: order changes, payments, refunds and the bonus ledger")
	for i, m := range scripts {
		t.Run(fmt.Sprint(i+1), func(t *testing.T) {
			t.Parallel()
			addr, _ := startServe(t, map[string]string{})
			script := strings.ReplaceAll(m[1], readmeURL, "http://"+addr)
			out, err := exec.Command("bash", "-c", "set -eo pipefail\n"+script).CombinedOutput()
			require.NoError(t, err, "the script failed:\n%s", out)
			require.Equal(t, normalize(m[2]), normalize(string(out)), "what script %d prints, against docs/service.md (ids and times numbered by first appearance)", i+1)
		})
	}
}

var (
	uuidRe = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timeRe = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	dateRe = regexp.MustCompile(`(?m)^(Date|Content-Length): .*$`)
)

// normalize makes output comparable across runs: line endings, Date and
// Content-Length values, and every id and time replaced by its number of
// first appearance, so that the text keeps which of them are the same.
func normalize(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = dateRe.ReplaceAllString(s, "$1: …")
	for _, re := range []*regexp.Regexp{uuidRe, timeRe} {
		seen := map[string]int{}
		s = re.ReplaceAllStringFunc(s, func(v string) string {
			if _, ok := seen[v]; !ok {
				seen[v] = len(seen) + 1
			}
			return fmt.Sprintf("<%d>", seen[v])
		})
	}
	return strings.TrimSpace(s)
}

// The README's quick start and `make help` say the same about what `make
// test` needs.
func TestReadmeAndMakeHelpAgreeOnWhatTestNeeds(t *testing.T) {
	t.Parallel()
	needs := regexp.MustCompile(`\(needs ([^)]*)\)`)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	quick := quickStartRe.FindStringSubmatch(string(readme))
	require.NotNil(t, quick)
	inReadme := needs.FindStringSubmatch(quick[1])
	require.NotNil(t, inReadme, "the quick start says what make test needs")
	makefile, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	target := regexp.MustCompile(`(?m)^test: ## .*$`).Find(makefile)
	require.NotNil(t, target)
	inMakefile := needs.FindStringSubmatch(string(target))
	require.NotNil(t, inMakefile, "make help says what make test needs")
	require.Equal(t, inReadme[1], inMakefile[1])

	// Every Debian package tools/preflight.sh names is in the README's
	// apt-get lines: what the preflight asks for, the README listed first.
	section, _, _ := strings.Cut(string(readme)[strings.Index(string(readme), "## Quick start"):], "\n## Start here")
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`apt-get install ([a-z0-9 .+-]+)`).FindAllStringSubmatch(section, -1) {
		for _, pkg := range strings.Fields(m[1]) {
			listed[pkg] = true
		}
	}
	preflight, err := os.ReadFile("../../tools/preflight.sh")
	require.NoError(t, err)
	checks := regexp.MustCompile(`(?m)^(?:need [a-z0-9-]+ ([a-z0-9-]+)|step_needs \S+ [a-z0-9-]+ "?([a-z0-9 -]+)"?)`).FindAllStringSubmatch(string(preflight), -1)
	require.NotEmpty(t, checks, "tools/preflight.sh checks programs")
	for _, m := range checks {
		for _, pkg := range strings.Fields(m[1] + " " + m[2]) {
			require.True(t, listed[pkg], "the README's quick start lists the Debian package %s, which tools/preflight.sh asks for", pkg)
		}
	}
}

var conformanceRe = regexp.MustCompile("(?s)<!-- readme-test: conformance -->\\s*```sh\\n(.*?)```\\s*```text\\n(.*?)```")

// TestReadmeConformance runs the README's `oncekey conformance` example
// against `oncekey serve` as `make run` starts it and checks that it prints
// exactly what the README shows.
func TestReadmeConformance(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := conformanceRe.FindStringSubmatch(string(readme))
	require.NotNil(t, m, "README.md should have a marked conformance example")
	command, want := unindent(m[1]), unindent(m[2])

	args := shellWords(t, strings.ReplaceAll(command, "\\\n", " "))
	require.Equal(t, []string{"bin/oncekey", "conformance"}, args[:2], "the example runs bin/oncekey conformance")
	addr, _ := startServe(t, map[string]string{})
	for i, a := range args {
		switch a {
		case readmeURL:
			args[i] = "http://" + addr
		case "openapi.yaml", "api/conformance.yaml":
			args[i] = "../../" + a // the README runs from the repository's root
		}
	}
	got, err := runCommand(t, map[string]string{}, args[1:]...)
	require.NoError(t, err, got)
	require.Equal(t, want, got, "the README's conformance output")
}

// unindent removes the indentation every line of a README block has (the
// blocks of a list item are indented).
func unindent(block string) string {
	lines := strings.Split(block, "\n")
	indent := len(lines[0]) - len(strings.TrimLeft(lines[0], " "))
	for i, l := range lines {
		lines[i] = l[min(indent, len(l)-len(strings.TrimLeft(l, " "))):]
	}
	return strings.Join(lines, "\n")
}

// shellWords splits a command line as the shell would for the README's
// examples: words separated by blanks, double quotes grouping.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var word strings.Builder
	quoted, inWord := false, false
	for _, r := range strings.TrimSpace(line) {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\n') && !quoted:
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	require.False(t, quoted, "unbalanced quotes in %q", line)
	if inWord {
		words = append(words, word.String())
	}
	return words
}

var gatewayQuickStartRe = regexp.MustCompile("(?s)<!-- gateway-test: quickstart -->\\s*```sh\\n(.*?)```\\s*prints[^\\n]*\\n\\s*```text\\n(.*?)```")

// TestGatewayQuickStart runs docs/gateway.md's quick start byte for byte,
// from the repository's root, on free ports (the block reads them from
// UPSTREAM_PORT and GATEWAY_PORT), and compares what it prints. It must end
// on its own within its bounded waits, and leave nothing running.
func TestGatewayQuickStart(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/gateway.md")
	require.NoError(t, err)
	m := gatewayQuickStartRe.FindStringSubmatch(string(doc))
	require.NotNil(t, m, "docs/gateway.md has its marked quick start, with what it prints")
	addrs := freeAddrs(t, 2)
	_, upstreamPort, _ := net.SplitHostPort(addrs[0])
	_, gatewayPort, _ := net.SplitHostPort(addrs[1])
	out, stderr, err := runQuickStart(t, m[1], "UPSTREAM_PORT="+upstreamPort, "GATEWAY_PORT="+gatewayPort)
	require.NoError(t, err, "the quick start failed:\n%s\nstderr:\n%s", out, stderr)
	require.Equal(t, strings.TrimSpace(m[2]), strings.TrimSpace(out), "what the quick start prints")
}

// TestGatewayQuickStartFailsFast: with its gateway's port held by a
// server that is not a gateway (what `make run` on 8080 was to the old quick
// start), the quick start fails within its bounded wait, says why, and
// leaves neither the upstream nor the gateway running.
func TestGatewayQuickStartFailsFast(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/gateway.md")
	require.NoError(t, err)
	m := gatewayQuickStartRe.FindStringSubmatch(string(doc))
	require.NotNil(t, m)
	occupied := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(occupied.Close)
	_, gatewayPort, _ := net.SplitHostPort(occupied.Listener.Addr().String())
	_, upstreamPort, _ := net.SplitHostPort(freeAddr(t))
	_, stderr, err := runQuickStart(t, m[1], "UPSTREAM_PORT="+upstreamPort, "GATEWAY_PORT="+gatewayPort)
	require.Error(t, err, "the quick start fails, within its bounded waits")
	// Whichever comes first: the gateway's failure to listen, or the
	// wait's finding that what answers there is not the gateway.
	require.Regexp(t, `address already in use|returned error: 404`, stderr, "the error is shown")
	// Nothing it started is left listening on the upstream's port.
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+upstreamPort, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 5*time.Second, 50*time.Millisecond, "the upstream was stopped")
}

// runQuickStart runs script with bash from the repository's root, with env
// added, and returns its stdout and stderr once it has ended and nothing it
// started is still running.
func runQuickStart(t *testing.T, script string, env ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = "../.."
	cmd.Env = append(freshEnvironment(), env...)
	// Its own process group, so that the test can tell whether it left
	// anything behind, and end it if it did.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errs servicetest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	// Wait returns soon after bash exits even if something it left behind
	// still holds its output; the check below then reports it.
	cmd.WaitDelay = 2 * time.Second
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(5 * time.Minute): // make build may take minutes on a busy machine
		t.Fatalf("the quick start did not end within 5 minutes:\n%s\nstderr:\n%s", out.String(), errs.String())
	}
	require.Eventually(t, func() bool { return syscall.Kill(-cmd.Process.Pid, 0) == syscall.ESRCH }, 10*time.Second, 20*time.Millisecond,
		"the quick start left processes running:\n%s", errs.String())
	return out.String(), errs.String(), err
}
