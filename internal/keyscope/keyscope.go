// Package keyscope finds the scope of a request's Idempotency-Key for a
// gateway, which has no accounts of its own: from a header that an
// authentication layer in front sets, from a claim of a JWT whose signature
// it verifies, or from the whole Authorization value. Keys of two scopes
// never meet, so a scope must name one caller, and only as the caller was
// authenticated.
package keyscope

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/auth"
)

// Source returns the scope of a request, as idempotency.Config.Scope takes
// it. Every error wraps idempotency.ErrNoScope: the request is refused (401)
// and never served under an empty scope.
type Source func(r *http.Request) (string, error)

// maxScope is the longest scope a source gives: every store holds it (the
// key table's scope column takes 255 bytes).
const maxScope = 255

// Header scopes a request by the value of the header name, which an
// authentication layer in front of the gateway sets, and must strip from
// what clients send: the gateway trusts it as it comes.
func Header(name string) Source {
	return func(r *http.Request) (string, error) {
		value, err := one(r, name)
		switch {
		case err != nil:
			return "", err
		case len(value) > maxScope:
			return "", fmt.Errorf("%w: the %s header is longer than %d bytes", idempotency.ErrNoScope, name, maxScope)
		}
		return value, nil
	}
}

// one is the value of the header name, which r must carry exactly once and
// not empty: of two, which one names the caller is not clear.
func one(r *http.Request, name string) (string, error) {
	values := r.Header.Values(name)
	switch {
	case len(values) == 0 || values[0] == "":
		return "", fmt.Errorf("%w: no %s header", idempotency.ErrNoScope, name)
	case len(values) > 1:
		return "", fmt.Errorf("%w: %d %s headers", idempotency.ErrNoScope, len(values), name)
	}
	return values[0], nil
}

// Authorization scopes a request by its whole Authorization value, of which
// it keeps only the SHA-256 ("sha256:" and its hex, which an operator can
// compute to find a caller's keys), so that no credential is stored with
// the keys.
// It needs nothing configured, but a rotated or refreshed token is a new
// scope, in which the old token's keys are not found: a retry across a
// token refresh runs again. JWT scopes by the token's subject instead.
func Authorization() Source {
	return func(r *http.Request) (string, error) {
		value, err := one(r, "Authorization")
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256([]byte(value))
		return "sha256:" + hex.EncodeToString(sum[:]), nil
	}
}

// JWT scopes a request by claim (typically "sub") of the bearer token in
// its Authorization header, read only once the token's signature verifies
// against one of keys (a JWKS: the key whose kid the token names, or the
// only key) and its time claims (exp, nbf, iat) hold, with a minute's
// leeway for clocks. A token without exp is refused: a gateway must not
// trust a credential forever. A refreshed token of the same subject keeps
// its scope, so a retry across a refresh replays.
func JWT(keys jose.JSONWebKeySet, claim string) (Source, error) {
	if len(keys.Keys) == 0 {
		return nil, errors.New("keyscope: the JWKS has no keys")
	}
	for _, k := range keys.Keys {
		if secret, ok := k.Key.([]byte); ok && len(secret) < 32 {
			// RFC 7518 §3.2: an HMAC key at least as long as its hash.
			return nil, fmt.Errorf("keyscope: the JWKS secret %q is %d bytes, under the 32 that HS256 needs", k.KeyID, len(secret))
		} else if !ok && !k.Valid() {
			return nil, fmt.Errorf("keyscope: the JWKS key %q is not valid", k.KeyID)
		}
	}
	return func(r *http.Request) (string, error) {
		refuse := func(why string, args ...any) (string, error) {
			return "", fmt.Errorf("%w: %s", idempotency.ErrNoScope, fmt.Sprintf(why, args...))
		}
		value, err := one(r, "Authorization")
		if err != nil {
			return "", err
		}
		raw, ok := auth.BearerToken(value)
		if !ok {
			return refuse("the Authorization header holds no bearer token")
		}
		token, err := jwt.ParseSigned(raw, signatureAlgorithms)
		if err != nil {
			return refuse("the bearer token is not a signed JWT")
		}
		key, ok := verificationKey(keys, token)
		if !ok {
			return refuse("no key of the JWKS matches the token's")
		}
		// The time claims alone: the others (sub, aud) may be of any type.
		var times struct {
			Expiry    *jwt.NumericDate `json:"exp"`
			NotBefore *jwt.NumericDate `json:"nbf"`
			IssuedAt  *jwt.NumericDate `json:"iat"`
		}
		all := map[string]any{}
		if err := token.Claims(key, &all); err != nil {
			return refuse("the token's signature does not verify")
		}
		// The payload just verified, decoded again for its times.
		if err := token.UnsafeClaimsWithoutVerification(&times); err != nil {
			return refuse("the token's exp, nbf or iat is not a time")
		}
		if times.Expiry == nil {
			return refuse("the token has no exp claim")
		}
		registered := jwt.Claims{Expiry: times.Expiry, NotBefore: times.NotBefore, IssuedAt: times.IssuedAt}
		if err := registered.ValidateWithLeeway(jwt.Expected{Time: time.Now()}, time.Minute); err != nil {
			return refuse("the token is expired or not yet valid")
		}
		scope, err := claimValue(all[claim])
		if err != nil {
			return refuse("claim %q: %v", claim, err)
		}
		return scope, nil
	}, nil
}

// signatureAlgorithms are the algorithms a token may be signed with: every
// one go-jose verifies, except none. A token signed with a symmetric
// algorithm verifies only against a symmetric key that the JWKS holds, so
// a public key cannot be used as an HMAC secret.
var signatureAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA, jose.HS256, jose.HS384, jose.HS512,
}

// verificationKey is the key of keys that token names by its kid, or the
// set's only key for a token without one; its algorithm, where the JWKS
// says, must be the token's.
func verificationKey(keys jose.JSONWebKeySet, token *jwt.JSONWebToken) (jose.JSONWebKey, bool) {
	if len(token.Headers) != 1 {
		return jose.JSONWebKey{}, false
	}
	h := token.Headers[0]
	candidates := keys.Keys
	if h.KeyID != "" {
		candidates = keys.Key(h.KeyID)
	}
	if len(candidates) != 1 {
		return jose.JSONWebKey{}, false
	}
	k := candidates[0]
	if k.Algorithm != "" && k.Algorithm != h.Algorithm {
		return jose.JSONWebKey{}, false
	}
	return k, true
}

// claimValue is a claim as a scope: a string as it is, an integer in
// decimal. A number beyond ±2^53, or with a fraction, is refused: decoded
// as a float, two such ids could round to one scope and share its keys.
// Anything else, or a scope too long for the stores, is no scope either.
func claimValue(v any) (string, error) {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case float64:
		if v != math.Trunc(v) || math.Abs(v) >= 1<<53 {
			return "", errors.New("a number that is not an integer within ±2^53")
		}
		s = strconv.FormatInt(int64(v), 10)
	case nil:
		return "", errors.New("the token does not have it")
	default:
		return "", errors.New("not a string or an integer")
	}
	switch {
	case s == "":
		return "", errors.New("it is empty")
	case len(s) > maxScope:
		return "", fmt.Errorf("it is longer than %d bytes", maxScope)
	}
	return s, nil
}
