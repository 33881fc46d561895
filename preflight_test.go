package oncekey_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPreflightNamesWhatIsMissing runs tools/preflight.sh (make
// test/preflight's first half) on a PATH that holds only some programs:
// each missing one is named in one line with its Debian package; a
// missing program of one step (npm, promtool, a container engine) is a
// warning that make test skips that step, unless CI is set, where it fails
// the run; a program every step needs (curl) fails it everywhere.
func TestPreflightNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	everyStep := []string{"bash", "dirname", "curl", "python3", "redis-server", "redis-cli"}
	tests := []struct {
		name   string
		have   []string
		ci     bool
		fails  bool
		lines  []string
		absent []string
	}{
		{
			name: "no npm, promtool or engine, outside CI", have: everyStep,
			lines: []string{
				"preflight: npm is missing: make test skips test/sdk (apt-get install nodejs npm)",
				"preflight: promtool is missing: make test skips test/alerts (apt-get install prometheus)",
				"preflight: podman is missing: make test skips test/image (apt-get install podman runc)",
				"preflight: going on without 3 step(s); set CI to make a missing program fail the run",
			},
		},
		{
			name: "no npm, promtool or engine, in CI", have: everyStep, ci: true, fails: true,
			lines: []string{
				"preflight: npm is missing, and make test/sdk needs it (required when CI is set): apt-get install nodejs npm",
				"preflight: promtool is missing, and make test/alerts needs it (required when CI is set): apt-get install prometheus",
				"preflight: podman is missing, and make test/image needs it (required when CI is set): apt-get install podman runc",
				"preflight: 3 program(s) missing; install them and run make test again",
			},
		},
		{
			name: "no curl, outside CI", have: []string{"bash", "dirname", "python3", "redis-server", "redis-cli", "npm", "promtool"}, fails: true,
			lines: []string{
				"preflight: curl is missing, and the README examples' tests (cmd/oncekey) needs it: apt-get install curl",
				"preflight: podman is missing: make test skips test/image (apt-get install podman runc)",
				"preflight: 1 program(s) missing; install them and run make test again",
			},
			absent: []string{"npm is missing", "promtool is missing"},
		},
	}
	script, err := filepath.Abs("tools/preflight.sh")
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bin := t.TempDir()
			for _, name := range tt.have {
				if name == "npm" || name == "promtool" { // stand-ins: only their presence counts
					require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755))
					continue
				}
				path, err := exec.LookPath(name)
				require.NoError(t, err, "the machine's %s", name)
				require.NoError(t, os.Symlink(path, filepath.Join(bin, name)))
			}
			cmd := exec.Command(filepath.Join(bin, "bash"), script)
			cmd.Env = []string{"PATH=" + bin}
			if tt.ci {
				cmd.Env = append(cmd.Env, "CI=true")
			}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if tt.fails {
				require.True(t, errors.As(err, &exit), "the preflight fails:\n%s", out)
			} else {
				require.NoError(t, err, "the preflight goes on:\n%s", out)
			}
			require.Equal(t, tt.lines, strings.Split(strings.TrimSpace(string(out)), "\n"), "one line per missing program")
			for _, a := range tt.absent {
				require.NotContains(t, string(out), a)
			}
		})
	}
}
