package idempotency

import (
	"errors"
	"fmt"
)

// Header names of the protocol.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// maxKeyLength is the longest Idempotency-Key accepted, in bytes.
const maxKeyLength = 255

// MaxScopeLength is the longest scope Operation.Serve accepts, in bytes
// (as stored, with any namespace a front door puts in it): every store
// holds it (PostgreSQL's scope column takes 255 bytes). A longer one is
// refused with ErrNoScope (401), the same in every store.
const MaxScopeLength = 255

// Errors of ParseKey; both are answered 400.
var (
	ErrMissingKey = errors.New("the Idempotency-Key header is required on this operation")
	ErrInvalidKey = errors.New("invalid Idempotency-Key")
)

// OperationName names a method on a route pattern ("POST /widgets"): the
// operation label of metrics and the name of traces when an operation has
// no name of its own, so both agree.
func OperationName(method, route string) string { return method + " " + route }

// ParseKey returns the idempotency key of a request that sent values in
// its place for the key: the Idempotency-Key header's
// (r.Header.Values(HeaderKey)), gRPC metadata's, or the one value a front
// door read from another header or the body, so that every door accepts
// the same keys. Exactly one value must be present (else ErrMissingKey or
// ErrInvalidKey), holding 1–255 printable ASCII characters (0x20–0x7E; else
// an error wrapping ErrInvalidKey). The value is used exactly as sent: a
// quoted value (as in the IETF draft's structured field form, "\"abc\"") is
// a different key from the unquoted one, because silently unquoting would
// make two distinct keys collide.
func ParseKey(values []string) (string, error) {
	switch {
	case len(values) == 0:
		return "", ErrMissingKey
	case len(values) > 1:
		return "", fmt.Errorf("%w: send exactly one Idempotency-Key header, got %d", ErrInvalidKey, len(values))
	}
	if err := checkKey(values[0]); err != nil {
		return "", err
	}
	return values[0], nil
}

// checkKey reports why key cannot be an idempotency key under ParseKey's
// rules (1–255 printable ASCII characters), as an error wrapping
// ErrInvalidKey, or nil.
func checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: it is empty", ErrInvalidKey)
	}
	if len(key) > maxKeyLength {
		return fmt.Errorf("%w: it is %d bytes long, the limit is %d", ErrInvalidKey, len(key), maxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %d (0x%02x) is not printable ASCII", ErrInvalidKey, i, c)
		}
	}
	return nil
}
