package httpapi_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

var update = flag.Bool("update", false, "rewrite docs/problems.md from the problem table")

// TestProblemsReference keeps docs/problems.md equal to the problem table:
// clients branch on these URIs, so each one is explained, and a new
// operation's outcomes are documented where they are declared.
func TestProblemsReference(t *testing.T) {
	t.Parallel()
	var doc strings.Builder
	doc.WriteString("# Problem types\n\n" +
		"<!-- Generated from internal/service/httpapi/errors.go by `make docs/problems`; `make test` fails when it is stale. -->\n\n" +
		"Every error response is `application/problem+json` (RFC 9457). Branch on\n" +
		"`type`, never on `title` or `detail`: the type URIs are stable identifiers\n" +
		"(they need not resolve), `title` is fixed per type, and `detail` explains the\n" +
		"particular occurrence in words meant for people.\n\n" +
		"\"Key consumed\" says whether the `Idempotency-Key` is now bound to this\n" +
		"outcome: if not, fix the request and retry with the same key.\n\n" +
		"| `type` (after `" + problem.TypeBase + "`) | Status | Title | When | Key consumed |\n" +
		"| --- | --- | --- | --- | --- |\n")
	slugs := map[string]bool{}
	for _, k := range httpapi.Problems() {
		require.False(t, slugs[k.Slug], "slug %q declared twice with different fields", k.Slug)
		slugs[k.Slug] = true
		require.NotEmpty(t, k.When, "kind %s says when it is sent", k.Slug)
		require.NotEmpty(t, k.KeyConsumed, "kind %s says whether the key is consumed", k.Slug)
		fmt.Fprintf(&doc, "| `%s` | %d | %s | %s | %s |\n", k.Slug, k.Status, k.Title, k.When, k.KeyConsumed)
	}
	file := filepath.Join("..", "..", "..", "docs", "problems.md")
	if *update {
		require.NoError(t, os.WriteFile(file, []byte(doc.String()), 0o644))
	}
	committed, err := os.ReadFile(file)
	require.NoError(t, err, "run make docs/problems")
	require.Equal(t, doc.String(), string(committed), "docs/problems.md is stale: run make docs/problems")
}
