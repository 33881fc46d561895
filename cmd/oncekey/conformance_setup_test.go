package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// runConformanceProcess runs `oncekey conformance args…` as a process of
// its own (the test binary, see runSubprocess), and returns its exit code
// and what it wrote.
func runConformanceProcess(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--", "conformance"}, args...)...)
	cmd.Env = append(freshEnvironment(), subprocessEnv+"=cli")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run oncekey conformance: %v", err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// deadAddress is a loopback address nothing listens on: a listener's,
// closed.
func deadAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// silentAddress is a loopback address that takes connections (the
// kernel's backlog does) and never answers: nothing accepts them.
func silentAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// quietServer is an httptest server whose own log (a refused TLS
// handshake) stays out of the test's output; tls starts it with TLS, on
// httptest's certificate, which no client trusts.
func quietServer(t *testing.T, tls bool, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// `oncekey conformance` exits 2, with one line on standard error that
// names the problem and no report, when the run cannot start: nothing
// answers at --url, TLS fails there, the document or the overrides cannot
// be read or loaded, or no operation is under the protocol. 1 stays a
// broken promise alone (TestConformanceExitCodes), so that CI can trust
// it. --plan sends nothing, so a dead --url does not stop it.
func TestConformanceSetupErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
		return path
	}
	spec := write("things.yaml", thingsSpec)
	garbage := write("garbage.yaml", "paths: [1, 2\n  post: }\n")
	notOpenAPI := write("notopenapi.yaml", "name: a list of things\nthings: [1, 2]\n")
	// thingsSpec without its Idempotency-Key parameters.
	uncovered := write("uncovered.yaml", strings.NewReplacer(
		"      parameters: [{$ref: '#/components/parameters/Key'}]\n", "",
		"        - {$ref: '#/components/parameters/Key'}\n", "").Replace(thingsSpec))
	missing := filepath.Join(dir, "missing.yaml")
	live := quietServer(t, false, http.HandlerFunc(brokenThings))
	untrusted := quietServer(t, true, http.HandlerFunc(brokenThings))
	dead, silent := deadAddress(t), silentAddress(t)
	plainAddr := strings.TrimPrefix(live.URL, "http://")

	tests := []struct {
		name string
		args []string
		line string // the line on standard error, a regular expression
	}{
		{"nothing listens", []string{"--spec", spec, "--url", "http://" + dead},
			`nothing answers at http://` + regexp.QuoteMeta(dead) + `: dial tcp ` + regexp.QuoteMeta(dead) + `: connect: connection refused`},
		{"nothing answers", []string{"--spec", spec, "--url", "http://" + silent, "--timeout", "300ms"},
			`nothing answers at http://` + regexp.QuoteMeta(silent) + ` within 300ms \(--timeout\): .*Client.Timeout exceeded`},
		{"https to plain HTTP", []string{"--spec", spec, "--url", "https://" + plainAddr},
			`TLS fails at https://` + regexp.QuoteMeta(plainAddr) + `: http: server gave HTTP response to HTTPS client`},
		{"a certificate not trusted", []string{"--spec", spec, "--url", untrusted.URL},
			`TLS fails at ` + regexp.QuoteMeta(untrusted.URL) + `: tls: failed to verify certificate: x509: certificate signed by unknown authority`},
		{"no such document", []string{"--spec", missing, "--url", live.URL},
			`--spec ` + regexp.QuoteMeta(missing) + `: no such file or directory`},
		{"a document that is not YAML", []string{"--spec", garbage, "--url", live.URL},
			`--spec ` + regexp.QuoteMeta(garbage) + `: yaml: line 1: did not find expected ',' or ']'`},
		{"a document that is not OpenAPI", []string{"--spec", notOpenAPI, "--url", live.URL},
			`--spec ` + regexp.QuoteMeta(notOpenAPI) + `: not an OpenAPI document: it has no openapi field`},
		{"no operation covered", []string{"--spec", uncovered, "--url", live.URL},
			regexp.QuoteMeta(`no operation of the spec declares an Idempotency-Key header parameter (or a header whose name ends so) or x-idempotency; for a document that declares none, say where the key goes with --key-header or --key-field`)},
		{"no operation covered, planned", []string{"--spec", uncovered, "--plan"},
			regexp.QuoteMeta(`no operation of the spec declares an Idempotency-Key header parameter (or a header whose name ends so) or x-idempotency; for a document that declares none, say where the key goes with --key-header or --key-field`)},
		{"no such overrides file", []string{"--spec", spec, "--overrides", missing, "--url", live.URL},
			`--overrides ` + regexp.QuoteMeta(missing) + `: no such file or directory`},
		{"overrides naming no operation", []string{"--spec", spec, "--overrides", write("overrides.yaml", "operations:\n  POST /nothing: {}\n"), "--url", live.URL},
			`the overrides name "POST /nothing", which the spec has no operation for`},
		{"a URL that is no URL", []string{"--spec", spec, "--url", plainAddr},
			`--url ` + regexp.QuoteMeta(plainAddr) + `: want an http:// or https:// URL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runConformanceProcess(t, append(tt.args, "--auth", "Bearer x")...)
			require.Equal(t, 2, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			require.Empty(t, stdout, "no report")
			require.Equal(t, 1, strings.Count(stderr, "\n"), "one line:\n%s", stderr)
			require.Regexp(t, `^oncekey: (conformance: )?`+tt.line, stderr)
		})
	}

	t.Run("a plan against a dead URL", func(t *testing.T) {
		t.Parallel()
		code, stdout, stderr := runConformanceProcess(t, "--spec", spec, "--plan", "--url", "http://"+dead)
		require.Equal(t, 0, code, "--plan sends nothing:\n%s\n%s", stdout, stderr)
		require.Contains(t, stdout, "POST /things")
	})
}

// A run whose every check passes or is skipped exits 0, as a process:
// against `oncekey serve`, the checks of one operation.
func TestConformancePassingRunExitsZero(t *testing.T) {
	t.Parallel()
	addr, _ := startServe(t, map[string]string{})
	code, stdout, stderr := runConformanceProcess(t, "--spec", "../../openapi.yaml", "--overrides", "../../api/conformance.yaml",
		"--url", "http://"+addr, "--auth", "Bearer "+DemoAPIKey, "--only", "createOrder")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Regexp(t, `(?m)^pass +replay +POST /orders`, stdout)
	require.Regexp(t, `\d+ passed, 0 failed, \d+ skipped, 0 errors\n$`, stdout)
}
