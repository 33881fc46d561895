package oncekey_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMakeFallsBackToTheInstalledGo runs make as a machine without the
// module proxy would (GOPROXY=off, an empty module cache, GOTOOLCHAIN
// unset, the installed go first on PATH): the Makefile cannot fetch its
// patch toolchain, so it builds with the installed Go and says so in one
// line instead of failing with "toolchain not available". Where the
// installed Go is that patch release, nothing needs fetching, and make
// says nothing.
func TestMakeFallsBackToTheInstalledGo(t *testing.T) {
	t.Parallel()
	makefile, err := os.ReadFile("Makefile")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(makefile), "\nGO_PATCH := ")
	require.True(t, ok, "the Makefile names its toolchain as GO_PATCH")
	patch, _, _ := strings.Cut(rest, "\n")

	// go test puts its own toolchain's bin first on PATH; a user's shell
	// has the installed go.
	var path []string
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if !strings.Contains(dir, "golang.org/toolchain") {
			path = append(path, dir)
		}
	}
	env := []string{"GOPROXY=off", "GOMODCACHE=" + t.TempDir(), "GOFLAGS=-modcacherw",
		"PATH=" + strings.Join(path, string(filepath.ListSeparator)), "MAKEFLAGS=", "MAKELEVEL="}
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "GOTOOLCHAIN", "GOPROXY", "GOMODCACHE", "GOFLAGS", "PATH", "MAKEFLAGS", "MAKELEVEL", "GOROOT":
		default:
			env = append(env, kv)
		}
	}
	var goCmd string
	for _, dir := range path {
		if info, err := os.Stat(filepath.Join(dir, "go")); err == nil && !info.IsDir() {
			goCmd = filepath.Join(dir, "go")
			break
		}
	}
	require.NotEmpty(t, goCmd, "an installed go on PATH")
	installed := exec.Command(goCmd, "env", "GOVERSION")
	installed.Env = append(env, "GOTOOLCHAIN=local")
	out, err := installed.Output()
	require.NoError(t, err, "the installed go")
	version := strings.TrimSpace(string(out))

	cmd := exec.Command("make", "--no-print-directory", "go-version")
	cmd.Env = env
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "make go-version without the module proxy:\n%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if version == patch {
		require.Len(t, lines, 1, "the installed Go is %s: nothing to say:\n%s", patch, out)
	} else {
		require.Len(t, lines, 2, "one line says why, one is go version:\n%s", out)
		require.Equal(t, "make: "+patch+" cannot be fetched (no module proxy?): building with the installed "+version+"; make vulncheck wants "+patch, lines[0])
	}
	require.True(t, strings.HasPrefix(lines[len(lines)-1], "go version "+version+" "), "make builds with the installed %s:\n%s", version, out)
}
