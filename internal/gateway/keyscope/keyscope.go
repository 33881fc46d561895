// Package keyscope finds the scope of a request's Idempotency-Key for a
// gateway, which has no accounts of its own: from a header that an
// authentication layer in front sets, from a claim of a JWT whose signature
// it verifies, or from an HMAC of the whole Authorization value under a
// server secret. Keys of two scopes never meet, so a scope must name one
// caller, and only as the caller was authenticated.
package keyscope

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/wire/bearer"
)

// Source returns the scope of a request, as idempotency.Config.Scope takes
// it. Every error wraps idempotency.ErrNoScope: the request is refused (401)
// and never served under an empty scope.
type Source func(r *http.Request) (string, error)

// maxScope is the longest scope a source gives: every store holds it (the
// key table's scope column takes 255 bytes).
const maxScope = 255

// Rule is a scope source with what a change of the rule needs. Keys are
// found only under the scope they were stored under, so a gateway whose
// rule changed (an upgrade, a rotated secret) would run a retry of a key
// stored under the old rule a second time: it looks the key up under the
// Previous scopes too, for as long as keys stored otherwise than Prefix
// says remain (gateway.NewPreviousScopes).
type Rule struct {
	Source Source
	// Prefix starts every scope Source gives; a stored scope without it
	// was given by an earlier rule.
	Prefix string
	// Previous, if set, is the scopes that earlier rules gave the caller
	// of a request whose scope Source has found.
	Previous func(r *http.Request) []string
	// Guard, if set, checks every request the gateway receives, covered
	// or passed through: an error refuses it.
	Guard func(r *http.Request) error
}

// Header scopes a request by the value of the header name, which an
// authentication layer in front of the gateway sets, and must strip from
// what clients send: the gateway trusts it as it comes.
func Header(name string) Source { return HeaderFrom(name, nil) }

// HeaderFrom is Header, trusting the header only from a peer (the
// request's RemoteAddr: the front proxy's own address) within one of
// from: a request from anywhere else that carries the header is refused,
// so a client that reaches the gateway past the front proxy cannot name
// another caller's scope. No prefixes: any peer.
func HeaderFrom(name string, from []netip.Prefix) Source {
	untrusted := HeaderGuard(name, from)
	return func(r *http.Request) (string, error) {
		if err := untrusted(r); err != nil {
			return "", err
		}
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

// HeaderGuard refuses a request that carries the header name from a peer
// outside from (any peer, if from is empty): the Rule.Guard of HeaderFrom,
// for the requests passed through as well, since the upstream may trust
// the header too.
func HeaderGuard(name string, from []netip.Prefix) func(r *http.Request) error {
	return func(r *http.Request) error {
		if len(from) > 0 && len(r.Header.Values(name)) > 0 && !peerWithin(r, from) {
			return fmt.Errorf("%w: the %s header came from %s, which is not a trusted peer (--scope-header-from)", idempotency.ErrNoScope, name, r.RemoteAddr)
		}
		return nil
	}
}

// peerWithin reports whether r came from an address within one of from.
func peerWithin(r *http.Request, from []netip.Prefix) bool {
	addr, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := addr.Addr().Unmap()
	return slices.ContainsFunc(from, func(p netip.Prefix) bool { return p.Contains(ip) })
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

// MinSecret is the shortest secret Authorization takes: as long as the
// HMAC's hash.
const MinSecret = 32

// Authorization scopes a request by its whole Authorization value, of which
// it keeps only an HMAC-SHA256 under secret ("hmac:", the secret's id, ":"
// and the hex MAC), so that no credential is stored with the keys, and
// one taken from the key table cannot be tested against guesses (a Basic
// password) without the secret. The id (8 hex digits, a hash of the
// secret) tells the keys of two secrets apart.
// Previous names the scopes the same value had under previous (a rotated
// secret's scopes, to be found until they expire) and under the bare
// SHA-256 of the versions before the secret ("sha256:" and its hex).
// It needs nothing of the caller's, but a rotated or refreshed token is a
// new scope, in which the old token's keys are not found: a retry across a
// token refresh runs again. JWT scopes by the token's subject instead.
func Authorization(secret []byte, previous ...[]byte) (Rule, error) {
	for _, s := range append([][]byte{secret}, previous...) {
		if len(s) < MinSecret {
			return Rule{}, fmt.Errorf("keyscope: a scope secret has %d bytes; give it %d or more, such as `openssl rand -hex 32`", len(s), MinSecret)
		}
	}
	value := func(r *http.Request) (string, error) { return one(r, "Authorization") }
	current := newScopeMAC(secret)
	rotated := make([]scopeMAC, len(previous))
	for i, s := range previous {
		rotated[i] = newScopeMAC(s)
	}
	return Rule{
		Source: func(r *http.Request) (string, error) {
			v, err := value(r)
			if err != nil {
				return "", err
			}
			return current.of(v), nil
		},
		Prefix: current.prefix,
		Previous: func(r *http.Request) []string {
			v, err := value(r)
			if err != nil {
				return nil
			}
			scopes := make([]string, 0, len(rotated)+1)
			for _, m := range rotated {
				scopes = append(scopes, m.of(v))
			}
			sum := sha256.Sum256([]byte(v))
			return append(scopes, "sha256:"+hex.EncodeToString(sum[:]))
		},
	}, nil
}

// scopeMAC is a scope secret and the prefix of the scopes made with it,
// worked out once: the secret's id is an HMAC too, which each request
// would otherwise pay for again.
type scopeMAC struct {
	secret []byte
	prefix string
}

func newScopeMAC(secret []byte) scopeMAC {
	return scopeMAC{secret: secret, prefix: "hmac:" + secretID(secret) + ":"}
}

// of is the scope of the Authorization value v under the secret.
func (m scopeMAC) of(v string) string {
	mac := hmac.New(sha256.New, m.secret)
	mac.Write([]byte(v))
	return m.prefix + hex.EncodeToString(mac.Sum(nil))
}

// secretID names secret in the scopes made with it, revealing nothing of
// it.
func secretID(secret []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("oncekey scope secret id"))
	return hex.EncodeToString(mac.Sum(nil))[:8]
}

// DefaultLeeway is JWTConfig.Leeway's default: the clock skew allowed on a
// token's exp, nbf and iat.
const DefaultLeeway = time.Minute

// JWTConfig configures JWT.
type JWTConfig struct {
	// Keys verify the tokens' signatures; a JWKS reloads them.
	Keys *JWKS
	// Claim names the caller (typically "sub").
	Claim string
	// Issuer and Audience, if set, must be the token's iss and one of its
	// aud: a key that signs tokens for other issuers or other
	// applications does not make them callers of this gateway.
	Issuer, Audience string
	// Leeway is the clock skew allowed on exp, nbf and iat (0:
	// DefaultLeeway; negative: none).
	Leeway time.Duration
}

// JWT scopes a request by a claim of the bearer token in its Authorization
// header, read only once the token's signature verifies against one of
// cfg.Keys (the key whose kid the token names, or the only key), its time
// claims (exp, nbf, iat) hold within the leeway, and its iss and aud are
// the ones configured. A token without exp is refused: a gateway must not
// trust a credential forever. The scope is "jwt:", the issuer, "|" and
// the claim's value: a string in double quotes, an integer in decimal, so
// that the string "1000" and the number 1000 are two callers, as are one
// subject of two issuers. A refreshed token of the same subject keeps its
// scope, so a retry across a refresh replays.
// Previous names the scope of the versions before the issuer: the claim
// alone, its value unquoted.
func JWT(cfg JWTConfig) (Rule, error) {
	if cfg.Keys == nil {
		return Rule{}, errors.New("keyscope: no JWKS")
	}
	leeway := cfg.Leeway
	switch {
	case leeway == 0:
		leeway = DefaultLeeway
	case leeway < 0:
		leeway = 0
	}
	type verified struct {
		issuer string
		claim  any
	}
	verify := func(r *http.Request) (verified, error) {
		refuse := func(why string, args ...any) (verified, error) {
			return verified{}, fmt.Errorf("%w: %s", idempotency.ErrNoScope, fmt.Sprintf(why, args...))
		}
		value, err := one(r, "Authorization")
		if err != nil {
			return verified{}, err
		}
		raw, ok := bearer.Token(value)
		if !ok {
			return refuse("the Authorization header holds no bearer token")
		}
		token, err := jwt.ParseSigned(raw, signatureAlgorithms)
		if err != nil {
			return refuse("the bearer token is not a signed JWT")
		}
		key, ok := verificationKey(cfg.Keys.Keys(), token)
		if !ok {
			return refuse("no key of the JWKS matches the token's")
		}
		// The registered claims alone: the others may be of any type.
		var registered struct {
			Expiry    *jwt.NumericDate `json:"exp"`
			NotBefore *jwt.NumericDate `json:"nbf"`
			IssuedAt  *jwt.NumericDate `json:"iat"`
			Audience  jwt.Audience     `json:"aud"`
		}
		all := map[string]any{}
		if err := token.Claims(key, &all); err != nil {
			return refuse("the token's signature does not verify")
		}
		// The payload just verified, decoded again for its times.
		if err := token.UnsafeClaimsWithoutVerification(&registered); err != nil {
			return refuse("the token's exp, nbf, iat or aud is not of its type")
		}
		if registered.Expiry == nil {
			return refuse("the token has no exp claim")
		}
		times := jwt.Claims{Expiry: registered.Expiry, NotBefore: registered.NotBefore, IssuedAt: registered.IssuedAt}
		if err := times.ValidateWithLeeway(jwt.Expected{Time: time.Now()}, leeway); err != nil {
			return refuse("the token is expired or not yet valid")
		}
		issuer, ok := all["iss"].(string)
		switch {
		case !ok && all["iss"] != nil:
			return refuse("the token's iss is not a string")
		case cfg.Issuer != "" && issuer != cfg.Issuer:
			return refuse("the token's issuer is not %q", cfg.Issuer)
		case strings.Contains(issuer, "|"):
			// The first "|" ends the issuer in the scope.
			return refuse("the token's issuer holds a \"|\"")
		case cfg.Audience != "" && !registered.Audience.Contains(cfg.Audience):
			return refuse("the token's audience is not %q", cfg.Audience)
		}
		return verified{issuer: issuer, claim: all[cfg.Claim]}, nil
	}
	return Rule{
		Source: func(r *http.Request) (string, error) {
			v, err := verify(r)
			if err != nil {
				return "", err
			}
			value, err := claimValue(v.claim)
			if err != nil {
				return "", fmt.Errorf("%w: claim %q: %v", idempotency.ErrNoScope, cfg.Claim, err)
			}
			scope := "jwt:" + v.issuer + "|" + value
			if len(scope) > maxScope {
				return "", fmt.Errorf("%w: the issuer and claim %q are longer than %d bytes", idempotency.ErrNoScope, cfg.Claim, maxScope)
			}
			return scope, nil
		},
		Prefix: "jwt:",
		Previous: func(r *http.Request) []string {
			v, err := verify(r)
			if err != nil {
				return nil
			}
			value, err := claimValue(v.claim)
			if err != nil {
				return nil
			}
			if s, err := strconv.Unquote(value); err == nil {
				value = s
			}
			return []string{value}
		},
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

// claimValue is a claim as written in a scope: a string in double quotes
// (as Go quotes it), an integer in decimal, so that no string and number
// are written alike. A number beyond ±2^53, or with a fraction, is
// refused: decoded as a float, two such ids could round to one scope and
// share its keys. Anything else, or an empty string, is no scope either.
func claimValue(v any) (string, error) {
	switch v := v.(type) {
	case string:
		if v == "" {
			return "", errors.New("it is empty")
		}
		return strconv.Quote(v), nil
	case float64:
		if v != math.Trunc(v) || math.Abs(v) >= 1<<53 {
			return "", errors.New("a number that is not an integer within ±2^53")
		}
		return strconv.FormatInt(int64(v), 10), nil
	case nil:
		return "", errors.New("the token does not have it")
	}
	return "", errors.New("not a string or an integer")
}
