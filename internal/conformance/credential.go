package conformance

import (
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

// credential is a test account's credential where the API reads it: a
// header, a query parameter or a cookie. The zero credential sends none.
type credential struct {
	in    string // openapi3.ParameterInHeader, InQuery or InCookie; "": none
	name  string // the header, parameter or cookie
	value string
}

// apply puts c on req. A query credential replaces any parameter of its
// name (the document may declare it, and build fill it from an example);
// a cookie joins the cookies the overrides give.
func (c credential) apply(req *http.Request) {
	switch c.in {
	case openapi3.ParameterInHeader:
		req.Header.Set(c.name, c.value)
	case openapi3.ParameterInQuery:
		var kept []string
		for part := range strings.SplitSeq(req.URL.RawQuery, "&") {
			k, _, _ := strings.Cut(part, "=")
			if name, err := url.QueryUnescape(k); part == "" || (err == nil && name == c.name) {
				continue
			}
			kept = append(kept, part)
		}
		req.URL.RawQuery = strings.Join(append(kept, url.QueryEscape(c.name)+"="+url.QueryEscape(c.value)), "&")
	case openapi3.ParameterInCookie:
		pair := c.name + "=" + c.value
		if old := req.Header.Get("Cookie"); old != "" {
			pair = old + "; " + pair
		}
		req.Header.Set("Cookie", pair)
	}
}

// hideURL returns err with the URL it names (a *url.Error's) replaced by
// shown, the request's URL before its credential was applied: a credential
// in the query must not reach a report or a CI log through a failed
// request's reason.
func hideURL(err error, shown string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = shown
	}
	return err
}

// credentials parses cfg.Auth and cfg.Auth2 into where each goes. A bare
// value is placed by the document's security, which is read only then: a
// credential given as "Name: value" runs against any document.
func (s *session) credentials() error {
	for _, c := range []struct {
		flag, auth string
		dst        *credential
	}{{"--auth", s.cfg.Auth, &s.auth}, {"--auth2", s.cfg.Auth2, &s.auth2}} {
		cred, bare, err := parseCredential(c.auth)
		if err == nil && bare {
			var scheme *namedScheme
			if scheme, err = s.scheme(); err == nil {
				cred, err = scheme.place(c.auth)
			}
		}
		if err != nil {
			return fmt.Errorf("conformance: %s: %w", c.flag, err)
		}
		*c.dst = cred
	}
	return nil
}

// parseCredential reads a credential as --auth takes it:
//
//   - "Name: value", a header token, a colon and whitespace: that header.
//   - "Scheme value", a token, a space and the rest ("Bearer sk_test_…",
//     "Basic dXNlcjpwdw=="): the Authorization header, as given.
//   - anything else is a bare value (bare is true), for the document's
//     security to place. "user:password" is one: without whitespace after
//     its colon it is no header.
func parseCredential(auth string) (c credential, bare bool, err error) {
	if auth == "" {
		return c, false, nil
	}
	if strings.ContainsFunc(auth, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
		return c, false, errors.New("the credential has a control character (a newline?)")
	}
	if name, value, ok := strings.Cut(auth, ":"); ok && isToken(name) && value != "" && (value[0] == ' ' || value[0] == '\t') {
		if value = strings.TrimSpace(value); value == "" {
			return c, false, fmt.Errorf("the header %s is given no value", name)
		}
		return credential{in: openapi3.ParameterInHeader, name: name, value: value}, false, nil
	}
	if word, rest, ok := strings.Cut(auth, " "); ok && isToken(word) && strings.TrimSpace(rest) != "" {
		return credential{in: openapi3.ParameterInHeader, name: "Authorization", value: auth}, false, nil
	}
	return c, true, nil
}

// isToken reports whether s is an HTTP token (RFC 9110 §5.6.2): what a
// header's name and an authentication scheme are made of.
func isToken(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
	})
}

// namedScheme is a security scheme of the document with its name; nil
// places a bare value as today's tools do: the Authorization header, as
// given.
type namedScheme struct {
	name string
	*openapi3.SecurityScheme
}

// placeable reports whether the tool can put one value where ss asks for
// it.
func placeable(ss *openapi3.SecurityScheme) bool {
	switch ss.Type {
	case "apiKey":
		return slices.Contains([]string{openapi3.ParameterInHeader, openapi3.ParameterInQuery, openapi3.ParameterInCookie}, ss.In)
	case "http":
		return strings.EqualFold(ss.Scheme, "bearer") || strings.EqualFold(ss.Scheme, "basic")
	case "oauth2", "openIdConnect":
		return true
	}
	return false
}

// place is where the bare value v goes under n. A Basic value is
// "user:password"; one without a colon is a user with no password (an API
// key sent as Stripe takes it, "sk_test_…:").
func (n *namedScheme) place(v string) (credential, error) {
	auth := func(value string) credential {
		return credential{in: openapi3.ParameterInHeader, name: "Authorization", value: value}
	}
	switch {
	case n == nil:
		return auth(v), nil
	case n.Type == "apiKey":
		if n.In == openapi3.ParameterInCookie && strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || strings.ContainsRune("\",;\\", r) || r >= 0x7f }) {
			return credential{}, fmt.Errorf("the document's security scheme %q takes it as the cookie %s, and a cookie's value cannot hold spaces, quotes, commas, semicolons or backslashes", n.name, n.Name)
		}
		return credential{in: n.In, name: n.Name, value: v}, nil
	case n.Type == "http" && strings.EqualFold(n.Scheme, "basic"):
		if !strings.Contains(v, ":") {
			v += ":"
		}
		return auth("Basic " + base64.StdEncoding.EncodeToString([]byte(v))), nil
	}
	return auth("Bearer " + v), nil // http bearer, oauth2, openIdConnect
}

// scheme is where the document says a bare credential goes: the first
// security requirement of one scheme the tool can place that every covered
// operation asking for credentials accepts (its own security, else the
// document's). Without securitySchemes, or without requirements and with
// other than one scheme, it is nil (the Authorization header).
func (s *session) scheme() (*namedScheme, error) {
	doc := s.cfg.Spec
	if doc.Components == nil || len(doc.Components.SecuritySchemes) == 0 {
		return nil, nil
	}
	declared := func(name string) *openapi3.SecurityScheme {
		if ref := doc.Components.SecuritySchemes[name]; ref != nil {
			return ref.Value
		}
		return nil
	}
	type asking struct {
		op   string
		reqs openapi3.SecurityRequirements
	}
	var ops []asking
	for _, t := range s.covered {
		reqs := slices.DeleteFunc(slices.Clone(securityOf(doc, t)), func(r openapi3.SecurityRequirement) bool { return len(r) == 0 })
		if len(reqs) > 0 {
			ops = append(ops, asking{t.name, reqs})
		}
	}
	if len(ops) == 0 {
		if len(doc.Components.SecuritySchemes) == 1 {
			for name, ref := range doc.Components.SecuritySchemes {
				if ref.Value != nil && placeable(ref.Value) {
					return &namedScheme{name, ref.Value}, nil
				}
			}
		}
		return nil, nil
	}
	single := func(r openapi3.SecurityRequirement) string { // "": none, or more than one
		for name := range r {
			if len(r) == 1 {
				return name
			}
		}
		return ""
	}
	var candidates []string
	for _, o := range ops {
		for _, r := range o.reqs {
			if name := single(r); name != "" && declared(name) != nil && placeable(declared(name)) && !slices.Contains(candidates, name) {
				candidates = append(candidates, name)
			}
		}
	}
	for _, name := range candidates {
		if !slices.ContainsFunc(ops, func(o asking) bool {
			return !slices.ContainsFunc(o.reqs, func(r openapi3.SecurityRequirement) bool { return single(r) == name })
		}) {
			return &namedScheme{name, declared(name)}, nil
		}
	}
	const hint = `; give it as "Header-Name: value" (e.g. "X-API-Key: …") or "Scheme value"`
	if len(candidates) > 0 {
		var asks []string
		for _, o := range ops {
			asks = append(asks, o.op+" asks for "+describeRequirements(o.reqs, declared))
		}
		return nil, fmt.Errorf("a bare value goes where the document's security says, and no one place serves every operation (%s)%s", strings.Join(asks, "; "), hint)
	}
	return nil, fmt.Errorf("a bare value goes where the document's security says, and %s asks for %s, where the tool cannot place one value%s",
		ops[0].op, describeRequirements(ops[0].reqs, declared), hint)
}

// securityOf is what t asks of its callers' credentials: its own security,
// else the document's.
func securityOf(doc *openapi3.T, t *target) openapi3.SecurityRequirements {
	if item := doc.Paths.Value(t.path); item != nil {
		if op := item.GetOperation(t.method); op != nil && op.Security != nil {
			return *op.Security
		}
	}
	return doc.Security
}

// describeRequirements names what reqs ask for: "mtls (mutualTLS) or
// key (apiKey in header X-API-Key) and app (apiKey in query app_id)".
func describeRequirements(reqs openapi3.SecurityRequirements, declared func(string) *openapi3.SecurityScheme) string {
	var alternatives []string
	for _, r := range reqs {
		var all []string
		for _, name := range slices.Sorted(maps.Keys(r)) {
			what := "not declared in components.securitySchemes"
			switch ss := declared(name); {
			case ss == nil:
			case ss.Type == "apiKey":
				what = "apiKey in " + ss.In + " " + ss.Name
			case ss.Type == "http":
				what = "http " + ss.Scheme
			default:
				what = ss.Type
			}
			all = append(all, fmt.Sprintf("%s (%s)", name, what))
		}
		alternatives = append(alternatives, strings.Join(all, " and "))
	}
	return strings.Join(alternatives, " or ")
}
