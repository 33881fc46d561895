package httpserver_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/httpserver"
)

// Every way of holding a connection without finishing a request is cut off
// by its own timeout. docs/reliability.md quotes these figures.
func TestHostileClientsAreCutOff(t *testing.T) {
	t.Parallel()
	const (
		headerTimeout = 300 * time.Millisecond
		bodyTimeout   = 400 * time.Millisecond
		idleTimeout   = 500 * time.Millisecond
		minBodyRate   = 64 << 10
		limit         = 64 << 10
	)
	cfg := httpserver.Config{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			}
		}),
		ReadHeaderTimeout: headerTimeout,
		BodyTimeout:       bodyTimeout,
		MinBodyRate:       minBodyRate,
		IdleTimeout:       idleTimeout,
		MaxBodyBytes:      limit,
	}
	for _, tc := range []struct {
		name string
		// hold makes c a hostile connection; heldFor is timed from its return.
		hold func(t *testing.T, c net.Conn)
		want time.Duration
		// reply is the start of what the server sends after hold starts ("" for
		// nothing: it just closes).
		reply string
	}{
		{
			name: "connects and sends nothing",
			hold: func(*testing.T, net.Conn) {},
			want: headerTimeout,
		},
		{
			name: "stalls in the headers",
			hold: func(t *testing.T, c net.Conn) { write(t, c, "POST / HTTP/1.1\r\nHost: test\r\n") },
			want: headerTimeout,
		},
		{
			name: "stalls in a Content-Length body",
			hold: func(t *testing.T, c net.Conn) { write(t, c, headers(1000)+`{"items":`) },
			want: bodyTimeout,
		},
		{
			name: "stalls in a chunked body",
			hold: func(t *testing.T, c net.Conn) { write(t, c, headers(-1)+"9\r\n{\"items\":\r\n") },
			want: bodyTimeout,
		},
		{
			// 3.2 KB/s against a minimum of 64 KiB/s: the deadline moves on
			// by 5 % of the time that passes, so it is met just after
			// bodyTimeout. A deadline sized to the body limit alone would
			// hold it for bodyTimeout + 1 s; one reset by every byte, for
			// ever.
			name: "trickles its body below the minimum rate",
			hold: func(t *testing.T, c net.Conn) {
				write(t, c, headers(60<<10))
				go func() {
					for {
						if _, err := c.Write(bytes.Repeat([]byte("x"), 64)); err != nil {
							return
						}
						pace(20 * time.Millisecond)
					}
				}()
			},
			want: bodyTimeout * 21 / 20,
		},
		{
			// Answered as soon as the limit is passed, and closed at once
			// rather than drained: the rest of the body never comes.
			name: "declares a body over the limit, sends past the limit, stalls",
			hold: func(t *testing.T, c net.Conn) {
				write(t, c, headers(limit+100<<10)+strings.Repeat("x", limit+1))
			},
			want:  0,
			reply: "HTTP/1.1 413 ",
		},
		{
			name: "idles on a keep-alive connection",
			hold: func(t *testing.T, c net.Conn) {
				require.Equal(t, http.StatusOK, roundTrip(t, c, bufio.NewReader(c), http.MethodGet, "").StatusCode)
			},
			want: idleTimeout,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, cfg)
			c := b.dial(t)
			tc.hold(t, c)
			held, reply := heldFor(t, c, 3*time.Second)
			t.Logf("held for %s (want about %s)", held.Round(time.Millisecond), tc.want)
			if tc.reply == "" {
				require.Empty(t, reply)
			} else {
				require.True(t, strings.HasPrefix(reply, tc.reply), "reply %q", reply)
			}
			// The server's clock starts a little before ours (at accept, or
			// at the headers), and a loaded machine may run a timer late.
			require.GreaterOrEqual(t, held, tc.want*3/4, "closed before its timeout: something else closed it")
			require.Less(t, held, tc.want+500*time.Millisecond, "held past its timeout")
		})
	}
}

// A well-behaved client is never cut off: a body up to the limit arrives
// whole, however long its upload takes as long as it keeps the minimum rate,
// and the handler may then run past the body deadline.
func TestBodiesUpToTheLimitArriveWhole(t *testing.T) {
	t.Parallel()
	const (
		limit       = 64 << 10
		bodyTimeout = 200 * time.Millisecond
		minBodyRate = 64 << 10
		// runFor takes the handler past any read deadline the body could
		// have set: bodyTimeout + limit/minBodyRate after it started.
		runFor = bodyTimeout + time.Second + 100*time.Millisecond
	)
	// The handler answers with the digest of the body it read, after
	// running past the body deadline with its context intact.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		pace(runFor)
		if err := r.Context().Err(); err != nil {
			http.Error(w, "context ended while running: "+err.Error(), http.StatusInternalServerError)
			return
		}
		sum := sha256.Sum256(body)
		_, _ = fmt.Fprintf(w, "%d %s", len(body), hex.EncodeToString(sum[:]))
	})
	cfg := httpserver.Config{Handler: handler, MaxBodyBytes: limit, BodyTimeout: bodyTimeout, MinBodyRate: minBodyRate}

	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		pace    time.Duration // between 4 KiB chunks
		want    int
	}{
		// 60 KiB at about 130 KB/s, twice the minimum rate: 450 ms, more
		// than twice the body timeout.
		{name: "near the limit, paced", size: 60 << 10, pace: 30 * time.Millisecond, want: http.StatusOK},
		{name: "near the limit, paced, chunked", size: 60 << 10, chunked: true, pace: 30 * time.Millisecond, want: http.StatusOK},
		{name: "exactly the limit", size: limit, want: http.StatusOK},
		{name: "one byte over the limit", size: limit + 1, want: http.StatusRequestEntityTooLarge},
		{name: "over the limit, chunked", size: 2 * limit, chunked: true, want: http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, cfg)
			body := bytes.Repeat([]byte("0123456789abcdef"), tc.size/16+1)[:tc.size]
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.url, &pacedBody{r: bytes.NewReader(body), pace: tc.pace})
			require.NoError(t, err)
			req.ContentLength = int64(tc.size)
			if tc.chunked {
				req.ContentLength = -1
			}
			start := time.Now()
			resp, err := client(t).Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			t.Logf("%d in %s", resp.StatusCode, time.Since(start).Round(time.Millisecond))
			require.Equal(t, tc.want, resp.StatusCode, string(got))
			if tc.want == http.StatusOK {
				sum := sha256.Sum256(body)
				require.Equal(t, fmt.Sprintf("%d %s", tc.size, hex.EncodeToString(sum[:])), string(got))
			}
		})
	}
}

// pace holds a slow peer back for d: this package's tests are about slow
// clients and handlers (a trickled body, a quiet event stream, a handler
// that outruns the body deadline, a client keeping to Retry-After), so the
// slowness is what is tested and nothing is waited for.
func pace(d time.Duration) {
	time.Sleep(d) // pacing: a peer slow on purpose, not a wait for anything
}

// pacedBody hands out 4 KiB at a time, pausing pace before each chunk after
// the first.
type pacedBody struct {
	r       io.Reader
	pace    time.Duration
	started bool
}

func (p *pacedBody) Read(b []byte) (int, error) {
	if p.started {
		pace(p.pace)
	}
	p.started = true
	return p.r.Read(b[:min(len(b), 4<<10)])
}
