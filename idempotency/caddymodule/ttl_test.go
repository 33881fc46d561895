package caddymodule_test

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// TestCaddySaysHowLongKeysAreKept: behind a real Caddy, every answer to a
// request with a key (the upstream's, its replay, the module's own 502)
// carries Idempotency-TTL, the site's ttl in seconds, in place of the one
// the upstream sent; a request without a scope is refused without it.
func TestCaddySaysHowLongKeysAreKept(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Idempotency-TTL", "5") // the upstream's own: Caddy keeps the key
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"t1"}`))
	}))
	t.Cleanup(up.Close)
	bin := buildCaddy(t)
	addrs := freeAddrs(t, 3)
	live, dead, gone := addrs[0], addrs[1], addrs[2]
	site := func(addr, upstream string) string {
		return fmt.Sprintf("http://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t\tttl 90m\n\t}\n\treverse_proxy %s\n}\n", addr, upstream)
	}
	startCaddy(t, bin, "{\n\tadmin off\n\tauto_https off\n}\n"+site(live, up.Listener.Addr().String())+site(dead, gone), live, dead)

	scope, key := "acct-"+rand.Text(), rand.Text()
	first, body := post(t, live, scope, key, "")
	require.Equal(t, http.StatusCreated, first.StatusCode, body)
	require.Equal(t, []string{"5400"}, first.Header.Values("Idempotency-TTL"), "the first answer: the site's ttl, not the upstream's")
	again, body := post(t, live, scope, key, "")
	require.Equal(t, "true", again.Header.Get(idempotency.HeaderReplayed), "a replay: %s", body)
	require.Equal(t, []string{"5400"}, again.Header.Values("Idempotency-TTL"), "a replay")
	down, body := post(t, dead, scope, rand.Text(), "")
	require.Equal(t, http.StatusBadGateway, down.StatusCode, body)
	require.Equal(t, []string{"5400"}, down.Header.Values("Idempotency-TTL"), "the module's own 502")
	refused, body := post(t, live, "", rand.Text(), "")
	require.Equal(t, http.StatusUnauthorized, refused.StatusCode, body)
	require.Empty(t, refused.Header.Values("Idempotency-TTL"), "a request refused before its key is looked at")
}
