package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// postTransfer sends a transfer to the gateway at addr under key, with
// the headers given in pairs, from the local address from ("" for any).
func postTransfer(t *testing.T, addr, from, key string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/transfers", strings.NewReader(`{"amount":700,"currency":"EUR"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.HeaderKey, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	transport := &http.Transport{DisableKeepAlives: true}
	if from != "" {
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		transport.DialContext = dialer.DialContext
	}
	resp, err := (&http.Client{Transport: transport, Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// jwksFile writes a JWKS of the public halves of keys (by kid) to path.
func jwksFile(t *testing.T, path string, keys map[string]*ecdsa.PrivateKey) {
	t.Helper()
	var set jose.JSONWebKeySet
	for kid, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"})
	}
	raw, err := json.Marshal(set)
	require.NoError(t, err)
	// Written whole, then renamed: the gateway never reads half a file.
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, raw, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// token is a bearer token of claims signed by key under kid.
func token(t *testing.T, key *ecdsa.PrivateKey, kid string, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	require.NoError(t, err)
	raw, err := jwt.Signed(s).Claims(claims).Serialize()
	require.NoError(t, err)
	return "Bearer " + raw
}

func newECKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return k
}

// TestProxyReloadsTheJWKSOnSIGHUP: after the identity provider rotates its
// key, SIGHUP makes the gateway read the JWKS again: the new key verifies,
// the removed one no longer does, and the gateway keeps serving. Its
// --upstream's userinfo is in no line of its output.
func TestProxyReloadsTheJWKSOnSIGHUP(t *testing.T) {
	t.Parallel()
	u := upstreamtest.Start(t)
	upstream, err := url.Parse(u.URL)
	require.NoError(t, err)
	upstream.User = url.UserPassword("gateway-user", "hunter2-secret")
	oldKey, newKey := newECKey(t), newECKey(t)
	path := filepath.Join(t.TempDir(), "jwks.json")
	jwksFile(t, path, map[string]*ecdsa.PrivateKey{"old": oldKey})
	// A refresh far away: only the signal reloads within the test.
	p := spawnProxy(t, nil, "--upstream", upstream.String(), "--spec", u.Spec, "--scope-jwks", path,
		"--scope-issuer", "https://idp.test", "--scope-audience", "transfers", "--scope-jwks-refresh", "1h")
	claims := map[string]any{"iss": "https://idp.test", "aud": "transfers", "sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}
	byOld, byNew := token(t, oldKey, "old", claims), token(t, newKey, "new", claims)

	status, body := postTransfer(t, p.addr, "", uuid.NewString(), "Authorization", byOld)
	require.Equal(t, http.StatusCreated, status, body)
	status, body = postTransfer(t, p.addr, "", uuid.NewString(), "Authorization", byNew)
	require.Equal(t, http.StatusUnauthorized, status, "a key not yet in the JWKS: %s", body)

	jwksFile(t, path, map[string]*ecdsa.PrivateKey{"new": newKey})
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		status, _ := postTransfer(t, p.addr, "", uuid.NewString(), "Authorization", byNew)
		return status == http.StatusCreated
	}, 30*time.Second, 20*time.Millisecond, "the new key verifies after SIGHUP; output:\n%s", p.logs)
	status, body = postTransfer(t, p.addr, "", uuid.NewString(), "Authorization", byOld)
	require.Equal(t, http.StatusUnauthorized, status, "the removed key: %s", body)
	require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrNoScope).Slug)
	require.Nil(t, p.cmd.ProcessState, "SIGHUP did not end the gateway")

	// Another SIGHUP, with nothing changed, ends nothing either.
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	status, body = postTransfer(t, p.addr, "", uuid.NewString(), "Authorization", byNew)
	require.Equal(t, http.StatusCreated, status, body)

	logs := p.logs.String()
	require.Contains(t, logs, "scope JWKS: reloaded", "the reload is logged")
	require.Contains(t, logs, "gateway listening", "the banner was written")
	for _, secret := range []string{"hunter2-secret", "gateway-user"} {
		require.NotContains(t, logs, secret, "--upstream's userinfo in the output")
	}
}

// TestProxyWithoutJWKSSurvivesSIGHUP: SIGHUP never ends the gateway, even
// with nothing to reload.
func TestProxyWithoutJWKSSurvivesSIGHUP(t *testing.T) {
	t.Parallel()
	u := upstreamtest.Start(t)
	p := spawnProxy(t, nil, "--upstream", u.URL, "--spec", u.Spec, "--scope-header", "X-Account-Id")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(p.logs.String(), "SIGHUP: nothing to reload") },
		30*time.Second, 20*time.Millisecond, "output:\n%s", p.logs)
	status, body := postTransfer(t, p.addr, "", uuid.NewString(), "X-Account-Id", "acct-1")
	require.Equal(t, http.StatusCreated, status, body)
}

// TestUpstreamUserinfoIsNeverPrinted: a bad --upstream with a userinfo is
// reported without it.
func TestUpstreamUserinfoIsNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, upstream := range []string{"ftp://gateway-user:hunter2-secret@example", "http://gateway-user:hunter2-secret@exa mple/%zz"} {
		_, err := runCommand(t, map[string]string{}, "proxy", "--upstream", upstream, "--scope-header", "X-Account-Id", "--routes", "none.yaml")
		require.ErrorContains(t, err, "--upstream (ONCEKEY_UPSTREAM)")
		require.NotContains(t, err.Error(), "hunter2-secret", upstream)
		require.NotContains(t, err.Error(), "gateway-user", upstream)
	}
}

// TestScopeHeaderOnlyFromTrustedPeers: with --scope-header-from, a request
// that carries the scope header from a peer outside the list is refused
// (401, problem+json) and never reaches the upstream; from a peer within
// it, it runs.
func TestScopeHeaderOnlyFromTrustedPeers(t *testing.T) {
	t.Parallel()
	u := upstreamtest.Start(t)
	addr, _ := startCommand(t, map[string]string{}, "proxy", "--upstream", u.URL, "--spec", u.Spec,
		"--scope-header", "X-Account-Id", "--scope-header-from", "127.0.0.2/32")
	refused, trusted := uuid.NewString(), uuid.NewString()
	status, body := postTransfer(t, addr, "127.0.0.1", refused, "X-Account-Id", "acct-victim")
	require.Equal(t, http.StatusUnauthorized, status, body)
	require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrNoScope).Slug)
	require.Contains(t, body, "not a trusted peer")
	status, body = postTransfer(t, addr, "127.0.0.2", trusted, "X-Account-Id", "acct-victim")
	require.Equal(t, http.StatusCreated, status, body)
	_, byKey := u.Executions(t)
	require.Zero(t, byKey[refused], "the refused request ran upstream")
	require.Equal(t, 1, byKey[trusted])

	// A request passed through, not covered, is refused too: the
	// upstream may trust the header as well.
	get := func(from string, header ...string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/_executions", nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		resp, err := (&http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}).Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	status, body = get("127.0.0.1", "X-Account-Id", "acct-victim")
	require.Equal(t, http.StatusUnauthorized, status, "passed through: %s", body)
	require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrNoScope).Slug)
	status, body = get("127.0.0.1")
	require.Equal(t, http.StatusOK, status, "passed through without the header: %s", body)
	status, body = get("127.0.0.2", "X-Account-Id", "acct-victim")
	require.Equal(t, http.StatusOK, status, "passed through from the front proxy: %s", body)
}

// TestRetryAcrossScopeRuleUpgrade: keys that a gateway stored under the
// scope rule before this one (the bare SHA-256 of Authorization; the JWT
// claim without its issuer) are still found by the new gateway on the same
// PostgreSQL: a retry of a key that ran replays its answer, one whose
// outcome is unknown answers so, and neither runs upstream again.
func TestRetryAcrossScopeRuleUpgrade(t *testing.T) {
	t.Parallel()
	key := newECKey(t)
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	jwksFile(t, jwks, map[string]*ecdsa.PrivateKey{"k": key})
	bearer := token(t, key, "k", map[string]any{"iss": "https://idp.test", "sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	sum := sha256.Sum256([]byte(bearer))
	for _, tc := range []struct {
		name string
		// old is the scope the gateway before gave a request with
		// bearer.
		old  string
		args []string
	}{
		{"authorization: SHA-256, then HMAC", "sha256:" + hex.EncodeToString(sum[:]), []string{"--scope-authorization", "--scope-secret", testScopeSecret}},
		{"jwt: the claim, then the issuer and the claim", "alice", []string{"--scope-jwks", jwks, "--scope-issuer", "https://idp.test"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := upstreamtest.Start(t)
			dbURL, _ := testdb.Fresh(t)
			ran, unknown := uuid.NewString(), uuid.NewString()
			first := oldRuleGateway(t, u, dbURL, tc.old)
			status, answer := postTransfer(t, first, "", ran, "Authorization", bearer, "Content-Type", "application/json")
			require.Equal(t, http.StatusCreated, status, answer)
			status, body := postTransfer(t, first, "", unknown, "Authorization", bearer, upstreamtest.Header, upstreamtest.Reset)
			require.Equal(t, http.StatusConflict, status, body)

			addr, _ := startCommand(t, map[string]string{"DATABASE_URL": dbURL}, append([]string{"proxy", "--upstream", u.URL, "--spec", u.Spec}, tc.args...)...)
			status, body = postTransfer(t, addr, "", ran, "Authorization", bearer)
			require.Equal(t, http.StatusCreated, status, body)
			require.Equal(t, answer, body, "the retry replays the answer stored under the old rule")
			status, body = postTransfer(t, addr, "", unknown, "Authorization", bearer)
			require.Equal(t, http.StatusConflict, status, body)
			require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrOutcomeUnknown).Slug, "a key of unknown outcome stays unknown")
			fresh := uuid.NewString()
			status, body = postTransfer(t, addr, "", fresh, "Authorization", bearer)
			require.Equal(t, http.StatusCreated, status, "a new key runs: %s", body)
			_, byKey := u.Executions(t)
			require.Equal(t, map[string]int{ran: 1, unknown: 1, fresh: 1}, map[string]int{ran: byKey[ran], unknown: byKey[unknown], fresh: byKey[fresh]}, "upstream runs")
		})
	}
}

// oldRuleGateway serves, until t ends, a gateway in front of u whose keys
// (in the key table of dbURL) are scoped as the gateway before the
// current rule scoped the tests' bearer token: by old. It returns its
// address.
func oldRuleGateway(t *testing.T, u *upstreamtest.Upstream, dbURL, old string) string {
	t.Helper()
	ctx := t.Context()
	doc, err := openapi3.NewLoader().LoadFromFile(u.Spec)
	require.NoError(t, err)
	routes, err := gateway.SpecRoutes(doc)
	require.NoError(t, err)
	pool, pg, err := openKeyTable(ctx, dbURL, pgstore.Options{})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	deferred, err := pg.ClaimAtCommit()
	require.NoError(t, err)
	upstream, err := url.Parse(u.URL)
	require.NoError(t, err)
	gw, err := gateway.New(gateway.Config{Upstream: upstream, Routes: routes,
		Scope: func(*http.Request) (string, error) { return old, nil }}, deferred)
	require.NoError(t, err)
	srv := httptest.NewServer(gw)
	t.Cleanup(func() {
		srv.Close()
		_ = gw.Shutdown(context.Background())
	})
	return strings.TrimPrefix(srv.URL, "http://")
}
