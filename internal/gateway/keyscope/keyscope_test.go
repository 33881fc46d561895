package keyscope_test

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
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

// TestHeaderFromTrustedPeers: with trusted peers, a request from anywhere
// else that carries the scope header is refused, whatever it names.
func TestHeaderFromTrustedPeers(t *testing.T) {
	t.Parallel()
	src := keyscope.HeaderFrom("X-Account-Id", []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32"), netip.MustParsePrefix("10.0.0.0/8")})
	from := func(addr string, header ...string) *http.Request {
		r := request(header...)
		r.RemoteAddr = addr
		return r
	}
	for _, addr := range []string{"127.0.0.2:5000", "10.1.2.3:443", "[::ffff:10.1.2.3]:443"} {
		scope, err := src(from(addr, "X-Account-Id", "acct-1"))
		require.NoError(t, err, addr)
		require.Equal(t, "acct-1", scope, addr)
	}
	for _, addr := range []string{"127.0.0.1:5000", "[::1]:5000", "192.168.0.1:80", "not an address"} {
		requireRefused(t, src, from(addr, "X-Account-Id", "acct-1"), "the header from "+addr)
	}
	requireRefused(t, src, from("127.0.0.2:5000"), "a trusted peer without the header")
}

// TestAuthorization: the scope is an HMAC of the whole value under the
// server's secret, so that no credential is stored and none can be
// guessed from the key table without the secret; another token, or
// another secret, is another scope. Previous names the scopes of the
// rotated secrets and of the bare SHA-256 of the versions before.
// TestAuthorizationScopeIsPinned: the scope of one credential under one
// secret, spelled out. The Caddy module computes the same scope in a copy
// of its own (caddymodule TestMACScopeIsTheProxysTwin pins the same
// value), and operators compute it with openssl (docs/operations.md): a
// change here must be a change there.
func TestAuthorizationScopeIsPinned(t *testing.T) {
	t.Parallel()
	rule, err := keyscope.Authorization([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	scope, err := rule.Source(request("Authorization", "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc"))
	require.NoError(t, err)
	require.Equal(t, "hmac:c2f52eeb:fb8ae57c17f11de46d70baec83071b582aa84b50912366d3fdd026714423063d", scope)
}

func TestAuthorization(t *testing.T) {
	t.Parallel()
	secret, rotated := []byte(strings.Repeat("s", 32)), []byte(strings.Repeat("r", 32))
	rule, err := keyscope.Authorization(secret, rotated)
	require.NoError(t, err)
	mac := func(secret []byte, v string) string {
		h := hmac.New(sha256.New, secret)
		h.Write([]byte(v))
		return hex.EncodeToString(h.Sum(nil))
	}
	for _, value := range []string{"Bearer token-1", "Basic YWxpY2U6cGFzc3dvcmQ="} {
		r := request("Authorization", value)
		scope, err := rule.Source(r)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(scope, rule.Prefix), scope)
		require.True(t, strings.HasSuffix(scope, ":"+mac(secret, value)), "the HMAC under the secret: %s", scope)
		require.NotContains(t, scope, strings.Fields(value)[1], "the credential is not the scope")
		sum := sha256.Sum256([]byte(value))
		previous := rule.Previous(r)
		require.Len(t, previous, 2)
		require.True(t, strings.HasSuffix(previous[0], ":"+mac(rotated, value)), "the rotated secret's scope: %s", previous[0])
		require.False(t, strings.HasPrefix(previous[0], rule.Prefix), "a rotated secret's scope does not look current")
		require.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), previous[1], "the scope before secrets")
	}
	one, err := rule.Source(request("Authorization", "Bearer token-1"))
	require.NoError(t, err)
	other, err := rule.Source(request("Authorization", "Bearer token-2"))
	require.NoError(t, err)
	require.NotEqual(t, one, other)
	underRotated, err := keyscope.Authorization(rotated)
	require.NoError(t, err)
	same, err := underRotated.Source(request("Authorization", "Bearer token-1"))
	require.NoError(t, err)
	require.NotEqual(t, one, same, "another secret, another scope")
	requireRefused(t, rule.Source, request(), "no header")
	requireRefused(t, rule.Source, request("Authorization", "Bearer a", "Authorization", "Bearer b"), "two headers")
	_, err = keyscope.Authorization([]byte("short"))
	require.Error(t, err, "a secret under 32 bytes")
	_, err = keyscope.Authorization(secret, []byte("short"))
	require.Error(t, err, "a previous secret under 32 bytes")
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

// writeJWKS writes keys to a file of dir, and returns its path.
func writeJWKS(t *testing.T, path string, keys ...jose.JSONWebKey) string {
	t.Helper()
	raw, err := json.Marshal(jose.JSONWebKeySet{Keys: keys})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	return path
}

// jwtRule is the JWT rule of keys, as cfg sets it otherwise.
func jwtRule(t *testing.T, cfg keyscope.JWTConfig, keys ...jose.JSONWebKey) keyscope.Rule {
	t.Helper()
	set, err := keyscope.LoadJWKS(writeJWKS(t, filepath.Join(t.TempDir(), "jwks.json"), keys...))
	require.NoError(t, err)
	cfg.Keys = set
	cfg.Claim = cmp.Or(cfg.Claim, "sub")
	rule, err := keyscope.JWT(cfg)
	require.NoError(t, err)
	return rule
}

// TestJWT: the scope is the issuer and the claim of a token whose
// signature verifies against the JWKS and whose time claims hold; every
// other token is refused, whatever it claims.
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
	rule := jwtRule(t, keyscope.JWTConfig{},
		jose.JSONWebKey{Key: &ec.PublicKey, KeyID: "ec", Algorithm: string(jose.ES256), Use: "sig"},
		jose.JSONWebKey{Key: ed.Public(), KeyID: "ed", Use: "sig"},
		jose.JSONWebKey{Key: secret, KeyID: "hs", Algorithm: string(jose.HS256), Use: "sig"},
	)
	src := rule.Source

	now := time.Now()
	valid := func(sub any) map[string]any {
		return map[string]any{"sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	}
	byEC, byEd, byHS := signer(t, jose.ES256, ec, "ec"), signer(t, jose.EdDSA, ed, "ed"), signer(t, jose.HS256, secret, "hs")
	for _, tc := range []struct {
		name, authorization, want, previous string
	}{
		{"ES256", bearer(t, byEC, valid("acct-1")), `jwt:|"acct-1"`, "acct-1"},
		{"EdDSA", bearer(t, byEd, valid("acct-1")), `jwt:|"acct-1"`, "acct-1"},
		{"HS256 with the JWKS's secret", bearer(t, byHS, valid("acct-1")), `jwt:|"acct-1"`, "acct-1"},
		{"a refreshed token of the subject", bearer(t, byEC, map[string]any{"sub": "acct-1", "iat": now.Add(-time.Minute).Unix(), "exp": now.Add(2 * time.Hour).Unix()}), `jwt:|"acct-1"`, "acct-1"},
		{"an issuer", bearer(t, byEC, map[string]any{"iss": "https://idp", "sub": "acct-1", "exp": now.Add(time.Hour).Unix()}), `jwt:https://idp|"acct-1"`, "acct-1"},
		{"an integer claim", bearer(t, byEC, valid(42)), "jwt:|42", "42"},
		{"the number 1e15", bearer(t, byEC, valid(1e15)), "jwt:|1000000000000000", "1000000000000000"},
		{"the string of 1e15", bearer(t, byEC, valid("1000000000000000")), `jwt:|"1000000000000000"`, "1000000000000000"},
		{"a claim with a quote", bearer(t, byEC, valid(`a"b`)), `jwt:|"a\"b"`, `a"b`},
		{"expired within the leeway", bearer(t, byEC, map[string]any{"sub": "acct-1", "exp": now.Add(-30 * time.Second).Unix()}), `jwt:|"acct-1"`, "acct-1"},
		{"scheme in lower case", "bearer " + strings.TrimPrefix(bearer(t, byEC, valid("acct-2")), "Bearer "), `jwt:|"acct-2"`, "acct-2"},
	} {
		r := request("Authorization", tc.authorization)
		scope, err := src(r)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, scope, tc.name)
		require.True(t, strings.HasPrefix(scope, rule.Prefix), tc.name)
		require.Equal(t, []string{tc.previous}, rule.Previous(r), "%s: the scope before issuers", tc.name)
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
		{"an issuer with a |", bearer(t, byEC, map[string]any{"iss": "a|b", "sub": "acct-1", "exp": now.Add(time.Hour).Unix()})},
		{"an issuer that is not a string", bearer(t, byEC, map[string]any{"iss": 7, "sub": "acct-1", "exp": now.Add(time.Hour).Unix()})},
		{"not a JWT", "Bearer not-a-jwt"},
		{"Basic", "Basic YTpi"},
		{"no token", "Bearer "},
	} {
		requireRefused(t, src, request("Authorization", tc.authorization), tc.name)
	}
	requireRefused(t, src, request(), "no Authorization header")
	token := bearer(t, byEC, valid("acct-1"))
	requireRefused(t, src, request("Authorization", token, "Authorization", token), "two Authorization headers")

	single := jwtRule(t, keyscope.JWTConfig{}, jose.JSONWebKey{Key: &ec.PublicKey})
	scope, err := single.Source(request("Authorization", bearer(t, signer(t, jose.ES256, ec, ""), valid("acct-3"))))
	require.NoError(t, err, "a JWKS of one key verifies a token without a kid")
	require.Equal(t, `jwt:|"acct-3"`, scope)

	for name, raw := range map[string]string{"no keys": `{"keys":[]}`, "an encryption key alone": mustJSON(t, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &ec.PublicKey, Use: "enc"}}})} {
		_, err = keyscope.ParseJWKS([]byte(raw))
		require.Error(t, err, name)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	return string(raw)
}

// TestJWTIssuerAudienceAndUse: with an issuer and an audience given, a
// token of another issuer, or for another audience, is refused even when
// a key of the JWKS signed it; a key whose use is not sig verifies
// nothing; the leeway is the one configured.
func TestJWTIssuerAudienceAndUse(t *testing.T) {
	t.Parallel()
	sig, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	enc, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	rule := jwtRule(t, keyscope.JWTConfig{Issuer: "https://idp", Audience: "payments", Leeway: 10 * time.Second},
		jose.JSONWebKey{Key: &sig.PublicKey, KeyID: "sig", Use: "sig"},
		jose.JSONWebKey{Key: &enc.PublicKey, KeyID: "enc", Use: "enc"},
	)
	now := time.Now()
	claims := func(iss string, aud any, exp time.Time) map[string]any {
		c := map[string]any{"sub": "alice", "exp": exp.Unix()}
		if iss != "" {
			c["iss"] = iss
		}
		if aud != nil {
			c["aud"] = aud
		}
		return c
	}
	bySig, byEnc := signer(t, jose.ES256, sig, "sig"), signer(t, jose.ES256, enc, "enc")
	for name, authorization := range map[string]string{
		"the issuer and the audience":           bearer(t, bySig, claims("https://idp", "payments", now.Add(time.Hour))),
		"the audience among others":             bearer(t, bySig, claims("https://idp", []string{"other-app", "payments"}, now.Add(time.Hour))),
		"expired, within the configured leeway": bearer(t, bySig, claims("https://idp", "payments", now.Add(-5*time.Second))),
	} {
		scope, err := rule.Source(request("Authorization", authorization))
		require.NoError(t, err, name)
		require.Equal(t, `jwt:https://idp|"alice"`, scope, name)
	}
	for name, authorization := range map[string]string{
		"another issuer":                      bearer(t, bySig, claims("https://evil", "payments", now.Add(time.Hour))),
		"no issuer":                           bearer(t, bySig, claims("", "payments", now.Add(time.Hour))),
		"another audience":                    bearer(t, bySig, claims("https://idp", "other-app", now.Add(time.Hour))),
		"no audience":                         bearer(t, bySig, claims("https://idp", nil, now.Add(time.Hour))),
		"signed by an encryption key":         bearer(t, byEnc, claims("https://idp", "payments", now.Add(time.Hour))),
		"expired, past the configured leeway": bearer(t, bySig, claims("https://idp", "payments", now.Add(-30*time.Second))),
	} {
		requireRefused(t, rule.Source, request("Authorization", authorization), name)
	}
}

// TestJWKSReloads: once the file changes, a removed key stops verifying and
// a new one starts, on a signal or on the next tick; a file that is no
// JWKS leaves the keys as they were.
func TestJWKSReloads(t *testing.T) {
	t.Parallel()
	oldKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	newKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		interval time.Duration
		signal   bool
	}{
		{"on SIGHUP", time.Hour, true},
		{"on the tick", 10 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeJWKS(t, filepath.Join(t.TempDir(), "jwks.json"), jose.JSONWebKey{Key: &oldKey.PublicKey, KeyID: "old"})
			set, err := keyscope.LoadJWKS(path)
			require.NoError(t, err)
			rule, err := keyscope.JWT(keyscope.JWTConfig{Keys: set, Claim: "sub"})
			require.NoError(t, err)
			claims := map[string]any{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}
			byOld := request("Authorization", bearer(t, signer(t, jose.ES256, oldKey, "old"), claims))
			byNew := request("Authorization", bearer(t, signer(t, jose.ES256, newKey, "new"), claims))
			_, err = rule.Source(byOld)
			require.NoError(t, err)
			requireRefused(t, rule.Source, byNew, "the new key before the rotation")

			require.NoError(t, os.WriteFile(path, []byte("{half a file"), 0o600))
			_, err = set.Reload()
			require.Error(t, err, "a file that is no JWKS")
			_, err = rule.Source(byOld)
			require.NoError(t, err, "a file that is no JWKS leaves the keys as they were")

			ctx, cancel := context.WithCancel(t.Context())
			t.Cleanup(cancel)
			hup := make(chan os.Signal, 1)
			go set.Watch(ctx, tc.interval, hup, slog.New(slog.DiscardHandler))
			writeJWKS(t, path, jose.JSONWebKey{Key: &newKey.PublicKey, KeyID: "new"})
			if tc.signal {
				hup <- syscall.SIGHUP
			}
			require.Eventually(t, func() bool {
				_, err := rule.Source(byNew)
				return err == nil
			}, 5*time.Second, 5*time.Millisecond, "the new key verifies")
			requireRefused(t, rule.Source, byOld, "the removed key")
		})
	}
}
