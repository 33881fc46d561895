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

// TestMACScopeIsTheProxysTwin pins the scope stored for an Authorization
// value under a scope_secret: the one internal/gateway/keyscope's Authorization
// (oncekey proxy --scope-authorization) stores, so that the two share
// keys and the operators' recipe (docs/operations.md) reads both.
func TestMACScopeIsTheProxysTwin(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	require.Equal(t, "hmac:c2f52eeb:fb8ae57c17f11de46d70baec83071b582aa84b50912366d3fdd026714423063d",
		newScopeMAC(secret).of("Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc"))
	require.Equal(t, "hmac:c2f52eeb:", newScopeMAC(secret).prefix)
}
