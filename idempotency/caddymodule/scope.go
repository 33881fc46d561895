package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/oncekey/oncekey/idempotency"
)

// Placeholders whose value Caddy joins from several of a request's
// (modules/caddyhttp/replacer.go): two X-User headers read "bob,alice".
const (
	headerPlaceholder = "http.request.header."
	queryPlaceholder  = "http.request.uri.query."
	cookiePlaceholder = "http.request.cookie."
)

// scopeOf returns the scope of a request under the site's template (a
// Caddy placeholder expression), stored in namespace ns when one is
// given. Every placeholder must be known, hold a value and, for a header,
// a query parameter or a cookie, be sent once: "user:{…X-User}" of a
// request without the header would be "user:", one scope shared by every
// anonymous caller, each replaying the others' answers; of two headers,
// which one names the caller is not clear. The scope as stored must fit
// idempotency.MaxScopeLength. Every error wraps idempotency.ErrNoScope
// (401), as oncekey proxy's scope sources (internal/keyscope) answer, and
// the request runs nothing and touches no key.
func scopeOf(template, ns string) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		if !ok {
			return "", idempotency.ErrNoScope
		}
		scope, err := repl.ReplaceFunc(template, func(placeholder string, value any) (any, error) {
			if _, known := repl.Get(placeholder); !known {
				return nil, fmt.Errorf("%w: the scope's placeholder {%s} is unknown", idempotency.ErrNoScope, placeholder)
			}
			if n := sent(r, placeholder); n > 1 {
				return nil, fmt.Errorf("%w: the scope's placeholder {%s} has %d values; send one", idempotency.ErrNoScope, placeholder, n)
			}
			if caddy.ToString(value) == "" {
				return nil, fmt.Errorf("%w: the scope's placeholder {%s} is empty", idempotency.ErrNoScope, placeholder)
			}
			return value, nil
		})
		switch {
		case err != nil && !errors.Is(err, idempotency.ErrNoScope):
			// Caddy's own ("too many unclosed placeholders").
			return "", fmt.Errorf("%w: %v", idempotency.ErrNoScope, err)
		case err != nil:
			return "", err
		case scope == "":
			return "", idempotency.ErrNoScope
		}
		stored := scope
		if ns != "" {
			stored = namespacedScope(ns, scope)
		}
		if len(stored) > idempotency.MaxScopeLength {
			limit := idempotency.MaxScopeLength - (len(stored) - len(scope)) // less the namespace's part
			return "", fmt.Errorf("%w: the scope is %d bytes; this site takes at most %d", idempotency.ErrNoScope, len(scope), limit)
		}
		return stored, nil
	}
}

// sent is how many values r carries for a placeholder that Caddy joins:
// the header's lines, the query parameter's values, the cookies of that
// name (Caddy reads the first, in any case); 1 for any other.
func sent(r *http.Request, placeholder string) int {
	if name, ok := strings.CutPrefix(placeholder, headerPlaceholder); ok {
		return len(r.Header.Values(name))
	}
	if name, ok := strings.CutPrefix(placeholder, queryPlaceholder); ok {
		return len(r.URL.Query()[name])
	}
	if name, ok := strings.CutPrefix(placeholder, cookiePlaceholder); ok {
		n := 0
		for _, c := range r.Cookies() {
			if strings.EqualFold(c.Name, name) {
				n++
			}
		}
		return n
	}
	return 1
}

// checkScope reports a scope template that would be one scope for every
// request: one without a placeholder, or with a "{" it does not close,
// which Caddy leaves as it is.
func checkScope(template string) error {
	n := 0
	for i := 0; i < len(template); i++ {
		if template[i] != '{' || (i > 0 && template[i-1] == '\\') {
			continue
		}
		end := strings.IndexByte(template[i:], '}')
		if end < 0 {
			return fmt.Errorf("%q opens a placeholder it does not close", template)
		}
		n, i = n+1, i+end
	}
	if n == 0 {
		return fmt.Errorf("%q holds no placeholder: it would be one scope for every caller", template)
	}
	return nil
}
