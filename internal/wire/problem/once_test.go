package problem_test

import (
	"io/fs"
	"os"
	"path/filepath"
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
	protocol := []idempotency.Problem{
		idempotency.ProblemMissingKey, idempotency.ProblemInvalidKey, idempotency.ProblemMalformedBody,
		idempotency.ProblemMalformedForm, idempotency.ProblemMalformedContentType, idempotency.ProblemMalformedQuery,
		idempotency.ProblemBodyTooLarge, idempotency.ProblemNoScope, idempotency.ProblemKeyMismatch,
		idempotency.ProblemInFlight, idempotency.ProblemUnavailable, idempotency.ProblemClientClosed,
		idempotency.ProblemInternal,
	}
	found := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		// examples/ holds services of adopters' own, which check the
		// wire as any client would.
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "gen" || d.Name() == ".git" || d.Name() == "examples") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".gen.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, p := range protocol {
			if strings.Contains(string(src), strconv.Quote(p.Slug)) {
				found[p.Slug] = append(found[p.Slug], filepath.ToSlash(strings.TrimPrefix(path, root+string(filepath.Separator))))
			}
		}
		return nil
	})
	require.NoError(t, err)
	for _, p := range protocol {
		require.Equal(t, []string{"idempotency/problem.go"}, found[p.Slug], "where %q is spelled out", p.Slug)
	}
}
