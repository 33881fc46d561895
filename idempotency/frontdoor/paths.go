package frontdoor

import (
	"net/url"
	"strings"
)

// AmbiguousPath says why upstreams may read u's path as another path, or
// "" when they all read it alike, for a front door that covers routes by
// path in front of an upstream it does not control (a gateway, a Caddy
// site). Upstreams read paths in many ways: most resolve "." and ".."
// segments, many merge "//", some take "\" for "/" or decode "%2F" before
// routing, and Java's servlet containers drop ";" path parameters. A
// spelling the front door read as another path than its upstream does
// would reach the upstream without the protocol, so such a front door
// refuses an unsafe request whose path has a dot segment (also encoded),
// an empty segment (one trailing "/" aside), a "\", an encoded "/" or "\",
// a ";" or a control character.
func AmbiguousPath(u *url.URL) string {
	if u.Opaque != "" {
		return "the request target is not a path"
	}
	if raw := strings.ToLower(u.EscapedPath()); strings.Contains(raw, "%2f") || strings.Contains(raw, "%5c") {
		return `it holds an encoded "/" or "\"`
	}
	p := u.Path
	switch {
	case strings.Contains(p, `\`):
		return `it holds a "\"`
	case strings.Contains(p, ";"):
		return `it holds a ";"`
	case strings.IndexFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return "it holds a control character"
	}
	segments := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, s := range segments {
		switch {
		case s == "." || s == "..":
			return "it has a dot segment"
		case s == "" && i < len(segments)-1:
			return "it has an empty segment"
		}
	}
	return ""
}
