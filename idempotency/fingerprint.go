package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net/url"
	"strings"

	"github.com/oncekey/oncekey/idempotency/internal/canonform"
	"github.com/oncekey/oncekey/idempotency/internal/canonjson"
)

// ErrMalformedBody is what a body that cannot be fingerprinted gets (wrapped,
// with the reason): JSON that is invalid or whose meaning is ambiguous
// (duplicate keys, integers beyond ±2^53, invalid UTF-8, nesting deeper than
// 64 levels). Answered 400; it consumes no key.
var ErrMalformedBody = canonjson.ErrInvalid

// ErrMalformedForm is what an application/x-www-form-urlencoded body that
// cannot be fingerprinted gets (wrapped, with the reason): one whose
// meaning some form parser would read differently or not at all (a
// malformed percent escape, a ';', decoded bytes that are not UTF-8, more
// than 20,000 fields), or a charset other than UTF-8, which is what forms
// are (WHATWG URL). Answered 400; it consumes no key.
var ErrMalformedForm = canonform.ErrInvalid

// ErrMalformedContentType is what a body gets whose Content-Type does not
// parse as a media type (RFC 9110 §8.3), or that comes with more than one
// Content-Type: how to read the body, and so what it means, is not known.
// Answered 400; it consumes no key.
var ErrMalformedContentType = errors.New("the Content-Type header is not one valid media type")

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
// ErrMalformedBody. It is ComputeFingerprintFor of a JSON body.
func ComputeFingerprint(method, route, path string, query url.Values, body []byte) (Fingerprint, error) {
	return ComputeFingerprintFor(method, route, path, query, "", body)
}

// ComputeFingerprintFor is the fingerprint Operation.Serve gives a request
// whose body has the Content-Type contentType, for front doors and tools
// that must agree with it. How the body is read depends on its media type:
//
//   - none, application/json or any +json type: its RFC 8785 canonical
//     form, exactly as ComputeFingerprint (the media type is not hashed, so
//     fingerprints stored before forms were read still match);
//   - application/x-www-form-urlencoded: its canonical form (fields sorted
//     by key, each key's values in their order, one percent-encoding, "a"
//     and "a=" kept apart; ErrMalformedForm where that is ambiguous or the
//     charset is not UTF-8), and the media type;
//   - any other type (multipart/form-data, application/octet-stream, ...):
//     the exact bytes, and the media type with its parameters, normalised
//     (type, subtype and parameter names in lower case), so that the same
//     bytes sent as another type are another request.
//
// A body without content (empty, JSON whitespace, a form without fields)
// is fingerprinted as no body whatever its type, as it always was. A
// Content-Type that does not parse is ErrMalformedContentType.
func ComputeFingerprintFor(method, route, path string, query url.Values, contentType string, body []byte) (Fingerprint, error) {
	media, canonical, err := canonicalBody(contentType, body)
	if err != nil {
		return Fingerprint{}, err
	}
	return fingerprintCanonical(method, route, path, query, media, canonical), nil
}

// formMedia is the one media type besides JSON whose bodies have a
// canonical form.
const formMedia = "application/x-www-form-urlencoded"

// canonicalBody is what of a body the fingerprint covers: its canonical
// form, and the media type to bind it to ("" for JSON, whose fingerprints
// never included one, and for a body without content).
func canonicalBody(contentType string, body []byte) (media string, canonical []byte, err error) {
	if jsonMedia(contentType) {
		canonical, err = canonjson.Canonicalize(body)
		return "", canonical, err
	}
	if len(body) == 0 {
		return "", nil, nil
	}
	typ, params, err := mime.ParseMediaType(contentType)
	if err == nil && !strings.Contains(typ, "/") {
		// ParseMediaType takes a Content-Disposition ("attachment") too.
		err = errors.New("a media type is type/subtype")
	}
	if err != nil {
		return "", nil, fmt.Errorf("%w: %q: %w", ErrMalformedContentType, truncate(contentType), err)
	}
	if typ != formMedia {
		media = mime.FormatMediaType(typ, params)
		if media == "" {
			return "", nil, fmt.Errorf("%w: %q", ErrMalformedContentType, truncate(contentType))
		}
		return media, body, nil
	}
	if charset, ok := params["charset"]; ok && !strings.EqualFold(charset, "utf-8") {
		return "", nil, fmt.Errorf("%w: charset %q (form bodies are UTF-8)", ErrMalformedForm, truncate(charset))
	}
	if canonical, err = canonform.Canonicalize(body); err != nil || len(canonical) == 0 {
		return "", nil, err
	}
	return formMedia, canonical, nil
}

// jsonMedia reports whether a body of contentType is read as JSON: no
// Content-Type, application/json or a +json type, whatever its parameters
// and even if they do not parse, as every body was before other media
// types were read.
func jsonMedia(contentType string) bool {
	typ, _, _ := strings.Cut(contentType, ";")
	typ = strings.ToLower(strings.TrimSpace(typ))
	return typ == "" || typ == "application/json" || (strings.Contains(typ, "/") && strings.HasSuffix(typ, "+json"))
}

// truncate keeps an error message short whatever the header holds.
func truncate(s string) string {
	const most = 100
	if len(s) <= most {
		return s
	}
	return s[:most] + "…"
}

// fingerprintCanonical is ComputeFingerprintFor for a body already in
// canonical form. A media type, where there is one, is a sixth part: a
// JSON body's five parts hash exactly as they always did, and no five
// length-prefixed parts read as six.
func fingerprintCanonical(method, route, path string, query url.Values, media string, canonical []byte) Fingerprint {
	parts := [...][]byte{
		[]byte(method), // case-sensitive (RFC 9110 §9.1): "post" is not POST
		[]byte(route),
		[]byte(path),
		[]byte(query.Encode()), // Encode sorts by key and keeps value order
		canonical,
		[]byte(media),
	}
	count := len(parts)
	if media == "" {
		count--
	}
	h := sha256.New()
	for _, part := range parts[:count] {
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
