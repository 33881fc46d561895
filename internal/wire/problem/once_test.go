package problem_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// TestProtocolSlugsDeclaredOnce: the idempotency protocol's problems are
// declared in the engine alone (idempotency/problem.go); the service, the
// sandbox provider and their tests take them from there. A slug spelled
// out as a Go string anywhere else is a second declaration, free to drift.
func TestProtocolSlugsDeclaredOnce(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..")
	src, err := os.ReadFile(filepath.Join(root, "idempotency", "problem.go"))
	require.NoError(t, err)
	var protocol []string
	for _, m := range regexp.MustCompile(`Slug: "([a-z-]+)"`).FindAllStringSubmatch(string(src), -1) {
		protocol = append(protocol, m[1])
	}
	// The table holds every problem ProblemOf answers with, the 500 for
	// any other error too.
	for _, err := range []error{idempotency.ErrMissingKey, idempotency.ErrKeyMismatch, idempotency.ErrInFlight, errors.New("any")} {
		require.Contains(t, protocol, idempotency.ProblemOf(err).Slug, "the slugs read from idempotency/problem.go")
	}
	require.Len(t, protocol, 17, "the protocol's problems in idempotency/problem.go")
	found := map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// examples/ holds services of adopters' own, which check the
		// wire as any client would; so does client/, the Go SDK, which
		// links no engine (TestClientLinksNoServerCode) and reads the
		// slugs off the wire (a gateway's outcome-unknown).
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "gen" || d.Name() == ".git" || d.Name() == "examples" || path == filepath.Join(root, "client")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".gen.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, slug := range protocol {
			if strings.Contains(string(src), strconv.Quote(slug)) {
				found[slug] = append(found[slug], filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator))))
			}
		}
		return nil
	})
	require.NoError(t, err)
	for _, slug := range protocol {
		require.Equal(t, []string{"idempotency/problem.go"}, found[slug], "where %q is spelled out", slug)
	}
}
