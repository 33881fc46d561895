package client_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestClientLinksNoServerCode: a program that only calls the API (the
// client, and examples/createorder built on it) links no router, no server
// code and nothing of the service, so adopting the SDK costs its own
// dependencies alone. The key journal is the standard library's: nor
// does the SDK link the engine (its header name is spelt out).
func TestClientLinksNoServerCode(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{"github.com/oncekey/oncekey/client", "github.com/oncekey/oncekey/examples/createorder"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		require.NoError(t, err, "go list -deps %s: %s", pkg, out)
		deps := strings.Fields(string(out))
		require.Contains(t, deps, "github.com/oncekey/oncekey/gen/apiclient", "%s is built on the generated client", pkg)
		for _, dep := range deps {
			for _, banned := range []string{"github.com/go-chi/", "github.com/oncekey/oncekey/gen/apiserver", "github.com/oncekey/oncekey/internal/", "github.com/getkin/", "github.com/jackc/", "github.com/oncekey/oncekey/idempotency"} {
				require.False(t, strings.HasPrefix(dep, banned), "%s links %s", pkg, dep)
			}
		}
	}
}
