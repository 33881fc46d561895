// Package httpserver serves an http.Handler to untrusted clients: every
// connection is bounded in time, and shutdown waits only for requests that
// are really running.
//
// net/http alone bounds only what it is told to. With just a
// ReadHeaderTimeout, a client that sends its headers and then stalls in its
// body, or idles on a keep-alive connection, holds a connection (and a file
// descriptor) for ever, and http.Server.Shutdown waits for every such
// connection until its deadline runs out. Serve adds:
//
//   - a body deadline that follows a minimum transfer rate: a request's
//     first n body bytes must arrive within BodyTimeout + n/MinBodyRate of
//     waiting for them (from the headers, when the body is read first), so
//     a client that stalls is cut off after BodyTimeout and
//     one that trickles below the rate soon after, while a slow but steady
//     upload of a large body is never cut;
//   - a write deadline that follows a minimum rate in the same way: each
//     write of n bytes must be taken by the client within WriteTimeout +
//     n/MinWriteRate, so a client that stops reading is cut off and its
//     request's slot freed, while a slow event stream that the client
//     reads is never cut (only writes are timed, not the gaps between);
//   - IdleTimeout for keep-alive connections;
//   - a cap on requests admitted at once, taken before the body is read,
//     beyond which a request is answered at once with 503 and
//     Retry-After, without its body being read, and a cap on open
//     connections, at which a new one replaces one with no request running
//     (idle, or stalled longest) or, with none, is closed at once;
//   - graceful shutdown that closes at once every connection with no request
//     under way, and lets the requests that are finish within
//     ShutdownTimeout, but not wait on a client that has stopped sending.
//
// # Running and stalled requests
//
// Shutdown must tell a request that is running (its handler may be writing
// to a database; cutting it off would lose work) from a connection that
// merely holds a socket: idle, sending headers, or sending a body that does
// not come. Serve wraps the handler so that the request body is read in
// full, up to MaxBodyBytes and under the body deadline, before the wrapped
// handler is called, and only then marks the request running. The other
// phases come from http.Server.ConnState (new, active, idle, closed).
// (With StreamBodies the request is marked running before its body is in;
// once the drain has started, each further read of its body must bring
// bytes within drainStall.) At
// shutdown:
//
//   - a connection idle, new, or still sending headers is closed at once;
//   - one whose body is being read is given 250 ms to bring its next bytes,
//     and so on until the body is in: a client uploading when SIGTERM
//     comes is served, one that has stopped sending is closed;
//   - a running request is waited for, up to ShutdownTimeout.
//
// A connection closed before its request was marked running has not
// reached the application at all, so closing it loses nothing and a retry
// is safe, whatever the method. Marking and closing share one lock, so a
// request is either closed before it runs or runs to its end (within
// ShutdownTimeout).
//
// Why not the other ways: http.Server.Shutdown alone waits for every
// connection that is not idle, stalled ones included, until its deadline.
// A ConnState of "active" alone cannot tell a handler blocked on a stalled
// body from one doing work. A per-request timer cannot tell a slow upload
// from a long operation.
//
// Reading the body first has a price: the handler never streams its body,
// and up to MaxBodyBytes is buffered per request admitted (so at most
// MaxInFlight × MaxBodyBytes, of bytes that clients really sent: the slot
// is taken before the body is read). It suits an API of small JSON bodies,
// which is what this package is for; StreamBodies is for a handler that
// passes bodies on.
//
// Serve speaks HTTP/1.1 only: one request at a time per connection is what
// lets a connection's phase stand for its request's.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Config configures Serve. Only Handler is required; every zero field takes
// the default its comment gives.
type Config struct {
	// Handler serves every request, after its body has been read.
	Handler http.Handler

	// MaxBodyBytes bounds a request body (default 1 MiB). A larger body is
	// not read past the limit: the handler gets the first MaxBodyBytes and
	// then an *http.MaxBytesError from r.Body, so it answers 413 in its own
	// words, and the connection is closed after the reply.
	MaxBodyBytes int64

	// ReadHeaderTimeout bounds the time to read a request's headers
	// (default 10 s).
	ReadHeaderTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers, its request line included
	// (default 32 KiB; net/http's own default is 1 MiB). Beyond it the
	// answer is 431, before anything is logged.
	MaxHeaderBytes int

	// BodyTimeout and MinBodyRate bound the time to read a body: its first
	// n bytes must have arrived after at most BodyTimeout + n/MinBodyRate
	// spent waiting for them (with StreamBodies, the time the handler
	// spends between its reads does not count), or the connection is
	// closed without an answer (as net/http does on a header timeout: a
	// client that stopped sending is gone or hostile, and need not be
	// waited on to read a reply). The defaults, 5 s and 32 KiB/s, give a
	// 1 MiB body 37 s.
	BodyTimeout time.Duration
	// MinBodyRate is in bytes per second; see BodyTimeout.
	MinBodyRate int64

	// StreamBodies hands the handler the request body as it arrives, under
	// the same deadline and limit, instead of reading it in full first: for
	// a handler that passes bodies on (a reverse proxy) and buffers only
	// what it must. Such a request counts as running from the start, so a
	// shutdown waits for it, but a body that stops coming is still cut off
	// as above (and, once shutdown has started, a read that finds no bytes
	// within 250 ms).
	StreamBodies bool

	// WriteTimeout and MinWriteRate bound the time a client may take to
	// read the response: each write of n bytes to the connection must be
	// taken within WriteTimeout + n/MinWriteRate of its start, or the
	// connection is closed and the request's slot freed. Only writes are
	// timed, not the gaps between them, so a handler that sends a slow
	// event stream to a client that reads it is never cut off. The
	// defaults, 10 s and 32 KiB/s, give a 32 KiB write 11 s.
	WriteTimeout time.Duration
	// MinWriteRate is in bytes per second; see WriteTimeout.
	MinWriteRate int64

	// IdleTimeout closes a keep-alive connection that has sent no new
	// request for that long (default 60 s).
	IdleTimeout time.Duration

	// ShutdownTimeout is how long requests under way when ctx ends may take
	// to finish (default 30 s). Connections with none (idle, or sending
	// headers) are closed at once; a request whose body is being read may
	// finish as long as no 250 ms pass without a byte of it.
	ShutdownTimeout time.Duration

	// MaxConns caps open connections (default three quarters of the
	// process's open-file limit, at most 10,000, leaving the rest to the
	// database pool, logs and the like; 1,000 where the limit is unknown).
	// At the cap a new connection takes the place of the one idle longest,
	// or with none idle of the one that has spent longest sending its
	// request, so neither idle nor stalled clients can lock new ones out.
	// Only when every connection has a request running is a new one closed
	// at once: its client sees a reset instead of waiting in the accept
	// queue until it times out. It guards file descriptors; overload should
	// meet MaxInFlight first.
	MaxConns int

	// MaxInFlight caps requests admitted at once (default 256): a request
	// holds its slot from before its body is read until its response is
	// written. A request beyond it is answered at once by Overloaded,
	// without its body being read (a request with a body is then answered
	// Connection: close), rather than queueing for the database until its
	// own timeout.
	MaxInFlight int

	// RetryAfter is the Retry-After sent with Overloaded's answer, in whole
	// seconds rounded up (default 1 s).
	RetryAfter time.Duration

	// Overloaded answers a request beyond MaxInFlight; Retry-After is
	// already set on w. The default is a 503 RFC 9457 problem of type
	// https://oncekey.dev/problems/unavailable.
	Overloaded func(w http.ResponseWriter, r *http.Request)

	// Logger receives the shutdown's progress, warnings (at most once a
	// minute each) when a cap turns clients away, and net/http's own errors
	// (default slog.Default()).
	Logger *slog.Logger
}

const (
	defaultMaxBodyBytes      = 1 << 20
	defaultReadHeaderTimeout = 10 * time.Second
	defaultMaxHeaderBytes    = 32 << 10
	defaultBodyTimeout       = 5 * time.Second
	defaultMinBodyRate       = 32 << 10
	defaultWriteTimeout      = 10 * time.Second
	defaultMinWriteRate      = 32 << 10
	defaultIdleTimeout       = 60 * time.Second
	defaultShutdownTimeout   = 30 * time.Second
	defaultMaxInFlight       = 256
	defaultRetryAfter        = time.Second
)

// defaultMaxConns leaves a quarter of the open-file limit to everything
// else the process opens.
func defaultMaxConns() int {
	limit := openFileLimit()
	if limit <= 0 {
		return 1000
	}
	return max(1, min(limit*3/4, 10_000))
}

func (c Config) withDefaults() Config {
	setDefault(&c.MaxBodyBytes, defaultMaxBodyBytes)
	setDefault(&c.ReadHeaderTimeout, defaultReadHeaderTimeout)
	setDefault(&c.MaxHeaderBytes, defaultMaxHeaderBytes)
	setDefault(&c.BodyTimeout, defaultBodyTimeout)
	setDefault(&c.MinBodyRate, defaultMinBodyRate)
	setDefault(&c.WriteTimeout, defaultWriteTimeout)
	setDefault(&c.MinWriteRate, defaultMinWriteRate)
	setDefault(&c.IdleTimeout, defaultIdleTimeout)
	setDefault(&c.ShutdownTimeout, defaultShutdownTimeout)
	setDefault(&c.MaxConns, defaultMaxConns())
	setDefault(&c.MaxInFlight, defaultMaxInFlight)
	setDefault(&c.RetryAfter, defaultRetryAfter)
	if c.Overloaded == nil {
		c.Overloaded = writeUnavailable
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// setDefault replaces a zero or negative setting: none of them has a
// meaning at or below zero (net/http would read zero as "no timeout").
func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Serve serves cfg.Handler on ln until ctx ends, then shuts down: it stops
// accepting, closes every connection with no request running, and waits up
// to cfg.ShutdownTimeout for the requests that are. It returns nil when
// they all finished in time, and an error if they did not (they are then
// cut off) or if ln failed.
//
// Request contexts are not cancelled when ctx ends, only when their
// connection closes, so a running request is not cut short by the shutdown
// that waits for it.
func Serve(ctx context.Context, ln net.Listener, cfg Config) error {
	if cfg.Handler == nil {
		return errors.New("httpserver: Config.Handler is nil")
	}
	cfg = cfg.withDefaults()
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	conns := newConns(cfg.MaxConns, cfg.Logger)
	srv := &http.Server{
		Handler:           newAdmission(cfg, conns),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		IdleTimeout:       cfg.IdleTimeout,
		ConnState:         conns.observe,
		ConnContext:       withConn,
		Protocols:         &protocols,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		_ = srv.Close()
		return fmt.Errorf("httpserver: %w", err)
	case <-ctx.Done():
	}

	// http.Server.Shutdown alone would wait for every connection that is
	// not idle, a stalled one included, until its deadline; drain first
	// closes those with no request under way and gives a body being read
	// drainStall to keep coming. Connections accepted between the drain and
	// Shutdown's closing the listener are closed as they come (observe,
	// StateNew).
	start := time.Now()
	closed, reading, running := conns.drain()
	cfg.Logger.Info("shutting down: closed the connections with no request under way; waiting for the rest",
		"closed", closed, "reading_body", reading, "running", running, "timeout", cfg.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	<-served // http.ErrServerClosed, now that the listener is closed
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("httpserver: requests still running after %s: %w", cfg.ShutdownTimeout, err)
	}
	cfg.Logger.Info("shut down", "took", time.Since(start).String())
	return nil
}
