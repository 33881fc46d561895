package conformance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
)

// keyPlace is where an operation's clients send the key: a header (the
// draft's Idempotency-Key, or a name of the API's own such as
// X-Idempotency-Key) or a top-level member of the body (Square's
// idempotency_key). APIs designed before the draft use all of these, and a
// check that sends the key elsewhere tests nothing.
type keyPlace struct {
	header string // "" where the key is in the body
	field  string
}

// String is how --plan shows the place.
func (k keyPlace) String() string {
	if k.field != "" {
		return "body field " + k.field
	}
	return "header " + k.header
}

// keyField reads --key-field: a member's name, or a JSON pointer to a
// top-level member ("/idempotency_key", as oncekey proxy takes it).
func keyField(flag string) (string, error) {
	name := strings.TrimPrefix(flag, "/")
	if name == "" || strings.ContainsAny(name, "/~") {
		return "", fmt.Errorf("conformance: --key-field %q: the key is a top-level member of the body, such as idempotency_key", flag)
	}
	return name, nil
}

// declaredKeyHeader is the header parameter, of the path item's or the
// operation's, whose name ends in Idempotency-Key, case aside
// (Idempotency-Key, X-Idempotency-Key, x-fapi-idempotency-key): "" if
// none. A gateway in front of the API (oncekey proxy --spec) reads the
// key there too.
func declaredKeyHeader(params ...openapi3.Parameters) string {
	for _, ps := range params {
		for _, p := range ps {
			if p.Value != nil && p.Value.In == openapi3.ParameterInHeader &&
				strings.HasSuffix(strings.ToLower(p.Value.Name), strings.ToLower(idempotency.HeaderKey)) {
				return p.Value.Name
			}
		}
	}
	return ""
}

// declaresHeader reports whether the operation declares a header
// parameter called name.
func declaresHeader(name string, params ...openapi3.Parameters) bool {
	for _, ps := range params {
		for _, p := range ps {
			if p.Value != nil && p.Value.In == openapi3.ParameterInHeader && strings.EqualFold(p.Value.Name, name) {
				return true
			}
		}
	}
	return false
}

// declaresField reports whether t's body schema has a top-level member
// called name.
func declaresField(t *target, name string) bool {
	if t.schema == nil || t.schema.Value == nil {
		return false
	}
	_, ok := properties(t.schema.Value)[name]
	return ok
}

// cover decides whether the protocol covers t, and where its key goes. In
// order: x-idempotency: false leaves it out; the document covers the
// operations that declare a header ending in Idempotency-Key, or
// x-idempotency (whose key-header or key-field says where the key goes);
// the flags (--key-header, --key-field) cover those that declare that
// header or body member too, and their place wins over the document's.
func (s *session) cover(t *target, op *oapi.Operation, item *openapi3.PathItem, spec *openapi3.Operation) bool {
	t.key = keyPlace{header: idempotency.HeaderKey}
	if t.optedOut = spec.Extensions[oapi.Extension] == false; t.optedOut {
		return false
	}
	declared := declaredKeyHeader(item.Parameters, spec.Parameters)
	var covered bool
	switch {
	case op.Idempotent || declared != "":
		covered = true
	case s.cfg.KeyField != "":
		covered = declaresField(t, s.cfg.KeyField)
	case s.cfg.KeyHeader != "":
		covered = declaresHeader(s.cfg.KeyHeader, item.Parameters, spec.Parameters)
	}
	if !covered {
		return false
	}
	switch {
	case s.cfg.KeyField != "" || s.cfg.KeyHeader != "":
		t.key = s.flagPlace()
	case op.KeyField != "":
		t.key = keyPlace{field: op.KeyField}
	case op.KeyHeader != "":
		t.key = keyPlace{header: op.KeyHeader}
	case declared != "":
		t.key = keyPlace{header: declared}
	}
	return true
}

// flagPlace is the place --key-field or --key-header gives.
func (s *session) flagPlace() keyPlace {
	if s.cfg.KeyField != "" {
		return keyPlace{field: s.cfg.KeyField}
	}
	return keyPlace{header: s.cfg.KeyHeader}
}

// coverUnsafe is the coverage of a document that declares no key
// anywhere, run with --key-header or --key-field: every operation that is
// not idempotent by HTTP's definition (POST and PATCH, RFC 9110 §9.2.2)
// and that x-idempotency does not leave out, with the key where the flag
// says; for a key in the body, those that take a body.
func (s *session) coverUnsafe() {
	for _, t := range s.byRoute {
		if (t.method == "POST" || t.method == "PATCH") && (s.cfg.KeyField == "" || t.media != "") && !t.optedOut {
			t.key = s.flagPlace()
			s.covered = append(s.covered, t)
		}
	}
}

// withoutKeyField is v, a body built for t, without the member that
// carries t's key: send puts the key there, and a body built from an
// example or schema must not carry a second one.
func withoutKeyField(t *target, v any) any {
	m, ok := v.(map[string]any)
	if !ok || t.key.field == "" {
		return v
	}
	if _, has := m[t.key.field]; !has {
		return v
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		if k != t.key.field {
			out[k] = x
		}
	}
	return out
}

// bodyWithKey is q's body with key as the member field, written in front
// of the others and leaving their bytes as they are: a check that sends
// the same body laid out otherwise (canonical-json) still does.
func bodyWithKey(q request, field, key string) ([]byte, error) {
	if q.contentType == formMedia {
		pair := url.QueryEscape(field) + "=" + url.QueryEscape(key)
		if len(q.body) == 0 {
			return []byte(pair), nil
		}
		return []byte(pair + "&" + string(q.body)), nil
	}
	trimmed := bytes.TrimLeft(q.body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, skipped(fmt.Sprintf("the key goes in the body field %s, and the body is not a JSON object", field))
	}
	member, err := json.Marshal(map[string]string{field: key})
	if err != nil {
		return nil, err
	}
	rest := bytes.TrimLeft(trimmed[1:], " \t\r\n")
	var b bytes.Buffer
	b.Write(member[:len(member)-1]) // {"field":"key"
	if len(rest) > 0 && rest[0] != '}' {
		b.WriteByte(',')
	}
	b.Write(trimmed[1:])
	return b.Bytes(), nil
}
