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
	for stored, want := range map[string]struct {
		scope      string
		namespaced bool
	}{
		"ns:payments-api|acct-9": {"acct-9", true},
		"ns:a|b|c":               {"b|c", true},
		"acct-9":                 {"acct-9", false},
		"ns:acct-9":              {"ns:acct-9", false},
	} {
		scope, ok := bareScope(stored)
		require.Equal(t, want.scope, scope, stored)
		require.Equal(t, want.namespaced, ok, stored)
	}
}
