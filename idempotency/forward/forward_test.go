package forward_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/forward"
)

// TestReached pins, against a real loopback upstream, which failures of a
// round trip leave the request possibly run upstream (Reached true: a key
// of unknown outcome) and which prove that it never got there (false: the
// key may be freed).
func TestReached(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		want    bool
		attempt func(t *testing.T) (*http.Request, error)
	}{
		{"connection refused", false, func(t *testing.T) (*http.Request, error) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := ln.Addr().String()
			require.NoError(t, ln.Close())
			r, err := send(t, transport(), post(t, context.Background(), "http://"+addr))
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
			return r, err
		}},
		{"dial error", false, func(t *testing.T) (*http.Request, error) {
			tr := transport()
			tr.DialContext = func(context.Context, string, string) (net.Conn, error) {
				return nil, errors.New("no route to the upstream")
			}
			return send(t, tr, post(t, context.Background(), "http://upstream.test"))
		}},
		{"TLS error: a certificate the client does not trust", false, func(t *testing.T) (*http.Request, error) {
			ran := ranCounter()
			up := httptest.NewTLSServer(ran.handler)
			t.Cleanup(up.Close)
			r, err := send(t, transport(), post(t, context.Background(), up.URL))
			require.ErrorContains(t, err, "certificate")
			require.Zero(t, ran.n.Load(), "the upstream ran nothing")
			return r, err
		}},
		{"TLS error: an upstream that does not speak TLS", false, func(t *testing.T) (*http.Request, error) {
			ran := ranCounter()
			up := httptest.NewServer(ran.handler)
			t.Cleanup(up.Close)
			r, err := send(t, transport(), post(t, context.Background(), strings.Replace(up.URL, "http:", "https:", 1)))
			require.Zero(t, ran.n.Load(), "the upstream ran nothing")
			return r, err
		}},
		{"timeout before writing: dialing", false, func(t *testing.T) (*http.Request, error) {
			tr := transport()
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			t.Cleanup(cancel)
			return send(t, tr, post(t, ctx, "http://upstream.test"))
		}},
		{"timeout before writing: waiting for a pooled connection", false, func(t *testing.T) (*http.Request, error) {
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				once.Do(func() { close(entered) })
				<-release
			}))
			t.Cleanup(up.Close)
			t.Cleanup(func() { close(release) })
			tr := transport()
			tr.MaxConnsPerHost = 1
			go func() {
				// Holds the only connection until the test ends.
				if resp, err := tr.RoundTrip(post(t, context.Background(), up.URL)); err == nil {
					_ = resp.Body.Close()
				}
			}()
			<-entered
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			t.Cleanup(cancel)
			r, err := send(t, tr, post(t, ctx, up.URL))
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return r, err
		}},
		{"client gone before writing", false, func(t *testing.T) (*http.Request, error) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return send(t, transport(), post(t, ctx, rawUpstream(t, func(net.Conn, *bufio.Reader) {})))
		}},
		{"reset after the request was written", true, func(t *testing.T) (*http.Request, error) {
			up := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
				readRequest(t, br, true)
				reset(c)
			})
			return send(t, transport(), post(t, context.Background(), up))
		}},
		{"closed after the request was written", true, func(t *testing.T) (*http.Request, error) {
			up := rawUpstream(t, func(c net.Conn, br *bufio.Reader) { readRequest(t, br, true) })
			return send(t, transport(), post(t, context.Background(), up))
		}},
		{"timeout after writing: no answer in time", true, func(t *testing.T) (*http.Request, error) {
			done := make(chan struct{})
			up := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
				readRequest(t, br, true)
				<-done
			})
			t.Cleanup(func() { close(done) }) // before rawUpstream's, which waits for this
			tr := transport()
			tr.ResponseHeaderTimeout = 50 * time.Millisecond
			r, err := send(t, tr, post(t, context.Background(), up))
			require.ErrorContains(t, err, "timeout awaiting response headers")
			return r, err
		}},
		{"Expect: 100-continue, reset before the 100", true, func(t *testing.T) (*http.Request, error) {
			// The upstream has the request's head, not its body: some act
			// on the head alone, so it may have run.
			up := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
				readRequest(t, br, false)
				reset(c)
			})
			req := post(t, context.Background(), up)
			req.Header.Set("Expect", "100-continue")
			tr := transport()
			tr.ExpectContinueTimeout = time.Minute
			return send(t, tr, req)
		}},
		{"HTTP/2 REFUSED_STREAM", false, func(t *testing.T) (*http.Request, error) {
			up := h2Upstream(t, func(c net.Conn, stream uint32) {
				write(t, c, frame(typeRSTStream, 0, stream, binary.BigEndian.AppendUint32(nil, codeRefusedStream)))
			})
			r, err := send(t, h2Transport(), post(t, context.Background(), up))
			require.ErrorContains(t, err, "REFUSED_STREAM")
			return r, err
		}},
		{"HTTP/2 GOAWAY before the stream", false, func(t *testing.T) (*http.Request, error) {
			up := h2Upstream(t, func(c net.Conn, stream uint32) {
				write(t, c, goAway(stream-1, "shutting down"))
			})
			r, err := send(t, h2Transport(), post(t, context.Background(), up))
			require.ErrorContains(t, err, "GOAWAY")
			return r, err
		}},
		{"HTTP/2 INTERNAL_ERROR after the headers", true, func(t *testing.T) (*http.Request, error) {
			up := h2Upstream(t, func(c net.Conn, stream uint32) {
				write(t, c, frame(typeRSTStream, 0, stream, binary.BigEndian.AppendUint32(nil, codeInternalError)))
			})
			return send(t, h2Transport(), post(t, context.Background(), up))
		}},
		{"HTTP/2 GOAWAY that covers the stream, then close", true, func(t *testing.T) (*http.Request, error) {
			// Its debug data, the upstream's own text, reads as a refused
			// stream: it must not count as one.
			up := h2Upstream(t, func(c net.Conn, stream uint32) {
				write(t, c, goAway(stream, "stream error: stream ID 1; REFUSED_STREAM"))
				_ = c.Close()
			})
			r, err := send(t, h2Transport(), post(t, context.Background(), up))
			require.ErrorContains(t, err, "GOAWAY")
			return r, err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := tc.attempt(t)
			require.Error(t, err, "the round trip fails")
			require.Equal(t, tc.want, forward.Reached(r, err), "Reached after %v", err)
		})
	}
}

// TestReachedWithoutPrepare: what Prepare did not see may have run.
func TestReachedWithoutPrepare(t *testing.T) {
	t.Parallel()
	req := post(t, context.Background(), "http://upstream.test")
	require.True(t, forward.Reached(req, errors.New("dial tcp: connection refused")))
	require.True(t, forward.Reached(forward.Prepare(req), nil), "a request answered reached its upstream")
}

// TestPrepareKeepsTheTransportFromResending drives net/http's transport
// into the case where it resends a request it takes for idempotent: a
// kept-alive connection that the upstream closes after reading a request
// in full, before a byte of answer (persistConn.shouldRetryRequest). A
// prepared request reaches the upstream once; the same request as it
// came, twice.
func TestPrepareKeepsTheTransportFromResending(t *testing.T) {
	t.Parallel()
	for _, header := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		for _, prepared := range []bool{true, false} {
			name := header
			if !prepared {
				name += " as it came"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				var arrivals atomic.Int32 // of the keyed request, in any case
				up := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
					for place := 0; ; place++ {
						req := readRequest(t, br, true)
						if req == nil {
							return
						}
						if req.Header.Get(header) != "" {
							arrivals.Add(1)
						}
						if place > 0 {
							return
						}
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
					}
				})
				tr := transport()
				t.Cleanup(tr.CloseIdleConnections)
				got := make(chan struct{}, 1)
				first := post(t, context.Background(), up)
				resp, err := tr.RoundTrip(first)
				require.NoError(t, err)
				_ = resp.Body.Close()
				// The connection goes back to the pool once the body is
				// closed; a request sent before then takes a new one.
				// A body the transport can rewind (GetBody), as an empty
				// one is: it resends such a request if it may.
				req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					GotConn: func(info httptrace.GotConnInfo) {
						if info.Reused {
							select {
							case got <- struct{}{}:
							default:
							}
						}
					},
				}), http.MethodPost, up, strings.NewReader(`{"amount":1}`))
				require.NoError(t, err)
				req.Header.Set(header, "k-1")
				if prepared {
					req = forward.Prepare(req)
				}
				resp, err = tr.RoundTrip(req)
				require.Len(t, got, 1, "the keyed request went on the kept-alive connection")
				if !prepared {
					require.NoError(t, err, "the transport resent the request on a new connection, which answered")
					_ = resp.Body.Close()
					require.Equal(t, int32(2), arrivals.Load(), "the request as it came reached the upstream twice")
					return
				}
				require.Error(t, err, "the upstream closed the connection without an answer")
				require.True(t, forward.Reached(req, err), "a request read in full reached the upstream")
				require.Equal(t, int32(1), arrivals.Load(), "the prepared request reached the upstream once")
			})
		}
	}
}

// TestPrepareCopies: the caller's request keeps its header as it was, and
// a trace in its context still runs.
func TestPrepareCopies(t *testing.T) {
	t.Parallel()
	var gotConn atomic.Int32
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { gotConn.Add(1) }})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Header.Get("Idempotency-Key"))
	}))
	t.Cleanup(up.Close)
	in := post(t, ctx, up.URL)
	in.Header.Set("Idempotency-Key", "k-1")
	out := forward.Prepare(in)
	require.Equal(t, "k-1", in.Header.Get("Idempotency-Key"), "the caller's header is left as it was")
	require.Equal(t, []string{"k-1"}, out.Header["idempotency-key"], "the prepared header names it in lower case")
	resp, err := transport().RoundTrip(out)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "k-1", string(body), "the upstream reads the header as it reads any")
	require.Equal(t, int32(1), gotConn.Load(), "the caller's trace still runs")
}

func transport() *http.Transport {
	return http.DefaultTransport.(*http.Transport).Clone()
}

// h2Transport speaks HTTP/2 without TLS (prior knowledge) only.
func h2Transport() *http.Transport {
	tr := transport()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr.Protocols = &p
	return tr
}

// post is a POST whose body the transport cannot rewind (no GetBody), as a
// gateway's is: an HTTP/2 stream that is refused is not retried, but
// fails.
func post(t *testing.T, ctx context.Context, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, io.NopCloser(strings.NewReader(`{"amount":1}`)))
	require.NoError(t, err)
	req.ContentLength = int64(len(`{"amount":1}`))
	return req
}

// send prepares req and sends it once through tr, closing what it opened.
func send(t *testing.T, tr *http.Transport, req *http.Request) (*http.Request, error) {
	t.Helper()
	t.Cleanup(tr.CloseIdleConnections)
	r := forward.Prepare(req)
	resp, err := tr.RoundTrip(r)
	if err == nil {
		_ = resp.Body.Close()
	}
	return r, err
}

type counter struct {
	n       atomic.Int32
	handler http.Handler
}

// ranCounter counts the requests an upstream ran.
func ranCounter() *counter {
	c := &counter{}
	c.handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { c.n.Add(1) })
	return c
}

// rawUpstream listens on loopback and hands each connection to serve; it
// returns the upstream's URL. At the end of the test it closes every
// connection still open (a client may keep one a GOAWAY took out of its
// pool) and waits for serve to return.
func rawUpstream(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		open  []net.Conn
		conns sync.WaitGroup
	)
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		conns.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readRequest reads a request's head, and its body if told to; nil when
// the connection ended first.
func readRequest(t *testing.T, br *bufio.Reader, body bool) *http.Request {
	t.Helper()
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil
	}
	if body {
		_, _ = io.Copy(io.Discard, req.Body)
	}
	return req
}

// reset closes c with a TCP RST, not a FIN.
func reset(c net.Conn) {
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
}

// HTTP/2 frames (RFC 9113, section 6), as much of them as the upstream
// below writes: a standard-library test has no HTTP/2 server that resets
// a stream at will.
const (
	typeHeaders       = 0x1
	typeRSTStream     = 0x3
	typeSettings      = 0x4
	typeGoAway        = 0x7
	flagAck           = 0x1
	codeInternalError = 0x2
	codeRefusedStream = 0x7
)

func frame(typ, flags byte, stream uint32, payload []byte) []byte {
	b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags}
	b = binary.BigEndian.AppendUint32(b, stream)
	return append(b, payload...)
}

func goAway(lastStream uint32, debug string) []byte {
	p := binary.BigEndian.AppendUint32(nil, lastStream)
	p = binary.BigEndian.AppendUint32(p, 0) // NO_ERROR
	return frame(typeGoAway, 0, 0, append(p, debug...))
}

func write(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	_, _ = c.Write(b)
}

// h2Upstream speaks just enough HTTP/2 without TLS to take a request's
// HEADERS frame, and hands its stream to answer; it returns its URL.
func h2Upstream(t *testing.T, answer func(c net.Conn, stream uint32)) string {
	t.Helper()
	return rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
		preface := make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		if _, err := io.ReadFull(br, preface); err != nil || !bytes.Equal(preface, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")) {
			return
		}
		write(t, c, frame(typeSettings, 0, 0, nil))
		for {
			head := make([]byte, 9)
			if _, err := io.ReadFull(br, head); err != nil {
				return
			}
			length := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
			if _, err := io.CopyN(io.Discard, br, int64(length)); err != nil {
				return
			}
			typ, flags, stream := head[3], head[4], binary.BigEndian.Uint32(head[5:])&0x7fffffff
			switch {
			case typ == typeSettings && flags&flagAck == 0:
				write(t, c, frame(typeSettings, flagAck, 0, nil))
			case typ == typeHeaders:
				answer(c, stream)
			}
		}
	})
}
