package integration_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeLibraryProgram: the program the README's first start (putting
// exactly-once into a Go service) shows, its first Go block, builds and
// passes go vet in a module outside this repository that requires the
// engine's modules alone, so that the snippet a new user copies cannot drift
// from the API.
func TestReadmeLibraryProgram(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "..", "README.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "\n### 1. Put exactly-once into your Go service\n")
	require.True(t, ok, "README.md has the start for Go services")
	section, _, _ = strings.Cut(section, "\n### ")
	section, _, _ = strings.Cut(section, "\n## ")
	_, program, ok := strings.Cut(section, "\n```go\n")
	require.True(t, ok, "the start for Go services shows a Go program")
	program, _, ok = strings.Cut(program, "\n```\n")
	require.True(t, ok, "the Go block ends")
	require.True(t, strings.HasPrefix(program, "package main\n"), "the block is a whole program, imports and all")

	m := outsideModule(t, root, map[string]string{"main.go": program + "\n"}, engine+"/pgstore")
	m.run("mod", "tidy")
	m.run("vet", "./...")
	m.run("build", "-o", os.DevNull, ".")
}
