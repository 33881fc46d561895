package caddymodule

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
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

// scopeRule is how a site stores the scope of a request: its template (a
// Caddy placeholder expression), the namespace ns, if any, and, if secret
// is set, as an HMAC of the resolved scope under it (scopeMAC), so that a
// credential used as the scope ({http.request.header.Authorization}) is
// never stored or logged. previous are the secrets before a rotation.
type scopeRule struct {
	template, ns string
	secret       *scopeMAC
	previous     []scopeMAC
}

// scopeOf returns the scope of a request under rule, as stored. Every
// placeholder must be known, hold a value and, for a header, a query
// parameter or a cookie, be sent once: "user:{…X-User}" of a request
// without the header would be "user:", one scope shared by every
// anonymous caller, each replaying the others' answers; of two headers,
// which one names the caller is not clear. The scope as stored (hashed,
// with its namespace) must fit idempotency.MaxScopeLength. Every error
// wraps idempotency.ErrNoScope (401), as oncekey proxy's scope sources
// (internal/gateway/keyscope) answer, and the request runs nothing and touches
// no key. The scopes a key of the request may have been stored under by
// the site's earlier rules (oldScopes) go with the request's context, for
// legacyScopes.
func scopeOf(rule scopeRule) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		scope, err := resolve(r, rule.template)
		if err != nil {
			return "", err
		}
		bare := scope
		if rule.secret != nil {
			bare = rule.secret.of(scope)
		}
		stored := bare
		if rule.ns != "" {
			stored = namespacedScope(rule.ns, bare)
		}
		if len(stored) > idempotency.MaxScopeLength && rule.secret != nil {
			// Not with a namespace Validate takes.
			return "", fmt.Errorf("%w: the scope as stored is %d bytes; at most %d", idempotency.ErrNoScope, len(stored), idempotency.MaxScopeLength)
		}
		if len(stored) > idempotency.MaxScopeLength {
			limit := idempotency.MaxScopeLength - (len(stored) - len(scope)) // less the namespace's part
			return "", fmt.Errorf("%w: the scope is %d bytes; this site takes at most %d", idempotency.ErrNoScope, len(scope), limit)
		}
		if olds, ok := r.Context().Value(oldScopesKey{}).(*oldScopes); ok {
			olds.rule, olds.resolved = rule, scope
		}
		return stored, nil
	}
}

// resolve is template with the request's placeholders replaced, each
// checked as scopeOf says.
func resolve(r *http.Request, template string) (string, error) {
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
	return scope, nil
}

// oldScopesKey carries a request's *oldScopes, which scopeOf fills in.
type oldScopesKey struct{}

// oldScopes is what a request's scope was resolved to, from which
// legacyScopes computes, only while keys of them may remain, the scopes
// that the site's earlier rules stored it under.
type oldScopes struct {
	rule     scopeRule
	resolved string
}

// withOldScopes is r with an oldScopes for scopeOf to fill in.
func withOldScopes(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), oldScopesKey{}, new(oldScopes)))
}

// oldScopesOf is the *oldScopes of ctx, if scopeOf filled one in.
func oldScopesOf(ctx context.Context) (*oldScopes, bool) {
	o, ok := ctx.Value(oldScopesKey{}).(*oldScopes)
	if !ok || o.resolved == "" {
		return nil, false
	}
	return o, true
}

// previous is the scopes, as stored, that the site stored the request's
// key under before its secret (the resolved scope, namespaced) or under
// a previous secret; none without a secret. A scope too long to have
// been stored is left out.
func (o *oldScopes) previous() []string {
	if o.rule.secret == nil {
		return nil
	}
	bare := []string{o.resolved}
	for _, m := range o.rule.previous {
		bare = append(bare, m.of(o.resolved))
	}
	return fit(o.rule.ns, bare)
}

// beforeNamespaces is the scope the request's key was stored under before
// namespaces (no secret then either): the resolved scope alone.
func (o *oldScopes) beforeNamespaces() []string {
	if o.rule.ns == "" {
		return nil
	}
	return fit("", []string{o.resolved})
}

// fit is scopes in namespace ns, less those no store would have taken.
func fit(ns string, scopes []string) []string {
	out := make([]string, 0, len(scopes))
	for _, s := range scopes {
		if ns != "" {
			s = namespacedScope(ns, s)
		}
		if len(s) <= idempotency.MaxScopeLength {
			out = append(out, s)
		}
	}
	return out
}

// minSecret is the shortest scope_secret taken: as long as the HMAC's
// hash.
const minSecret = 32

// scopeMAC is a scope secret and the prefix of the scopes stored under it:
// "hmac:", the secret's id (8 hex digits of a hash of it that reveals
// nothing of it) and ":", worked out once, as the id is an HMAC too. It is
// the twin of scopeMAC in internal/gateway/keyscope (oncekey proxy
// --scope-authorization), which this module cannot import: one secret
// gives one stored scope for one Authorization value in both, so that a
// site and a proxy share keys, and the operators' tools and the recipe in
// docs/operations.md read both (TestMACScopeIsTheProxysTwin pins it).
type scopeMAC struct {
	secret []byte
	prefix string
}

func newScopeMAC(secret []byte) scopeMAC {
	id := hmac.New(sha256.New, secret)
	id.Write([]byte("oncekey scope secret id"))
	return scopeMAC{secret: secret, prefix: "hmac:" + hex.EncodeToString(id.Sum(nil))[:8] + ":"}
}

// of is the scope stored for a resolved scope v: the prefix and the hex
// HMAC-SHA256 of v.
func (m scopeMAC) of(v string) string {
	mac := hmac.New(sha256.New, m.secret)
	mac.Write([]byte(v))
	return m.prefix + hex.EncodeToString(mac.Sum(nil))
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
