package problem_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/problem"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	rec.Header().Set("Retry-After", "1")
	problem.Write(rec, problem.Unavailable, "try later")

	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, problem.ContentType, rec.Header().Get("Content-Type"))
	require.Equal(t, "1", rec.Header().Get("Retry-After"), "headers set before Write are kept")
	var got problem.Details
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Equal(t, problem.Details{
		Type: "https://oncekey.dev/problems/unavailable", Title: problem.Unavailable.Title,
		Status: http.StatusServiceUnavailable, Detail: "try later",
	}, got)
}

// TestEveryKindIsDocumented keeps docs/problems.md complete: clients branch
// on these URIs, so each one must be explained.
func TestEveryKindIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/problems.md")
	require.NoError(t, err)
	slugs := map[string]bool{}
	for _, k := range problem.Kinds {
		require.False(t, slugs[k.Slug], "slug %q used twice", k.Slug)
		slugs[k.Slug] = true
		require.True(t, strings.Contains(string(doc), "| `"+k.Slug+"` | "+strconv.Itoa(k.Status)+" |"),
			"docs/problems.md has no row for %s (%d)", k.Slug, k.Status)
	}
}
