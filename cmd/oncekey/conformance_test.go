package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/redisstore/redistest"
	"github.com/oncekey/oncekey/internal/conformance"
	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// junitReport is what CI systems read of a JUnit XML report.
type junitReport struct {
	XMLName xml.Name `xml:"testsuites"`
	Suites  []struct {
		Name     string `xml:"name,attr"`
		Tests    int    `xml:"tests,attr"`
		Failures int    `xml:"failures,attr"`
		Errors   int    `xml:"errors,attr"`
		Skipped  int    `xml:"skipped,attr"`
		Cases    []struct {
			Name      string `xml:"name,attr"`
			Classname string `xml:"classname,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// failures lists the report's failed and errored cases, one a line: a
// failure message holding the whole report would bury them in a few
// thousand lines.
func (r junitReport) failures() string {
	var b strings.Builder
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			if c.Failure != nil {
				fmt.Fprintf(&b, "%s %s: %s\n", c.Classname, c.Name, c.Failure.Message)
			}
			if c.Error != nil {
				fmt.Fprintf(&b, "%s %s: error: %s\n", c.Classname, c.Name, c.Error.Message)
			}
		}
	}
	return b.String()
}

// TestConformanceCommand runs `oncekey conformance` against `oncekey serve`
// as `make run` starts it: its JUnit report parses, counts what it holds and
// fails (or errs) nothing; the ietf profile (422 for a reused key) fails the
// mismatch checks and exits 1; the JSON report holds what --only selects;
// and contract-test still runs it.
func TestConformanceCommand(t *testing.T) {
	t.Parallel()
	addr, _ := startServe(t, map[string]string{})
	base := []string{"conformance", "--spec", "../../openapi.yaml", "--overrides", "../../api/conformance.yaml",
		"--url", "http://" + addr, "--auth", "Bearer " + DemoAPIKey, "--retention-wait", "200ms"}

	out, err := runCommand(t, map[string]string{}, append(base, "--format", "junit")...)
	var report junitReport
	require.NoError(t, xml.Unmarshal([]byte(out), &report), "a JUnit report (%v): %.2000s", err, out)
	require.NoError(t, err, "failed:\n%s", report.failures())
	require.Len(t, report.Suites, 1)
	suite := report.Suites[0]
	require.Equal(t, len(suite.Cases), suite.Tests)
	require.Zero(t, suite.Failures, "failed:\n%s", report.failures())
	require.Zero(t, suite.Errors, "errors:\n%s", report.failures())
	// other: checks of another media type's canonical form, and those that
	// need the service to fail or answer large on demand, which it cannot.
	skipped, other := 0, 0
	for _, c := range suite.Cases {
		require.Nil(t, c.Failure, "%s %s", c.Name, c.Classname)
		require.Nil(t, c.Error, "%s %s", c.Name, c.Classname)
		if c.Skipped != nil {
			skipped++
			require.NotEmpty(t, c.Skipped.Message, "a skip says why")
			if strings.HasPrefix(c.Skipped.Message, "the operation's body is ") || c.Name == "error-not-stored" || c.Name == "large-answer" {
				other++
			}
		}
	}
	require.Equal(t, skipped, suite.Skipped)
	require.Less(t, skipped-other, (suite.Tests-other)/3, "most checks that apply run: %d of %d skipped", skipped, suite.Tests)

	out, err = runCommand(t, map[string]string{}, append(base, "--profile", "ietf", "--only", "mismatch-request,POST /orders")...)
	require.ErrorContains(t, err, "conformance: 1 of 1 checks failed")
	require.Equal(t, 1, exitCode(err), "a protocol failure exits 1")
	require.Contains(t, out, "fail    mismatch-request  POST /orders")
	require.Contains(t, out, "want 422")

	out, err = runCommand(t, map[string]string{}, append(base, "--format", "json", "--only", "replay,createOrder")...)
	require.NoError(t, err, out)
	var doc struct {
		Profile struct{ Name string }
		Summary struct{ Passed, Failed, Skipped, Errors int }
		Results []struct{ Check, Operation, Status string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, "oncekey", doc.Profile.Name)
	require.Zero(t, doc.Summary.Errors, out)
	require.Equal(t, 1, doc.Summary.Passed, out)
	require.Len(t, doc.Results, 1)
	require.Equal(t, "POST /orders", doc.Results[0].Operation)

	out, err = runCommand(t, map[string]string{}, "contract-test", "--url", "http://"+addr, "--api-key", DemoAPIKey)
	require.NoError(t, err, out)
	require.True(t, strings.HasSuffix(out, "0 failed, 51 skipped, 0 errors\n"), out)

	_, err = runCommand(t, map[string]string{}, append(base, "--only", "no-such-check")...)
	require.ErrorContains(t, err, `--only "no-such-check" is neither a check`)
}

// `oncekey conformance` passes against `oncekey serve` on PostgreSQL whose
// API reads come from a replica that lags (DATABASE_REPLICA_URL), 500 ms
// behind or with its replay paused: the configuration the docs recommend
// for scaling reads keeps every promise, payments and refunds included.
func TestConformanceWithALaggingReplica(t *testing.T) {
	t.Parallel()
	for _, lag := range testdb.Lags {
		t.Run(string(lag), func(t *testing.T) {
			t.Parallel()
			db := testdb.FreshReplicated(t, lag)
			key := strongKey(t)
			addr, _ := startServe(t, map[string]string{
				"DATABASE_URL": db.URL, "DATABASE_REPLICA_URL": db.ReplicaURL, "ONCEKEY_DEMO_API_KEY": key,
				"ONCEKEY_PAYMENT_RETRY_BASE": "50ms",
			})
			passed, skipped := requireConformance(t, "conformance", "--spec", "../../openapi.yaml", "--overrides", "../../api/conformance.yaml",
				"--url", "http://"+addr, "--auth", "Bearer "+key)
			t.Logf("%s replica: %d passed, %d skipped", lag, passed, skipped)
		})
	}
}

// `oncekey conformance` straight against upstream.py, which declares the
// Idempotency-Key protocol and runs every request anyway, fails the checks
// that a duplicate run breaks, and the upstream's own count shows keys run
// more than once: what the gateway in front of it must turn into a pass.
func TestConformanceFailsAgainstAnUpstreamThatRunsEveryRequest(t *testing.T) {
	t.Parallel()
	u := upstreamtest.Start(t)
	out, err := runCommand(t, map[string]string{}, "conformance", "--spec", u.Spec, "--overrides", u.Overrides, "--url", u.URL,
		"--auth", "Bearer test", "--format", "json")
	require.ErrorContains(t, err, "checks failed", out)
	var doc struct {
		Results []struct{ Check, Operation, Status string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	failed := map[string]bool{}
	for _, r := range doc.Results {
		if r.Status == "fail" {
			failed[r.Check] = true
		}
	}
	for _, check := range []string{"key-required", "key-malformed", "replay", "mismatch-request", "canonical-json", "concurrent-once"} {
		require.True(t, failed[check], "check %s should fail straight against upstream.py: %s", check, out)
	}
	_, byKey := u.Executions(t)
	twice := 0
	for key, n := range byKey {
		if key != "" && n > 1 {
			twice++
		}
	}
	require.Positive(t, twice, "keys that upstream.py ran more than once: %v", byKey)
}

// `oncekey conformance` passes against `oncekey proxy` in front of
// upstream.py, which runs every request it gets: on the in-memory keys and
// on PostgreSQL with Redis in front, and every key the checks sent ran at
// most once upstream; error-not-stored and large-answer among them, as the
// upstream fails and answers large on demand.
func TestConformanceThroughTheProxy(t *testing.T) {
	t.Parallel()
	// The proxy's profile each time, and the conformance profile that
	// checks it: the service's answers, which the upstream's document
	// declares (its 202 and 409), and the gateway's default, ietf, for a
	// document that declares its 422 instead of the 202.
	for _, tc := range []struct {
		name    string
		env     func(t *testing.T) map[string]string
		profile string
	}{
		{"memory, ietf", func(*testing.T) map[string]string { return map[string]string{} }, "ietf"},
		{"postgres and redis, oncekey", func(t *testing.T) map[string]string {
			url, _ := testdb.Fresh(t)
			return map[string]string{"DATABASE_URL": url, "REDIS_URL": redistest.SharedURL()}
		}, "oncekey"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := upstreamtest.Start(t)
			spec := u.Spec
			if tc.profile == "ietf" {
				doc, err := os.ReadFile(u.Spec)
				require.NoError(t, err)
				ietf := strings.Replace(string(doc), "'202':", "'422':", 1)
				require.NotEqual(t, string(doc), ietf, "the document declares a 202")
				spec = filepath.Join(t.TempDir(), "openapi.yaml")
				require.NoError(t, os.WriteFile(spec, []byte(ietf), 0o600))
			}
			addr, _ := startCommand(t, tc.env(t), "proxy", "--upstream", u.URL, "--spec", spec, "--scope-authorization", "--scope-secret", testScopeSecret, "--profile", tc.profile)
			passed, skipped := requireConformance(t, "conformance", "--spec", spec, "--overrides", u.Overrides, "--url", "http://"+addr,
				"--auth", "Bearer first", "--auth2", "Bearer second", "--profile", tc.profile)
			// Every key ran once upstream, but the key that
			// credential-isolation sends under both credentials: two
			// scopes, so two operations.
			_, byKey := u.Executions(t)
			twice := 0
			for key, n := range byKey {
				require.LessOrEqual(t, n, 2, "upstream executions of key %q", key)
				if n == 2 {
					twice++
				}
			}
			require.LessOrEqual(t, twice, 1, "keys that ran twice upstream: %v", byKey)
			t.Logf("through the proxy (%s): %d passed, %d skipped; %d keys ran upstream", tc.name, passed, skipped, len(byKey))
			// The upstream fails, and answers 1.5 MiB, when asked to (its
			// overrides): the gateway stores no 500 and replays the large
			// answer whole, so these checks ran and passed.
			onlyPassed, _ := requireConformance(t, "conformance", "--spec", spec, "--overrides", u.Overrides, "--url", "http://"+addr,
				"--auth", "Bearer first", "--profile", tc.profile, "--only", "error-not-stored,large-answer")
			require.Equal(t, 2, onlyPassed, "error-not-stored and large-answer passed")
		})
	}
}

// requireConformance runs `oncekey conformance` with args and requires that
// no check fails or errs and some pass; it returns how many passed and
// skipped.
func requireConformance(t *testing.T, args ...string) (passed, skipped int) {
	t.Helper()
	out, err := runCommand(t, map[string]string{}, append(args, "--format", "json")...)
	var doc struct {
		Summary struct{ Passed, Failed, Skipped, Errors int }
		Results []struct{ Check, Operation, Status, Reason string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), "a JSON report (%v): %.2000s", err, out)
	// The failed checks alone, not the report of every check: a failure
	// message the length of the whole report buries them.
	var failed strings.Builder
	for _, r := range doc.Results {
		if r.Status == "fail" || r.Status == "error" {
			fmt.Fprintf(&failed, "%s %s on %s: %s\n", r.Status, r.Check, r.Operation, r.Reason)
		}
	}
	require.NoError(t, err, "failed:\n%s", failed.String())
	for _, r := range doc.Results {
		require.Contains(t, []string{"pass", "skip"}, r.Status, "%s on %s: %s", r.Check, r.Operation, r.Reason)
	}
	require.Zero(t, doc.Summary.Failed)
	require.Zero(t, doc.Summary.Errors)
	require.Positive(t, doc.Summary.Passed)
	return doc.Summary.Passed, doc.Summary.Skipped
}

// `oncekey conformance` against Oncekey on PostgreSQL with two accounts and
// no overrides file: it finds by itself that PATCH and DELETE
// /orders/{id} need an order, that a payment needs an order_id and that a
// refund needs a payment that is no longer pending, so every check passes,
// or is skipped for a reason no override could remove.
func TestConformanceWithoutOverrides(t *testing.T) {
	t.Parallel()
	url, _ := testdb.Fresh(t)
	env := map[string]string{"DATABASE_URL": url}
	var keys []string
	for _, name := range []string{"first", "second"} {
		out, err := runCommand(t, env, "accounts", "create", name)
		require.NoError(t, err, "accounts create %s", name)
		var creds struct {
			APIKey string `json:"api_key"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &creds), out)
		keys = append(keys, creds.APIKey)
	}
	addr, _ := startServe(t, map[string]string{"DATABASE_URL": url, "ONCEKEY_PAYMENT_RETRY_BASE": "50ms"})
	out, err := runCommand(t, map[string]string{}, "conformance", "--spec", "../../openapi.yaml", "--url", "http://"+addr,
		"--auth", "Bearer "+keys[0], "--auth2", "Bearer "+keys[1], "--format", "json")
	var doc struct {
		Results []struct{ Check, Operation, Status, Reason string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), "a JSON report (%v): %.2000s", err, out)
	require.NoError(t, err, "exit 0")
	ran := map[string]bool{}
	for _, r := range doc.Results {
		require.Contains(t, []string{"pass", "skip"}, r.Status, "%s on %s: %s", r.Check, r.Operation, r.Reason)
		// A failure or a large answer is made from outside only by an
		// override (the service has none to make): those two alone may
		// say so; nothing else may be skipped for want of one.
		if r.Check != "error-not-stored" && r.Check != "large-answer" {
			require.NotContains(t, r.Reason, "override", "%s on %s is skipped for want of an override", r.Check, r.Operation)
		}
		if r.Status == "pass" && r.Check == "replay" {
			ran[r.Operation] = true
		}
	}
	require.Len(t, ran, 7, "replay passes on every operation under the protocol: %v", ran)
}

// thingsSpec is an API of two operations under the protocol: one that
// creates a thing, and one that ships a thing by id.
const thingsSpec = `openapi: 3.0.3
info: {title: Things, version: "1"}
paths:
  /things:
    post:
      parameters: [{$ref: '#/components/parameters/Key'}]
      requestBody:
        required: true
        content:
          application/json:
            schema: {type: object, required: [name], properties: {name: {type: string}}}
      responses:
        '201': {description: A thing., content: {application/json: {schema: {type: object}}}}
  /things/{id}/ship:
    post:
      parameters:
        - {$ref: '#/components/parameters/Key'}
        - {name: id, in: path, required: true, schema: {type: string}}
      responses:
        '200': {description: Shipped., content: {application/json: {schema: {type: object}}}}
        '404': {description: No such thing., content: {application/json: {schema: {type: object}}}}
components:
  parameters:
    Key: {name: Idempotency-Key, in: header, required: true, schema: {type: string}}
`

// brokenThings serves thingsSpec and breaks the protocol where it can: a
// create runs every time, key or none (a protocol failure), and it has no
// thing to ship, whatever the id the tool makes up (a request that cannot
// work: an error).
func brokenThings(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/things" {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, fmt.Sprint(time.Now().UnixNano()))
		return
	}
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprint(w, `{"title":"no such thing"}`)
}

// `oncekey conformance` exits 2 when checks could not run but none failed,
// so that CI can tell a tool that needs a hint from an API that breaks the
// protocol; any failure exits 1, errors or not. Each runs as a process of
// its own, through main's exit code; the progress lines say error too.
func TestConformanceExitCodes(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(brokenThings))
	t.Cleanup(srv.Close)
	spec := filepath.Join(t.TempDir(), "things.yaml")
	require.NoError(t, os.WriteFile(spec, []byte(thingsSpec), 0o600))
	tests := []struct {
		name   string
		only   string
		code   int
		stderr string // what the last line says
	}{
		{"errors alone", "POST /things/{id}/ship", 2, "checks could not run"},
		{"failures and errors", "", 1, "checks failed, and"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"-test.run=^$", "--", "conformance", "--spec", spec, "--url", srv.URL, "--auth", "Bearer x"}
			if tt.only != "" {
				args = append(args, "--only", tt.only)
			}
			starter := filepath.Join(t.TempDir(), "overrides.yaml")
			args = append(args, "--write-overrides", starter)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], args...)
			cmd.Env = append(os.Environ(), subprocessEnv+"=cli")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.Equal(t, tt.code, exit.ExitCode(), "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			require.Contains(t, stderr.String(), " error key-required POST /things/{id}/ship\n", "the progress lines")
			require.Contains(t, stderr.String(), tt.stderr)
			require.Regexp(t, `(?m)^error +replay +POST /things/\{id\}/ship +no working request could be made: POST /things/\S+/ship was refused \(404 `, stdout.String())
			if tt.code == 2 {
				require.NotContains(t, stdout.String(), "\nfail ", "no check failed")
				require.True(t, strings.HasSuffix(stdout.String(), "1 passed, 0 failed, 8 skipped, 8 errors\n"), stdout.String())
				// The starter file has the one operation that needs an
				// entry, and reads as an overrides file.
				require.Contains(t, stderr.String(), "oncekey conformance: wrote "+starter+": 1 operations to fill in")
				b, err := os.ReadFile(starter)
				require.NoError(t, err)
				o, err := conformance.ParseOverrides(b)
				require.NoError(t, err, string(b))
				require.Equal(t, []string{"POST /things/{id}/ship"}, slices.Collect(maps.Keys(o.Operations)), string(b))
				require.NotContains(t, o.Operations["POST /things/{id}/ship"].Path, "id", "what inference found is left to it: %s", b)
				require.Contains(t, string(b), `# "id": the tool makes it (name match: the id POST /things answers with`, "and said in a comment")
			} else {
				require.Regexp(t, `(?m)^fail +key-required +POST /things `, stdout.String())
			}
		})
	}
}

// --plan needs no --url and sends nothing: for Oncekey's document it says
// that a refund's payment comes from the Location of POST /payments, and
// --explain writes the same on standard error before the checks, leaving
// standard output to the report.
func TestConformancePlanAndExplain(t *testing.T) {
	t.Parallel()
	out, err := runCommand(t, map[string]string{}, "conformance", "--spec", "../../openapi.yaml", "--plan", "--format", "json")
	require.NoError(t, err, out)
	var plans []conformance.Planned
	require.NoError(t, json.Unmarshal([]byte(out), &plans), out)
	require.Len(t, plans, 7, "the operations under the protocol")
	byOp := map[string]conformance.Planned{}
	for _, p := range plans {
		byOp[p.Operation] = p
	}
	refund := byOp["POST /payments/{id}/refunds"]
	require.Contains(t, refund.Values, conformance.Value{Where: "path id", Source: "Location", Detail: "POST /payments answers with its Location, /payments/{id}"})
	require.Equal(t, []string{"POST /payments", "POST /orders"}, refund.Needs)

	addr, _ := startServe(t, map[string]string{})
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"conformance", "--spec", "../../openapi.yaml", "--url", "http://" + addr,
		"--auth", "Bearer " + DemoAPIKey, "--only", "replay,createRefund", "--explain", "--format", "json"},
		func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	require.Regexp(t, `(?m)^  path id +Location +POST /payments answers with its Location, /payments/\{id\}$`, stderr.String())
	require.True(t, json.Valid(stdout.Bytes()), "standard output is the report alone: %s", stdout.String())
}
