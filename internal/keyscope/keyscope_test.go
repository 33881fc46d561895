package keyscope_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/keyscope"
)

// request is a POST with the given header pairs.
func request(header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/transfers", nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

// requireRefused checks that src refuses r as a request without a scope.
func requireRefused(t *testing.T, src keyscope.Source, r *http.Request, why string) {
	t.Helper()
	scope, err := src(r)
	require.ErrorIs(t, err, idempotency.ErrNoScope, why)
	require.Empty(t, scope, why)
}

func TestHeader(t *testing.T) {
	t.Parallel()
	src := keyscope.Header("X-Account-Id")
	scope, err := src(request("X-Account-Id", "acct-1"))
	require.NoError(t, err)
	require.Equal(t, "acct-1", scope)
	requireRefused(t, src, request(), "no header")
	requireRefused(t, src, request("X-Account-Id", ""), "an empty header")
	requireRefused(t, src, request("X-Account-Id", "a", "X-Account-Id", "b"), "two headers")
	requireRefused(t, src, request("X-Account-Id", strings.Repeat("a", 256)), "over 255 bytes")
}

// TestAuthorization: the scope is the SHA-256 of the whole value, so that
// no credential is stored; another token is another scope.
func TestAuthorization(t *testing.T) {
	t.Parallel()
	src := keyscope.Authorization()
	scope, err := src(request("Authorization", "Bearer token-1"))
	require.NoError(t, err)
	sum := sha256.Sum256([]byte("Bearer token-1"))
	require.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), scope)
	require.NotContains(t, scope, "token-1", "the credential is not the scope")
	other, err := src(request("Authorization", "Bearer token-2"))
	require.NoError(t, err)
	require.NotEqual(t, scope, other)
	requireRefused(t, src, request(), "no header")
	requireRefused(t, src, request("Authorization", "Bearer a", "Authorization", "Bearer b"), "two headers")
}

// signer signs tokens with key under kid ("" for none).
func signer(t *testing.T, alg jose.SignatureAlgorithm, key any, kid string) jose.Signer {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader("kid", kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	require.NoError(t, err)
	return s
}

// bearer is the Authorization value of a token of claims signed by s.
func bearer(t *testing.T, s jose.Signer, claims map[string]any) string {
	t.Helper()
	token, err := jwt.Signed(s).Claims(claims).Serialize()
	require.NoError(t, err)
	return "Bearer " + token
}

// TestJWT: the scope is the claim of a token whose signature verifies
// against the JWKS and whose time claims hold; every other token is
// refused, whatever it claims.
func TestJWT(t *testing.T) {
	t.Parallel()
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	stranger, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	keys := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &ec.PublicKey, KeyID: "ec", Algorithm: string(jose.ES256), Use: "sig"},
		{Key: ed.Public(), KeyID: "ed", Use: "sig"},
		{Key: secret, KeyID: "hs", Algorithm: string(jose.HS256), Use: "sig"},
	}}
	src, err := keyscope.JWT(keys, "sub")
	require.NoError(t, err)

	now := time.Now()
	valid := func(sub any) map[string]any {
		return map[string]any{"sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	}
	byEC, byEd, byHS := signer(t, jose.ES256, ec, "ec"), signer(t, jose.EdDSA, ed, "ed"), signer(t, jose.HS256, secret, "hs")
	for _, tc := range []struct {
		name, authorization, want string
	}{
		{"ES256", bearer(t, byEC, valid("acct-1")), "acct-1"},
		{"EdDSA", bearer(t, byEd, valid("acct-1")), "acct-1"},
		{"HS256 with the JWKS's secret", bearer(t, byHS, valid("acct-1")), "acct-1"},
		{"a refreshed token of the subject", bearer(t, byEC, map[string]any{"sub": "acct-1", "iat": now.Add(-time.Minute).Unix(), "exp": now.Add(2 * time.Hour).Unix()}), "acct-1"},
		{"an integer claim", bearer(t, byEC, valid(42)), "42"},
		{"scheme in lower case", "bearer " + strings.TrimPrefix(bearer(t, byEC, valid("acct-2")), "Bearer "), "acct-2"},
	} {
		scope, err := src(request("Authorization", tc.authorization))
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, scope, tc.name)
	}

	unsigned := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"acct-1","exp":`+time.Now().Add(time.Hour).Format("20060102")+`}`)) + "."
	publicAsSecret, err := (&jose.JSONWebKey{Key: &ec.PublicKey}).MarshalJSON()
	require.NoError(t, err)
	for _, tc := range []struct{ name, authorization string }{
		{"signed by a key not in the JWKS", bearer(t, signer(t, jose.ES256, stranger, "ec"), valid("acct-1"))},
		{"a kid the JWKS does not have", bearer(t, signer(t, jose.ES256, ec, "other"), valid("acct-1"))},
		{"no kid, and the JWKS has several keys", bearer(t, signer(t, jose.ES256, ec, ""), valid("acct-1"))},
		{"HS256 under the EC key's kid", bearer(t, signer(t, jose.HS256, publicAsSecret, "ec"), valid("acct-1"))},
		{"alg none", "Bearer " + unsigned},
		{"expired", bearer(t, byEC, map[string]any{"sub": "acct-1", "exp": now.Add(-2 * time.Minute).Unix()})},
		{"not yet valid", bearer(t, byEC, map[string]any{"sub": "acct-1", "nbf": now.Add(2 * time.Minute).Unix(), "exp": now.Add(time.Hour).Unix()})},
		{"no exp", bearer(t, byEC, map[string]any{"sub": "acct-1"})},
		{"no sub", bearer(t, byEC, map[string]any{"exp": now.Add(time.Hour).Unix()})},
		{"an empty sub", bearer(t, byEC, valid(""))},
		{"a sub over 255 bytes", bearer(t, byEC, valid(strings.Repeat("a", 256)))},
		{"a sub beyond 2^53", bearer(t, byEC, valid(float64(1<<60)))},
		{"a sub with a fraction", bearer(t, byEC, valid(1.5))},
		{"a sub that is an object", bearer(t, byEC, valid(map[string]any{"id": "acct-1"}))},
		{"not a JWT", "Bearer not-a-jwt"},
		{"Basic", "Basic YTpi"},
		{"no token", "Bearer "},
	} {
		requireRefused(t, src, request("Authorization", tc.authorization), tc.name)
	}
	requireRefused(t, src, request(), "no Authorization header")
	token := bearer(t, byEC, valid("acct-1"))
	requireRefused(t, src, request("Authorization", token, "Authorization", token), "two Authorization headers")

	single, err := keyscope.JWT(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &ec.PublicKey}}}, "sub")
	require.NoError(t, err)
	scope, err := single(request("Authorization", bearer(t, signer(t, jose.ES256, ec, ""), valid("acct-3"))))
	require.NoError(t, err, "a JWKS of one key verifies a token without a kid")
	require.Equal(t, "acct-3", scope)

	_, err = keyscope.JWT(jose.JSONWebKeySet{}, "sub")
	require.Error(t, err, "a JWKS without keys")
}
