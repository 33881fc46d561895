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
	return "ns:" + ns + "|" + scope
}

// checkNamespace reports why ns cannot name a site's keys, as
// CheckNamespace in internal/gateway/namespace.go does: too long, holding
// a "|" (which ends a namespace in the stored scope), or a character that
// is not printable.
func checkNamespace(ns string) error {
	switch {
	case len(ns) > 200:
		return fmt.Errorf("%q is %d bytes; at most 200", ns, len(ns))
	case strings.Contains(ns, "|"):
		return fmt.Errorf("%q holds a \"|\"", ns)
	case strings.IndexFunc(ns, func(r rune) bool { return !unicode.IsPrint(r) || r == unicode.ReplacementChar }) >= 0:
		return errors.New("it holds a character that is not printable")
	}
	return nil
}
