package main

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// TestUpstreamExportsIsWholeAndTheSame: the large-body phase's upstream
// answers exactly the bytes asked for, the same ones every time (so that a
// replay could be compared with its first request), bytes PostgreSQL
// cannot compress, and refuses a size past maxExport.
func TestUpstreamExportsIsWholeAndTheSame(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(upstreamExports))
	t.Cleanup(up.Close)
	get := func(size int64) (int, []byte) {
		resp, err := http.Post(up.URL+"/exports?size="+strconv.FormatInt(size, 10), "", http.NoBody)
		require.NoError(t, err, "POST /exports?size=%d", size)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err, "the body of size %d", size)
		return resp.StatusCode, b
	}
	for _, size := range []int64{0, 1, 32<<10 + 1, 1 << 20} {
		status, first := get(size)
		require.Equal(t, http.StatusOK, status, "size %d", size)
		require.Len(t, first, int(size), "size %d: the answer has every byte asked for", size)
		_, again := get(size)
		require.Equal(t, sha256.Sum256(first), sha256.Sum256(again), "size %d: every answer of a size is the same", size)
	}
	_, mib := get(1 << 20)
	require.Greater(t, len(mib)/2, bytes.Count(mib, mib[:1])*100, "the bytes are not one byte repeated")
	status, _ := get(maxExport + 1)
	require.Equal(t, http.StatusBadRequest, status, "a size past maxExport is refused")
}

// TestSendLargeChecksEveryAnswer: the load generator of the large-body
// phase fails on an answer that is not whole, not a 200, or replayed when
// it should not be (or the reverse), so that a broken gateway cannot
// benchmark fast; and a plain reverse proxy in front of the upstream
// passes every answer whole.
func TestSendLargeChecksEveryAnswer(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	up := httptest.NewServer(http.HandlerFunc(upstreamExports))
	t.Cleanup(up.Close)
	to, err := url.Parse(up.URL)
	require.NoError(t, err, "the upstream's URL")
	plain := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(to) }})
	t.Cleanup(plain.Close)
	for _, tc := range []struct {
		name       string
		handler    http.Handler
		wantReplay bool
		wantErr    string
	}{
		{name: "whole, through a plain proxy", handler: nil},
		{name: "short", handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write(make([]byte, size-1))
		}), wantErr: "the body has 1048575 bytes"},
		{name: "not a 200", handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusConflict)
		}), wantErr: "answered 409"},
		{name: "a replay where a first request was wanted", handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(idempotency.HeaderReplayed, "true")
			upstreamExports(w, r)
		}), wantErr: "want a replay: false"},
		{name: "a first request where a replay was wanted", handler: http.HandlerFunc(upstreamExports), wantReplay: true, wantErr: "want a replay: true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			target := plain.URL
			if tc.handler != nil {
				srv := httptest.NewServer(tc.handler)
				t.Cleanup(srv.Close)
				target = srv.URL
			}
			// Many times: a plain proxy once dropped one answer in three
			// hundred (see sendLarge).
			for i := range 500 {
				err := sendLarge(t.Context(), http.DefaultClient, target, "key", "k", size, tc.wantReplay)
				if tc.wantErr == "" {
					require.NoError(t, err, "request %d", i)
					continue
				}
				require.ErrorContains(t, err, tc.wantErr, "the generator refuses the answer")
				break
			}
		})
	}
}
