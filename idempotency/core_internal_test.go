package idempotency

import (
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReplayable: the statuses a run's Finish stores are the operation's
// outcomes; a refusal before it could start, and a server error, free the
// key for a retry.
func TestReplayable(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{
		200: true, 201: true, 202: true, 404: true, 409: true, 422: true,
		400: false, 401: false, 403: false, 408: false, 413: false, 415: false, 429: false, 499: false,
		500: false, 502: false, 503: false, 504: false,
	} {
		require.Equal(t, want, replayable(status), "status %d", status)
	}
}

// coreFiles are the protocol's core: what Operation.Begin and Finish run
// on. The HTTP layer (http.go, httpheld.go, recorder.go), the engine's
// HTTP configuration (engine.go) and the problem documents (problem.go)
// are outside it.
var coreFiles = []string{
	"core.go", "operation.go", "held.go", "settle.go",
	"collapse.go", "detach.go", "fingerprint.go", "outcome.go",
}

// TestCoreKnowsNoHTTP: no core file imports net/http, so that a transport
// other than HTTP (grpcidem, a queue) runs the protocol without building
// an HTTP request.
func TestCoreKnowsNoHTTP(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	for _, name := range coreFiles {
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		require.NoError(t, err, "core file %s", name)
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			require.False(t, path == "net/http" || strings.HasPrefix(path, "net/http/"),
				"core file %s imports %s: the core knows nothing of HTTP", name, path)
		}
	}
}
