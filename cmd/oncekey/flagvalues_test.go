package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBadFlagValuesAreReportedTogether: every bad value of one command
// line (a duration, a number, an enum, a switch, from flags and from
// variables) is reported in one run, one line each and in the order given,
// followed by what the command's own checks find (a URL, an address, a
// mode), so that a broken deployment is fixed in one go.
func TestBadFlagValuesAreReportedTogether(t *testing.T) {
	t.Parallel()
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	require.NoError(t, os.WriteFile(routes, []byte("routes:\n  - method: POST\n    path: /transfers\n"), 0o600))
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string // each line's start, in order
	}{
		{
			name: "proxy: a duration, an enum and a URL",
			args: []string{"proxy", "--upstream", "ftp:/nowhere", "--ttl", "soon", "--on-unknown=maybe", "--routes", routes, "--scope-authorization", "--scope-secret", testScopeSecret},
			want: []string{
				`--ttl: expected duration but got "soon"`,
				`--on-unknown: must be one of "report", "retry" but got "maybe"`,
				`--upstream (ONCEKEY_UPSTREAM) "ftp:/nowhere": want an absolute http or https URL`,
			},
		},
		{
			name: "serve: flags, a variable and the command's checks",
			env:  map[string]string{"IDEMPOTENCY_WAIT": "forever"},
			args: []string{"serve", "--ttl=soon", "--max-conns", "lots", "--group-commit-by-account=maybe", "--tracing=jaeger", "--addr=8080"},
			want: []string{
				`--ttl: expected duration but got "soon"`,
				`--max-conns: `,
				`--group-commit-by-account: bool value must be true, 1, yes, false, 0 or no but got "maybe"`,
				`--wait: IDEMPOTENCY_WAIT="forever": expected duration but got "forever"`,
				`--addr (ONCEKEY_ADDR) "8080": want host:port`,
				`--tracing (ONCEKEY_TRACING) "jaeger": want off or stdout`,
			},
		},
		{
			name: "an enum from a variable",
			env:  map[string]string{"ONCEKEY_KEY_SCOPE": "text"},
			args: []string{"serve", "--request-timeout=never"},
			want: []string{
				`--request-timeout: expected duration but got "never"`,
				`--key-scope: ONCEKEY_KEY_SCOPE="text": must be one of "bytea", "uuid" but got "text"`,
			},
		},
		{
			name: "a command without checks of its own",
			args: []string{"conformance", "--spec", "api.yaml", "--url", "http://127.0.0.1:1", "--profile=acme", "--format", "xml", "--timeout=soon", "--concurrency=many"},
			want: []string{
				`--profile: must be one of "oncekey", "ietf", "ietf-07", "stripe", "agent-commerce" but got "acme"`,
				`--format: must be one of "text", "json", "junit" but got "xml"`,
				`--timeout: expected duration but got "soon"`,
				`--concurrency: `,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := runCommand(t, tt.env, tt.args...)
			require.Error(t, err)
			lines := strings.Split(err.Error(), "\n")
			require.Equal(t, "invalid configuration:", lines[0], "%s", err)
			require.Len(t, lines, len(tt.want)+1, "one line per problem:\n%s", err)
			for i, want := range tt.want {
				require.True(t, strings.HasPrefix(lines[i+1], "  - "+want), "line %d is %q, want %q", i+1, lines[i+1], want)
			}
		})
	}
}

// TestBadFlagValuesStopTheCommand: a command whose flags are bad does not
// run, even where every bad value had a valid default to stand in: migrate
// names its bad value and never dials the database.
func TestBadFlagValuesStopTheCommand(t *testing.T) {
	t.Parallel()
	tr := newTrap(t)
	env := map[string]string{"DATABASE_URL": "postgres://postgres@" + tr.ln.Addr().String() + "/postgres?connect_timeout=1"}
	_, err := runCommand(t, env, "migrate", "--key-scope=text")
	require.EqualError(t, err, "invalid configuration:\n  - --key-scope: must be one of \"bytea\", \"uuid\" but got \"text\"")
	require.Zero(t, tr.dials.Load(), "migrate ran")
}

// TestUnknownFlagsAfterBadValues: kong stops at an unknown flag; the bad
// values before it are reported with it, and the hint at the command's
// help stays.
func TestUnknownFlagsAfterBadValues(t *testing.T) {
	t.Parallel()
	_, err := runCommand(t, nil, "serve", "--ttl=soon", "--frobnicate", "--wait=later")
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Len(t, lines, 4, "%s", err)
	require.Equal(t, "invalid configuration:", lines[0])
	require.True(t, strings.HasPrefix(lines[1], `  - --ttl: expected duration but got "soon"`), lines[1])
	require.Equal(t, "  - unknown flag --frobnicate", lines[2])
	require.Equal(t, "(see 'oncekey serve --help')", lines[3])

	_, err = runCommand(t, nil, "serve", "--frobnicate")
	require.EqualError(t, err, "unknown flag --frobnicate\n(see 'oncekey serve --help')", "alone, as it always was")
}

// TestNoCommandIsAUsageError: plain `oncekey` prints the usage (the same
// as --help) to standard error and exits 2, so that a script or container
// started without its command fails instead of passing.
func TestNoCommandIsAUsageError(t *testing.T) {
	t.Parallel()
	help, err := runCommand(t, nil, "--help")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$", "--")
	cmd.Env = append(os.Environ(), subprocessEnv+"=cli")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stderr:\n%s", stderr.String())
	require.Equal(t, 2, exit.ExitCode())
	require.Empty(t, stdout.String(), "the usage is an error's: on stderr")
	require.Equal(t, help+"oncekey: "+errNoCommand.Error()+"\n", stderr.String())

	var out, errOut bytes.Buffer
	err = run(t.Context(), nil, func(string) string { return "" }, strings.NewReader(""), &out, &errOut)
	require.True(t, errors.Is(err, errNoCommand), "%v", err)
	require.Equal(t, help, errOut.String())
}
