package gateway

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// A covered route must match the path as the upstream will read it. An
// unsafe request whose path upstreams read in different ways is refused
// (frontdoor.AmbiguousPath), and covered routes match what is left
// case-insensitively (segmentMatches). Safe requests pass through as they
// are: they take no key.

// AmbiguousPath is the problem of an unsafe request whose path upstreams
// read in different ways.
var AmbiguousPath = problem.Kind{
	Slug: "ambiguous-path", Status: http.StatusBadRequest, Title: "The request's path is ambiguous",
	When:        "An unsafe request (POST, PUT, PATCH, DELETE) whose path has a dot segment (`.`, `..`, also encoded), an empty segment (`//`; one trailing `/` is allowed), a `\\`, an encoded `/` or `\\` (`%2F`, `%5C`), a `;` or a control character: upstreams read such a path in different ways, so the gateway cannot tell whether a covered route is meant. Nothing was sent upstream.",
	KeyConsumed: "no",
}

// ambiguous answers an unsafe request whose path is ambiguous with 400,
// before any key is read; nil for any other request.
func ambiguous(r *http.Request, answers answers) http.Handler {
	if !idempotency.Unsafe(r.Method) {
		return nil
	}
	why := frontdoor.AmbiguousPath(r.URL)
	if why == "" {
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answers.kind(w, r, AmbiguousPath, fmt.Sprintf("the path %q is ambiguous: %s; send it as the upstream names it", r.URL.EscapedPath(), why))
	})
}

// segmentMatches reports whether a path segment matches a route's literal
// segment: case-insensitively, as many upstream frameworks route (RFC 3986
// makes paths case-sensitive, but the upstream decides), so that no
// spelling of a covered path in another case passes the protocol by. The
// fingerprint keeps the path as sent.
func segmentMatches(literal, got string) bool {
	return strings.EqualFold(literal, got)
}
