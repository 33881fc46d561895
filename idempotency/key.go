package idempotency

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/oncekey/oncekey/internal/problem"
)

// Errors of ParseKey; both become 400 problem responses.
var (
	ErrMissingKey = errors.New("the Idempotency-Key header is required on this operation")
	ErrInvalidKey = errors.New("invalid Idempotency-Key")
)

// WriteKeyError answers a request whose Idempotency-Key ParseKey refused:
// 400 with the problem type for a missing or an invalid key.
func WriteKeyError(w http.ResponseWriter, err error) {
	kind := problem.InvalidIdempotencyKey
	if errors.Is(err, ErrMissingKey) {
		kind = problem.MissingIdempotencyKey
	}
	problem.Write(w, kind, err.Error())
}

// Operation names a method on a route pattern ("POST /orders"): the
// operation label of metrics and the name of traces, so both agree.
func Operation(method, route string) string { return method + " " + route }

// ParseKey returns the request's Idempotency-Key. Exactly one header must be
// present, holding 1–255 printable ASCII characters (0x20–0x7E). The value is
// used exactly as sent: a quoted value (as in the IETF draft's structured
// field form, "\"abc\"") is a different key from the unquoted one, because
// silently unquoting would make two distinct keys collide.
func ParseKey(h http.Header) (string, error) {
	values := h.Values(HeaderKey)
	switch {
	case len(values) == 0:
		return "", ErrMissingKey
	case len(values) > 1:
		return "", fmt.Errorf("%w: send exactly one Idempotency-Key header, got %d", ErrInvalidKey, len(values))
	}
	key := values[0]
	if key == "" {
		return "", fmt.Errorf("%w: it is empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLength {
		return "", fmt.Errorf("%w: it is %d bytes long, the limit is %d", ErrInvalidKey, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("%w: byte %d (0x%02x) is not printable ASCII", ErrInvalidKey, i, c)
		}
	}
	return key, nil
}
