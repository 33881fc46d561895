package upstreamtest_test

import (
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/gateway/upstreamtest"
)

// TestFaults: upstream.py runs every request it is sent, duplicates
// included, and makes each fault as its doc says: a slow answer comes
// late, a failure is a 500 that ran nothing, a reset and a hang run the
// transfer but leave the client without an answer.
func TestFaults(t *testing.T) {
	t.Parallel()
	u := upstreamtest.Start(t)
	// A connection of its own for every request: net/http replays a
	// request with an Idempotency-Key on its own when a reused connection
	// breaks before the answer (a reset, here), which would run it twice.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	post := func(key, fault string) (*http.Response, time.Duration, error) {
		req, err := http.NewRequest(http.MethodPost, u.URL+"/transfers", strings.NewReader(`{"amount":500,"currency":"EUR"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		if fault != "" {
			req.Header.Set(upstreamtest.Header, fault)
		}
		start := time.Now()
		resp, err := client.Do(req)
		if resp != nil {
			resp.Body.Close()
		}
		return resp, time.Since(start), err
	}
	for _, tc := range []struct {
		name  string
		fault string
		check func(t *testing.T, resp *http.Response, took time.Duration, err error)
		runs  int
	}{
		{"no fault, twice", "", func(t *testing.T, resp *http.Response, _ time.Duration, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
		}, 2},
		{"slow", upstreamtest.Slow(300 * time.Millisecond), func(t *testing.T, resp *http.Response, took time.Duration, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, resp.StatusCode)
			require.GreaterOrEqual(t, took, 300*time.Millisecond)
		}, 1},
		{"fail", upstreamtest.Fail, func(t *testing.T, resp *http.Response, _ time.Duration, err error) {
			require.NoError(t, err)
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		}, 0},
		{"reset", upstreamtest.Reset, func(t *testing.T, _ *http.Response, _ time.Duration, err error) {
			require.Error(t, err, "no answer")
			require.True(t, errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "EOF"), "%v", err)
		}, 1},
		{"hang", upstreamtest.Hang, func(t *testing.T, _ *http.Response, took time.Duration, err error) {
			require.Error(t, err, "no answer")
			require.GreaterOrEqual(t, took, 2*time.Second, "waited until the client gave up: %v", err)
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := uuid.NewString()
			sends := max(tc.runs, 1)
			for range sends {
				resp, took, err := post(key, tc.fault)
				tc.check(t, resp, took, err)
			}
			require.Eventually(t, func() bool {
				_, byKey := u.Executions(t)
				return byKey[key] == tc.runs
			}, 5*time.Second, 20*time.Millisecond, "runs of key %s", key)
		})
	}
}
