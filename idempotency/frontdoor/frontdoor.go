// Package frontdoor is what a gateway in front of another team's API needs
// to speak to that API's clients in their own terms: where they put the
// key (KeyPlace), which answers they understand for a key in flight or
// reused (Profile), and the shape of the errors the gateway writes itself
// (Template). A client written for an API that never declared a 202 takes
// every 2xx as its result, and an SDK that reads errors from an `error`
// member takes a problem document for a success: the gateway must answer
// as the upstream would.
//
// oncekey proxy and the Caddy module (idempotency/caddymodule) both use it,
// so that the two answer alike.
package frontdoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/oncekey/oncekey/idempotency"
)

// Profile names the answers a gateway gives a key in flight and a key
// reused with another request.
type Profile string

// The profiles.
const (
	// IETF answers as draft-ietf-httpapi-idempotency-key-header §2.7: a
	// duplicate still in flight (after the wait) 409 with Retry-After, a key
	// reused with another request 422, a missing key 400. Clients retry
	// 409 and do not retry 422; none takes either for a result.
	IETF Profile = "ietf"
	// Oncekey answers as the oncekey service does: 202 with Retry-After
	// for a duplicate in flight, 409 for a key reused. Only for clients
	// generated from a document that declares the 202.
	Oncekey Profile = "oncekey"
)

// ParseProfile reads a profile's name; empty is IETF, the default.
func ParseProfile(name string) (Profile, error) {
	switch p := Profile(name); p {
	case "":
		return IETF, nil
	case IETF, Oncekey:
		return p, nil
	}
	return "", fmt.Errorf("profile %q: want ietf or oncekey", name)
}

// ProblemOf is idempotency.ProblemOf with the statuses of profile p.
// Outcome unknown and response not stored are 409 in both.
func (p Profile) ProblemOf(err error) idempotency.Problem {
	prob := idempotency.ProblemOf(err)
	if p == Oncekey {
		return prob
	}
	switch {
	case errors.Is(err, idempotency.ErrInFlight):
		prob.Status = http.StatusConflict
	case errors.Is(err, idempotency.ErrKeyMismatch):
		prob.Status = http.StatusUnprocessableEntity
	}
	return prob
}

// Answer is one answer a gateway writes itself, in the words of an RFC
// 9457 problem: Code is its short name (such as idempotency-key-mismatch),
// Type its type URI.
type Answer struct {
	Status                    int
	Type, Code, Title, Detail string
}

// AnswerFor is the answer for err, one of the protocol's errors, under
// profile p, with type URIs typeBase + code ("about:blank" when typeBase
// is empty), the detail the engine's own writer gives it.
func AnswerFor(p Profile, typeBase string, err error) Answer {
	prob := p.ProblemOf(err)
	return Answer{Status: prob.Status, Type: TypeURI(typeBase, prob.Slug), Code: prob.Slug, Title: prob.Title, Detail: prob.Detail}
}

// TypeURI is the type URI of the problem code under typeBase.
func TypeURI(typeBase, code string) string {
	if typeBase == "" {
		return "about:blank"
	}
	return typeBase + code
}

// Writer is an idempotency.Config.WriteError that answers under profile p,
// in template t's shape (RFC 9457 problem+json when t is nil).
func Writer(p Profile, t *Template, typeBase string) func(w http.ResponseWriter, r *http.Request, err error) {
	return func(w http.ResponseWriter, _ *http.Request, err error) {
		Write(w, t, AnswerFor(p, typeBase, err))
	}
}

// Write answers with a: template t filled in, as application/json, or an
// RFC 9457 problem+json document when t is nil. Headers already set
// (Retry-After) stay.
func Write(w http.ResponseWriter, t *Template, a Answer) {
	contentType := "application/json"
	if t == nil {
		t, contentType = problemDocument, "application/problem+json"
	}
	body := t.Render(a)
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(a.Status)
	_, _ = w.Write(body)
}

// problemDocument is the RFC 9457 problem document, as the engine's own
// writer shapes it: {status} fills in a number, outside quotes.
var problemDocument = &Template{parts: []string{
	`{"type":"`, "type", `","title":"`, "title", `","status":`, "status", `,"detail":"`, "detail", `"}`,
}}

// placeholders are the names a template's strings may hold in braces.
var placeholders = []string{"type", "title", "detail", "code", "status"}

// Template is a JSON document in an API's own error shape, whose string
// values hold placeholders ({type}, {title}, {detail}, {code}, {status})
// that each answer fills in, such as Stripe's
//
//	{"error": {"type": "idempotency_error", "code": "{code}", "message": "{detail}"}}
type Template struct {
	// parts are the document's bytes split at its placeholders: literal
	// JSON, then a placeholder's name, alternately.
	parts []string
}

// ParseTemplate reads a template, and fails with one line on a document
// that is not JSON or names a placeholder that does not exist.
func ParseTemplate(raw []byte) (*Template, error) {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("error template: not a JSON document: %v", err)
	}
	// The document is kept as written, member order and all; only its
	// string values that hold a placeholder are cut at it.
	t := &Template{}
	var out bytes.Buffer
	for i := 0; i < len(raw); {
		if raw[i] != '"' {
			out.WriteByte(raw[i])
			i++
			continue
		}
		end := i + 1
		for raw[end] != '"' {
			if raw[end] == '\\' {
				end++
			}
			end++
		}
		end++
		literal := raw[i:end]
		i = end
		rest := bytes.TrimLeft(raw[end:], " \t\r\n")
		var s string
		_ = json.Unmarshal(literal, &s) // it parsed as part of the document
		if (len(rest) > 0 && rest[0] == ':') || !strings.Contains(s, "{") {
			out.Write(literal) // a member's name, or a value without placeholders
			continue
		}
		if err := t.appendString(&out, s); err != nil {
			return nil, err
		}
	}
	t.parts = append(t.parts, out.String())
	return t, nil
}

// appendString writes s, a string value of the template, as JSON, cutting
// t.parts at each placeholder.
func (t *Template) appendString(out *bytes.Buffer, s string) error {
	out.WriteByte('"')
	for {
		start := strings.IndexByte(s, '{')
		end := -1
		if start >= 0 {
			end = strings.IndexByte(s[start:], '}')
		}
		if start < 0 || end < 0 {
			writeEscaped(out, s)
			break
		}
		name := s[start+1 : start+end]
		if !isPlaceholderName(name) {
			// Braces around something that is no name ("{}", "{a b}") are
			// text.
			writeEscaped(out, s[:start+1])
			s = s[start+1:]
			continue
		}
		if !knownPlaceholder(name) {
			return fmt.Errorf("error template: unknown placeholder {%s}; the placeholders are {%s}", name, strings.Join(placeholders, "}, {"))
		}
		writeEscaped(out, s[:start])
		t.parts = append(t.parts, out.String(), name)
		out.Reset()
		s = s[start+end+1:]
	}
	out.WriteByte('"')
	return nil
}

func isPlaceholderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

func knownPlaceholder(name string) bool {
	for _, p := range placeholders {
		if p == name {
			return true
		}
	}
	return false
}

// writeEscaped writes s JSON-escaped, without quotes.
func writeEscaped(out *bytes.Buffer, s string) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	out.Write(b[1 : len(b)-1])
}

// Render is the template filled in with a, each value JSON-escaped.
func (t *Template) Render(a Answer) []byte {
	values := map[string]string{
		"type": a.Type, "title": a.Title, "detail": a.Detail, "code": a.Code, "status": strconv.Itoa(a.Status),
	}
	var out bytes.Buffer
	for i, part := range t.parts {
		if i%2 == 0 {
			out.WriteString(part)
		} else {
			writeEscaped(&out, values[part])
		}
	}
	return out.Bytes()
}
