package caddymodule

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// namespacedScope is the scope a key of the caller's scope is stored under
// in namespace ns: "ns:" + ns + "|" + scope. It is the twin of
// NamespacedScope in internal/gateway/namespace.go (oncekey proxy), which
// this module, another Go module, cannot import: a site and a proxy given
// one namespace share their keys, so the two must store alike (both
// packages' tests pin the same stored string).
func namespacedScope(ns, scope string) string {
	return namespacePrefix + ns + namespaceEnd + scope
}

// The stored scope's parts, as internal/gateway/namespace.go names them.
const (
	namespacePrefix = "ns:"
	namespaceEnd    = "|"
)

// bareScope is the caller's scope of a namespaced stored scope; false for
// a key stored before namespaces, whose scope is the caller's alone. It is
// SplitScope of internal/gateway/namespace.go, but the namespace.
func bareScope(stored string) (string, bool) {
	rest, found := strings.CutPrefix(stored, namespacePrefix)
	if !found {
		return stored, false
	}
	_, scope, found := strings.Cut(rest, namespaceEnd)
	if !found {
		return stored, false
	}
	return scope, true
}

// checkNamespace reports why ns cannot name a site's keys, as
// CheckNamespace in internal/gateway/namespace.go does: too long, holding
// a "|" (which ends a namespace in the stored scope), or a character that
// is not printable.
func checkNamespace(ns string) error {
	switch {
	case len(ns) > 200:
		return fmt.Errorf("%q is %d bytes; at most 200", ns, len(ns))
	case strings.Contains(ns, namespaceEnd):
		return fmt.Errorf("%q holds a \"|\"", ns)
	case strings.IndexFunc(ns, func(r rune) bool { return !unicode.IsPrint(r) || r == unicode.ReplacementChar }) >= 0:
		return errors.New("it holds a character that is not printable")
	}
	return nil
}
