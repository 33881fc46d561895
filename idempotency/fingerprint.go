package idempotency

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"mime"
	"net/url"
	"strings"

	"github.com/oncekey/oncekey/idempotency/internal/canonform"
	"github.com/oncekey/oncekey/idempotency/internal/canonjson"
)

// ErrMalformedBody is what a body that cannot be fingerprinted gets (wrapped,
// with the reason): JSON that is invalid or whose meaning is ambiguous
// (duplicate keys, invalid UTF-8, nesting deeper than 64 levels, a number
// whose exponent has more than 9 digits). Answered 400; it consumes no key.
var ErrMalformedBody = canonjson.ErrInvalid

// errMalformedForm is what an application/x-www-form-urlencoded body that
// cannot be fingerprinted gets (wrapped, with the reason): one whose
// meaning some form parser would read differently or not at all (a
// malformed percent escape, a ';', decoded bytes that are not UTF-8, more
// than 20,000 fields), or a charset other than UTF-8, which is what forms
// are (WHATWG URL). Answered 400; it consumes no key.
var errMalformedForm = canonform.ErrInvalid

// errMalformedContentType is what a body gets whose Content-Type does not
// parse as a media type (RFC 9110 §8.3), or that comes with more than one
// Content-Type: how to read the body, and so what it means, is not known.
// Answered 400; it consumes no key.
var errMalformedContentType = errors.New("the Content-Type header is not one valid media type")

// ErrMalformedQuery is what a request gets whose query string does not
// parse as pairs (url.ParseQuery refuses it: a ';', a malformed percent
// escape): servers split and decode it differently, and Go's parser drops
// what it cannot read, so two different queries would share a
// fingerprint. Answered 400; it consumes no key.
var ErrMalformedQuery = errors.New("the query string is not valid")

// Fingerprint identifies a request's meaning: two requests with the same
// fingerprint are the same operation, so the second may be answered with the
// first one's response. A fingerprint of the current rules begins with a
// fixed marker; one stored by an engine before them (without it) is
// compared, by Operation.Begin, with the request's fingerprint under the
// rules it was computed by, so that a key stored before an upgrade still
// replays after it.
type Fingerprint [sha256.Size]byte

// fingerprintMarker opens every fingerprint of the current rules (exact
// numbers, forms in order, JSON media types), in place of the first bytes
// of its hash: a fingerprint stored before them does not have it (but for
// a chance of 2^-64), and so is known to need the rules it was computed by.
const fingerprintMarker = "oncekey\x02"

// current reports whether f was computed by the current rules.
func (f Fingerprint) current() bool { return string(f[:len(fingerprintMarker)]) == fingerprintMarker }

// formMedia is the one media type besides JSON's whose bodies have a
// canonical form.
const formMedia = "application/x-www-form-urlencoded"

// canonicalBody is what of a body the fingerprint covers: its canonical
// form, and the media type to bind it to ("" for application/json and no
// type, and for a body without content).
func canonicalBody(contentType string, body []byte) (media string, canonical []byte, err error) {
	if jsonMedia(contentType) {
		if canonical, err = canonjson.Canonicalize(body); err != nil || len(canonical) == 0 {
			return "", nil, err
		}
		return jsonMediaType(contentType), canonical, nil
	}
	return otherBody(contentType, body, canonform.Canonicalize)
}

// otherBody is canonicalBody for a body that is not JSON: a form's fields
// by canonicalForm, any other's bytes as sent.
func otherBody(contentType string, body []byte, canonicalForm func([]byte) ([]byte, error)) (media string, canonical []byte, err error) {
	if len(body) == 0 {
		return "", nil, nil
	}
	typ, params, err := mime.ParseMediaType(contentType)
	if err == nil && !strings.Contains(typ, "/") {
		// ParseMediaType takes a Content-Disposition ("attachment") too.
		err = errors.New("a media type is type/subtype")
	}
	if err != nil {
		return "", nil, fmt.Errorf("%w: %q: %w", errMalformedContentType, truncate(contentType), err)
	}
	if typ != formMedia {
		media = mime.FormatMediaType(typ, params)
		if media == "" {
			return "", nil, fmt.Errorf("%w: %q", errMalformedContentType, truncate(contentType))
		}
		return media, body, nil
	}
	if charset, ok := params["charset"]; ok && !strings.EqualFold(charset, "utf-8") {
		return "", nil, fmt.Errorf("%w: charset %q (form bodies are UTF-8)", errMalformedForm, truncate(charset))
	}
	if canonical, err = canonicalForm(body); err != nil || len(canonical) == 0 {
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

// jsonMediaType is the media type a JSON body's fingerprint binds it to:
// "" for none and for application/json, whose charset can only be UTF-8
// (RFC 8259 §8.1), else the type with its parameters, normalised, without
// a charset=utf-8; a Content-Type whose parameters do not parse, as sent.
func jsonMediaType(contentType string) string {
	if strings.TrimSpace(contentType) == "" {
		return ""
	}
	typ, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return contentType
	}
	if charset, ok := params["charset"]; ok && strings.EqualFold(charset, "utf-8") {
		delete(params, "charset")
	}
	if typ == "application/json" && len(params) == 0 {
		return ""
	}
	if media := mime.FormatMediaType(typ, params); media != "" {
		return media
	}
	return contentType
}

// truncate keeps an error message short whatever the header holds.
func truncate(s string) string {
	const most = 100
	if len(s) <= most {
		return s
	}
	return s[:most] + "…"
}

// fingerprintCanonical is Request.Fingerprint for a body already in
// canonical form: fingerprintMarker, then the hash of the six
// length-prefixed parts (the media type "" where there is none), cut to
// what follows the marker.
func fingerprintCanonical(method, route, path string, query url.Values, media string, canonical []byte) Fingerprint {
	var sum Fingerprint
	hashParts(method, route, path, query, media, canonical, true).Sum(sum[:0])
	var f Fingerprint
	copy(f[:], fingerprintMarker)
	copy(f[len(fingerprintMarker):], sum[:])
	return f
}

// legacyFingerprint is the fingerprint an engine gave a request before
// numbers were exact, forms kept their order and JSON media types were
// hashed: a record stored then carries it, and is matched by it. ok is
// false where those rules refused the request (an integer beyond ±2^53),
// which then cannot be the request the record was stored for.
func legacyFingerprint(method, route, path string, query url.Values, contentType string, body []byte) (f Fingerprint, ok bool) {
	var media string
	var canonical []byte
	var err error
	if jsonMedia(contentType) {
		canonical, err = canonjson.Legacy(body)
	} else {
		media, canonical, err = otherBody(contentType, body, canonform.Legacy)
	}
	if err != nil {
		return Fingerprint{}, false
	}
	hashParts(method, route, path, query, media, canonical, media != "").Sum(f[:0])
	return f, true
}

// hashParts hashes the length-prefixed parts of a fingerprint; the media
// type, a sixth part, only withMedia (the legacy rules hashed five parts
// for JSON, and no five length-prefixed parts read as six).
func hashParts(method, route, path string, query url.Values, media string, canonical []byte, withMedia bool) hash.Hash {
	parts := [...][]byte{
		[]byte(method), // case-sensitive (RFC 9110 §9.1): "post" is not POST
		[]byte(route),
		[]byte(path),
		[]byte(query.Encode()), // Encode sorts by key and keeps value order
		canonical,
		[]byte(media),
	}
	count := len(parts)
	if !withMedia {
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
	return h
}
