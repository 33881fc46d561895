package caddymodule

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNamespacedScopeIsTheGatewaysTwin pins the stored scope of a
// (namespace, scope) pair; internal/gateway's TestNamespacedScopeIsPinned
// pins the same string, so that a Caddy site and oncekey proxy of one
// namespace share their keys.
func TestNamespacedScopeIsTheGatewaysTwin(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ns:payments-api|acct-9", namespacedScope("payments-api", "acct-9"))
	require.NoError(t, checkNamespace("payments-api"))
	require.Error(t, checkNamespace("a|b"))
}
