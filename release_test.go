package oncekey_test

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// publicModules are the engine's modules that make release tags, as the
// Makefile's PUBLIC_MODULES names them.
var publicModules = []string{
	"idempotency", "idempotency/pgstore", "idempotency/redisstore",
	"idempotency/oapi", "idempotency/grpcidem", "idempotency/caddymodule",
}

// TestRelease runs `make release` as docs/library.md shows it, in a copy
// of the checkout (its files, committed in a repository of their own), so
// that no tag is ever made here: the dry run changes nothing and names
// every tag; a bad version, a tree with changes and a tag that exists are
// refused; the release commits each CHANGELOG's Unreleased section as the
// version and tags that commit once per public module.
func TestRelease(t *testing.T) {
	t.Parallel()
	dir := copyCheckout(t)
	git := func(args ...string) string {
		t.Helper()
		out, err := command(dir, "git", args...).CombinedOutput()
		require.NoError(t, err, "git %s:\n%s", strings.Join(args, " "), out)
		return strings.TrimSpace(string(out))
	}
	release := func(env ...string) (string, error) {
		cmd := command(dir, "make", append([]string{"--no-print-directory", "release"}, env...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	head := git("rev-parse", "HEAD")

	out, err := release("VERSION=v0.1.0", "DRY_RUN=1")
	require.NoError(t, err, "the dry run:\n%s", out)
	for _, m := range publicModules {
		require.Contains(t, out, "would tag "+m+"/v0.1.0\n", "the dry run names each module's tag")
		require.Contains(t, out, "would rewrite "+m+"/CHANGELOG.md", "the dry run names each CHANGELOG")
	}
	require.Empty(t, git("tag"), "the dry run made a tag")
	require.Empty(t, git("status", "--porcelain"), "the dry run changed the tree")
	require.Equal(t, head, git("rev-parse", "HEAD"), "the dry run committed")

	out, err = release("VERSION=0.1")
	require.Error(t, err, "a version without v and patch:\n%s", out)
	require.Contains(t, out, "VERSION must be vMAJOR.MINOR.PATCH")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "idempotency", "scratch.txt"), []byte("x"), 0o644))
	out, err = release("VERSION=v0.1.0")
	require.Error(t, err, "a tree with changes:\n%s", out)
	require.Contains(t, out, "changes not committed")
	require.NoError(t, os.Remove(filepath.Join(dir, "idempotency", "scratch.txt")))

	out, err = release("VERSION=v0.1.0")
	require.NoError(t, err, "the release:\n%s", out)
	release1 := git("rev-parse", "HEAD")
	require.Equal(t, head, git("rev-parse", "HEAD~1"), "the release is one commit")
	require.Empty(t, git("status", "--porcelain"), "the release left changes uncommitted")
	today := time.Now().UTC().Format("2006-01-02")
	for _, m := range publicModules {
		require.Equal(t, release1, git("rev-list", "-n1", m+"/v0.1.0"), "the tag %s/v0.1.0 is on the release commit", m)
		changelog, err := os.ReadFile(filepath.Join(dir, m, "CHANGELOG.md"))
		require.NoError(t, err)
		require.Contains(t, string(changelog), "\n## v0.1.0 ("+today+")\n", "%s/CHANGELOG.md names the release", m)
		require.NotContains(t, string(changelog), "## Unreleased", "%s/CHANGELOG.md", m)
	}
	require.Equal(t, release1, git("rev-parse", "HEAD^{commit}"))
	recorded, err := os.ReadFile(filepath.Join(dir, "api", "previous-release"))
	require.NoError(t, err)
	require.Contains(t, string(recorded), head+"\n", "api/previous-release records the released commit")

	out, err = release("VERSION=v0.1.0")
	require.Error(t, err, "a release whose tags exist:\n%s", out)
	require.Contains(t, out, "the tag idempotency/v0.1.0 exists already")
}

// copyCheckout copies the checkout's files (committed or not, but not the
// ignored ones) into a repository of their own, with one commit.
func copyCheckout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	list, err := exec.Command("git", "ls-files", "-z", "-co", "--exclude-standard").Output()
	require.NoError(t, err, "git ls-files")
	for _, name := range strings.Split(strings.TrimSuffix(string(list), "\x00"), "\x00") {
		info, err := os.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted, not committed yet
		}
		require.NoError(t, err)
		to := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
		if info.Mode()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(name)
			require.NoError(t, err)
			require.NoError(t, os.Symlink(target, to))
			continue
		}
		data, err := os.ReadFile(name)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to, data, info.Mode().Perm()))
	}
	for _, args := range [][]string{
		{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "the checkout"},
	} {
		out, err := command(dir, "git", args...).CombinedOutput()
		require.NoError(t, err, "git %s:\n%s", strings.Join(args, " "), out)
	}
	return dir
}

// command is name run in dir, as a user of its own: no make flags from
// an outer make, a git identity of its own.
func command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"MAKEFLAGS=", "MFLAGS=", "MAKELEVEL=",
		"GIT_AUTHOR_NAME=release test", "GIT_AUTHOR_EMAIL=release@test.invalid",
		"GIT_COMMITTER_NAME=release test", "GIT_COMMITTER_EMAIL=release@test.invalid",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	return cmd
}
