package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"

	"github.com/oncekey/oncekey/idempotency/internal/canonjson"
)

// ErrMalformedBody is what a body that cannot be fingerprinted gets (wrapped,
// with the reason): JSON that is invalid or whose meaning is ambiguous
// (duplicate keys, integers beyond ±2^53, invalid UTF-8, nesting deeper than
// 64 levels). Answered 400; it consumes no key.
var ErrMalformedBody = canonjson.ErrInvalid

// Fingerprint identifies a request's meaning: two requests with the same
// fingerprint are the same operation, so the second may be answered with the
// first one's response.
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in hex, for logs and operators.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// ComputeFingerprint hashes method, route pattern, path, the sorted query
// string and the canonical (RFC 8785) form of body. The pattern
// ("/widgets/{id}") binds the key to the operation; the path binds it to the
// resource too, so that one key sent to /widgets/1/paint and then to
// /widgets/2/paint is a conflict, not a replay. The parts are length-prefixed
// so that no two different tuples hash alike.
// A body that is not canonicalisable JSON is an error wrapping
// ErrMalformedBody.
func ComputeFingerprint(method, route, path string, query url.Values, body []byte) (Fingerprint, error) {
	canonical, err := canonjson.Canonicalize(body)
	if err != nil {
		return Fingerprint{}, err
	}
	return fingerprintCanonical(method, route, path, query, canonical), nil
}

// fingerprintCanonical is ComputeFingerprint for a body already in
// canonical form.
func fingerprintCanonical(method, route, path string, query url.Values, canonical []byte) Fingerprint {
	h := sha256.New()
	for _, part := range [][]byte{
		[]byte(method), // case-sensitive (RFC 9110 §9.1): "post" is not POST
		[]byte(route),
		[]byte(path),
		[]byte(query.Encode()), // Encode sorts by key and keeps value order
		canonical,
	} {
		var n [8]byte
		l := uint64(len(part))
		for i := range n {
			n[i] = byte(l >> (56 - 8*i))
		}
		h.Write(n[:])
		h.Write(part)
	}
	var f Fingerprint
	h.Sum(f[:0])
	return f
}
