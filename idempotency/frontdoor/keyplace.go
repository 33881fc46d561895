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

// KeyPlace is where a request carries its key: a header (Idempotency-Key,
// X-Idempotency-Key, PayPal-Request-Id) or a member of its JSON body,
// named by a JSON pointer (RFC 6901) such as /idempotency_key. The zero
// KeyPlace is the Idempotency-Key header.
type KeyPlace struct {
	Header    string
	BodyField string
}

// Check reports a place that names both a header and a body field, or a
// body field that is not a JSON pointer.
func (k KeyPlace) Check() error {
	switch {
	case k.Header != "" && k.BodyField != "":
		return fmt.Errorf("the key is in a header (%s) or in a body field (%s), not both", k.Header, k.BodyField)
	case k.BodyField != "" && !strings.HasPrefix(k.BodyField, "/"):
		return fmt.Errorf("the key's body field %q is not a JSON pointer such as /idempotency_key", k.BodyField)
	case strings.ContainsAny(k.Header, " \t:"):
		return fmt.Errorf("the key's header %q is not a header name", k.Header)
	}
	return nil
}

// InBody says whether the key is read from the body.
func (k KeyPlace) InBody() bool { return k.BodyField != "" }

// HeaderName is the header the key is read from, and repeated in on the
// answers, as configured (HTTP reads header names in any case):
// Idempotency-Key for a key in the body.
func (k KeyPlace) HeaderName() string {
	if k.Header == "" {
		return idempotency.HeaderKey
	}
	return k.Header
}

// String names the place as the docs and logs do.
func (k KeyPlace) String() string {
	if k.InBody() {
		return "body " + k.BodyField
	}
	return "header " + k.HeaderName()
}

// keyError is an error of idempotency.ErrMissingKey's or ErrInvalidKey's
// kind, in words that name the place the key was looked for.
type keyError struct {
	msg  string
	kind error
}

func (e *keyError) Error() string { return e.msg }
func (e *keyError) Unwrap() error { return e.kind }

// Key reads the key from h, or from body for a body field, under the
// engine's rules (idempotency.ParseKey). A missing key wraps
// idempotency.ErrMissingKey; an invalid one (a header sent twice, a body
// member that is not a string) idempotency.ErrInvalidKey; a body that is
// not JSON idempotency.ErrMalformedBody. All are 400.
func (k KeyPlace) Key(h http.Header, body []byte) (string, error) {
	if !k.InBody() {
		name := k.HeaderName()
		values := h.Values(name)
		switch {
		case len(values) == 0:
			return "", &keyError{fmt.Sprintf("the %s header is required on this operation", name), idempotency.ErrMissingKey}
		case len(values) > 1:
			return "", &keyError{fmt.Sprintf("invalid %s: send exactly one %s header, got %d", name, name, len(values)), idempotency.ErrInvalidKey}
		}
		if _, err := idempotency.ParseKey(values); err != nil {
			return "", &keyError{fmt.Sprintf("the %s header: %v", name, err), idempotency.ErrInvalidKey}
		}
		return values[0], nil
	}
	v, found, err := pointer(body, k.BodyField)
	if err != nil {
		return "", fmt.Errorf("%w: %v", idempotency.ErrMalformedBody, err)
	}
	if !found {
		return "", &keyError{fmt.Sprintf("the body member %s, the idempotency key, is required on this operation", k.BodyField), idempotency.ErrMissingKey}
	}
	var key string
	if err := json.Unmarshal(v, &key); err != nil {
		return "", &keyError{fmt.Sprintf("the body member %s, the idempotency key, must be a string", k.BodyField), idempotency.ErrInvalidKey}
	}
	if _, err := idempotency.ParseKey([]string{key}); err != nil {
		return "", &keyError{fmt.Sprintf("the body member %s: %v", k.BodyField, err), idempotency.ErrInvalidKey}
	}
	return key, nil
}

// pointer finds the value at ptr (RFC 6901) in the JSON document body.
func pointer(body []byte, ptr string) (json.RawMessage, bool, error) {
	cur := json.RawMessage(bytes.TrimSpace(body))
	if !json.Valid(cur) {
		return nil, false, errors.New("the body is not JSON")
	}
	for _, token := range strings.Split(ptr, "/")[1:] {
		token = strings.ReplaceAll(strings.ReplaceAll(token, "~1", "/"), "~0", "~")
		switch {
		case len(cur) > 0 && cur[0] == '{':
			var members map[string]json.RawMessage
			if err := json.Unmarshal(cur, &members); err != nil {
				return nil, false, err
			}
			next, ok := members[token]
			if !ok {
				return nil, false, nil
			}
			cur = next
		case len(cur) > 0 && cur[0] == '[':
			var items []json.RawMessage
			if err := json.Unmarshal(cur, &items); err != nil {
				return nil, false, err
			}
			i, err := strconv.Atoi(token)
			if err != nil || i < 0 || i >= len(items) || (len(token) > 1 && token[0] == '0') {
				return nil, false, nil
			}
			cur = items[i]
		default:
			return nil, false, nil
		}
	}
	return cur, true, nil
}

// Prepare reads what idempotency.Operation.Serve needs from r, in the
// order the engine's own front door does: the key, where it is in a
// header, then the scope, which must not be empty, then the body, up to
// maxBody bytes (1 MiB, the engine's default, when zero), then the key
// where it is in the body. It repeats the key on the answer, in the
// header it names (HeaderName), as the engine does.
func (k KeyPlace) Prepare(w http.ResponseWriter, r *http.Request, scope func(*http.Request) (string, error), maxBody int64) (idempotency.Request, error) {
	var in idempotency.Request
	var err error
	if !k.InBody() {
		if in.Key, err = k.Key(r.Header, nil); err != nil {
			return in, err
		}
		w.Header().Set(k.HeaderName(), in.Key)
	}
	if in.Scope, err = scope(r); err != nil {
		return in, err
	}
	if in.Scope == "" {
		return in, idempotency.ErrNoScope
	}
	if maxBody <= 0 {
		maxBody = 1 << 20 // as idempotency.Config.MaxBodyBytes
	}
	if in.Body, err = idempotency.ReadBody(w, r, maxBody); err != nil {
		return in, err
	}
	if k.InBody() {
		if in.Key, err = k.Key(r.Header, in.Body); err != nil {
			return in, err
		}
		w.Header().Set(k.HeaderName(), in.Key)
	}
	return in, nil
}
