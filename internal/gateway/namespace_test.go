package gateway

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNamespacedScopeRoundTrips(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ ns, scope string }{
		{"http://127.0.0.1:3000", "acme"},
		{"payments", "ns:x|y"},
		{"a", ""},
		{"a b:c", "sha256:00ff"},
	} {
		stored := NamespacedScope(c.ns, c.scope)
		ns, scope, ok := SplitScope(stored)
		require.True(t, ok, "%q", stored)
		require.Equal(t, c.ns, ns, "%q", stored)
		require.Equal(t, c.scope, scope, "%q", stored)
	}
	_, scope, ok := SplitScope("acme")
	require.False(t, ok)
	require.Equal(t, "acme", scope)
	// A namespace holds no "|", so the first one ends it.
	require.Error(t, CheckNamespace("a|b"))
	require.Error(t, CheckNamespace(""))
}

func TestDefaultNamespaceIsTheUpstreamsOrigin(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"http://127.0.0.1:3000/v1": "http://127.0.0.1:3000",
		"http://API.example.com":   "http://api.example.com:80",
		"https://api.example.com/": "https://api.example.com:443",
		"http://[::1]:8080":        "http://::1:8080",
		// A userinfo is no part of the namespace: it is never stored
		// with the keys, and adding one keeps the keys found.
		"http://user:hunter2@127.0.0.1:3000/v1": "http://127.0.0.1:3000",
	} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		require.Equal(t, want, DefaultNamespace(u), raw)
		require.NoError(t, CheckNamespace(DefaultNamespace(u)), raw)
	}
}

// TestNamespacedScopeIsPinned pins the stored scope of a (namespace,
// scope) pair; the Caddy module's TestNamespacedScopeIsTheGatewaysTwin
// pins the same string, so that a Caddy site and oncekey proxy of one
// namespace share their keys.
func TestNamespacedScopeIsPinned(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ns:payments-api|acct-9", NamespacedScope("payments-api", "acct-9"))
}
