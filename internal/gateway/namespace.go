package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"
)

// A gateway's keys live in a namespace of its own, so that two gateways in
// front of different upstreams that share one key table never meet: the
// scope stored with a key is the namespace and the caller's scope joined
// as "ns:" + namespace + "|" + scope. A namespace holds no "|", so the
// first "|" after the prefix always ends it, and no two (namespace, scope)
// pairs are stored alike. Keys that a gateway stored before namespaces
// existed carry the caller's scope alone (see LegacyScopes).
const (
	namespacePrefix = "ns:"
	namespaceEnd    = "|"
	// MaxNamespaceLength bounds a namespace: it is stored with every key.
	MaxNamespaceLength = 200
)

// CheckNamespace reports why ns cannot name a gateway's keys: empty, too
// long, holding a "|", or a character that is not printable.
func CheckNamespace(ns string) error {
	switch {
	case ns == "":
		return errors.New("the namespace is empty")
	case len(ns) > MaxNamespaceLength:
		return fmt.Errorf("the namespace is %d bytes; at most %d", len(ns), MaxNamespaceLength)
	case strings.Contains(ns, namespaceEnd):
		return fmt.Errorf("the namespace %q holds a %q", ns, namespaceEnd)
	case strings.IndexFunc(ns, func(r rune) bool { return !unicode.IsPrint(r) || r == unicode.ReplacementChar }) >= 0:
		return fmt.Errorf("the namespace %q holds a character that is not printable", ns)
	}
	return nil
}

// DefaultNamespace is the namespace of a gateway given none: its
// upstream's origin (scheme://host:port, the port always written), so
// that gateways in front of one upstream share keys and gateways in front
// of two never do.
func DefaultNamespace(upstream *url.URL) string {
	port := upstream.Port()
	if port == "" {
		port = "80"
		if upstream.Scheme == "https" {
			port = "443"
		}
	}
	return strings.ToLower(upstream.Scheme) + "://" + strings.ToLower(upstream.Hostname()) + ":" + port
}

// NamespacedScope is the scope a key of caller scope is stored under in
// namespace ns.
func NamespacedScope(ns, scope string) string {
	return namespacePrefix + ns + namespaceEnd + scope
}

// namespaced is scope, its answers stored in namespace ns. An empty scope
// stays empty, so that the engine still refuses it (ErrNoScope).
func namespaced(ns string, scope func(*http.Request) (string, error)) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		s, err := scope(r)
		if err != nil || s == "" {
			return s, err
		}
		return NamespacedScope(ns, s), nil
	}
}

// SplitScope reads a stored scope back into its namespace and the
// caller's scope; ok is false for a key stored before namespaces (or by
// the service), whose scope is the caller's alone.
func SplitScope(stored string) (ns, scope string, ok bool) {
	rest, found := strings.CutPrefix(stored, namespacePrefix)
	if !found {
		return "", stored, false
	}
	ns, scope, found = strings.Cut(rest, namespaceEnd)
	if !found {
		return "", stored, false
	}
	return ns, scope, true
}
