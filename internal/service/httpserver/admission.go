package httpserver

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/oncekey/oncekey/internal/wire/problem"
)

// admission wraps the application's handler: it takes a request's slot
// first, then reads the body in full under the body deadline (or, with
// StreamBodies, hands it on paced), and calls the handler only then, with
// a ResponseWriter that paces the writes.
type admission struct {
	cfg   Config
	conns *conns
	// slots holds one token per admitted request, up to MaxInFlight.
	slots      chan struct{}
	retryAfter string
	overloaded throttle
}

func newAdmission(cfg Config, conns *conns) *admission {
	return &admission{
		cfg:        cfg,
		conns:      conns,
		slots:      make(chan struct{}, cfg.MaxInFlight),
		retryAfter: strconv.Itoa(int(math.Ceil(cfg.RetryAfter.Seconds()))),
	}
}

func (a *admission) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	// Anything net/http writes before the handler does (100 Continue, the
	// overload answer) is bounded too.
	_ = rc.SetWriteDeadline(time.Now().Add(a.cfg.WriteTimeout))
	hasBody := r.Body != nil && r.Body != http.NoBody
	// The slot comes before the body: a body is buffered only for a request
	// that may run, so at most MaxInFlight bodies are in memory at once.
	select {
	case a.slots <- struct{}{}:
		defer func() { <-a.slots }()
	default:
		a.refuse(w, rc, r, hasBody)
		return
	}
	whole := true
	if hasBody {
		paced := &pacedReader{
			// MaxBytesReader, given w, also marks the response Connection:
			// close once the limit is hit, so net/http does not try to drain
			// the rest of an oversized body (with no deadline) after the reply.
			body:     http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes),
			rc:       rc,
			grace:    a.cfg.BodyTimeout,
			rate:     float64(a.cfg.MinBodyRate),
			draining: &a.conns.draining,
		}
		if a.cfg.StreamBodies {
			paced.clearAtEOF = true
			r.Body, whole = readCloser{paced, r.Body}, false
			// Set now, not at the first read: when a handler answers without
			// reading the body, net/http reads (up to 256 KiB of) it before
			// the answer goes out, which must not wait for ever on a stalled
			// client, whose connection is marked running.
			_ = rc.SetReadDeadline(time.Now().Add(paced.grace))
		} else {
			var err error
			if whole, err = a.readBody(rc, r, paced); err != nil {
				// Stalled, too slow, or gone: close the connection without an
				// answer. ErrAbortHandler is net/http's way to do so silently.
				a.cfg.Logger.Debug("closed a connection whose request body did not arrive in time",
					"remote", r.RemoteAddr, "error", err.Error())
				panic(http.ErrAbortHandler)
			}
		}
	}
	if !a.conns.run(connOf(r)) {
		// Closed by the drain, or to make room, before the request could
		// run: nothing of it reached the application.
		panic(http.ErrAbortHandler)
	}
	if whole {
		// No read deadline while the handler runs: it would end net/http's
		// background read (which watches for the client going away) and so
		// cancel the running request's context. Cleared only now that the
		// request is marked running: until then the drain may set one.
		_ = rc.SetReadDeadline(time.Time{})
	}
	a.cfg.Handler.ServeHTTP(&pacedWriter{ResponseWriter: w, rc: rc, grace: a.cfg.WriteTimeout, rate: float64(a.cfg.MinWriteRate)}, r)
	// net/http flushes what the handler left buffered once it returns: that
	// last write gets its own deadline, not what is left of the handler's
	// last one (an event stream may have gone quiet for long before).
	_ = rc.SetWriteDeadline(time.Now().Add(a.cfg.WriteTimeout))
}

// refuse answers a request beyond MaxInFlight at once, without reading its
// body. A request with a body is answered Connection: close, so that
// net/http does not read the body before the answer (it would to keep the
// connection); after the answer it reads up to 256 KiB of it, so that
// closing does not reset the connection under the client's feet, within
// BodyTimeout.
func (a *admission) refuse(w http.ResponseWriter, rc *http.ResponseController, r *http.Request, hasBody bool) {
	a.overloaded.warn(a.cfg.Logger, "requests refused: MaxInFlight requests are running", "max_in_flight", a.cfg.MaxInFlight)
	w.Header().Set("Retry-After", a.retryAfter)
	if hasBody {
		w.Header().Set("Connection", "close")
		_ = rc.SetReadDeadline(time.Now().Add(a.cfg.BodyTimeout))
	}
	a.cfg.Overloaded(w, r)
}

// writeUnavailable is Config.Overloaded's default.
func writeUnavailable(w http.ResponseWriter, _ *http.Request) {
	problem.Write(w, problem.Unavailable, "the server is running as many requests as it can; retry after the delay in Retry-After")
}

// readBody replaces r.Body with the body read in full through paced, and
// reports whether it was. A body over the limit is read only up to it; the
// handler then gets those bytes followed by the *http.MaxBytesError, and
// answers 413 as it would have on its own.
func (a *admission) readBody(rc *http.ResponseController, r *http.Request, paced *pacedReader) (whole bool, err error) {
	body, err := io.ReadAll(paced)
	if err != nil {
		// Stalled, too slow, gone, or too large: either way the connection
		// closes after this request, and the deadline is left passed. On its
		// way out net/http drains up to 256 KiB of an unread body, which
		// would otherwise wait on a stalled client with no deadline at all.
		_ = rc.SetReadDeadline(time.Unix(1, 0))
		if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
			return false, nil
		}
		return false, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body)) // known now, chunked or not
	return true, nil
}

// pacedReader moves the connection's read deadline along with the body:
// after n bytes, the next ones are due once grace + n/rate has been spent
// waiting for the client in Read (time between reads is the handler's, and
// does not count). A client sending at least rate bytes a second keeps
// ahead of it by grace; one that stalls is cut off grace after its last
// burst was due. Once shutdown has started, the next bytes are also due
// within drainStall.
type pacedReader struct {
	body     io.Reader
	rc       *http.ResponseController
	grace    time.Duration
	rate     float64 // bytes per second
	draining *atomic.Bool
	n        int64
	// waited is the time spent in Read, waiting for the client: only that
	// counts, not the time the handler spends between reads (a handler
	// that streams the body on reads it only as fast as it can pass it).
	waited time.Duration
	// clearAtEOF clears the read deadline once the body is in, for a body
	// the handler reads itself (StreamBodies): net/http's background read,
	// which starts then, would cancel the request's context at a deadline.
	clearAtEOF bool
}

func (p *pacedReader) Read(b []byte) (int, error) {
	began := time.Now()
	due := began.Add(p.grace + time.Duration(float64(p.n)/p.rate*float64(time.Second)) - p.waited)
	if err := p.rc.SetReadDeadline(due); err != nil {
		return 0, err
	}
	// Checked after setting the deadline: if the drain came in between, it
	// has set its own, which the line above may have undone; this sets it
	// again. (The drain stores the flag before it sets deadlines.)
	if p.draining.Load() {
		if stall := time.Now().Add(drainStall); stall.Before(due) {
			if err := p.rc.SetReadDeadline(stall); err != nil {
				return 0, err
			}
		}
	}
	n, err := p.body.Read(b)
	p.n += int64(n)
	p.waited += time.Since(began)
	if err == io.EOF && p.clearAtEOF && !p.draining.Load() {
		_ = p.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// readCloser is a paced body that closes the body it reads.
type readCloser struct {
	io.Reader
	io.Closer
}

// pacedWriter moves the connection's write deadline along with the
// response: each write (or flush) of n bytes is due grace + n/rate after
// it starts. It measures the client's reading, not the handler's pace: a
// client that stops reading is cut off grace after its buffers fill, and
// its request's slot is freed, while a handler that writes an event a
// minute to a client that reads it is never cut, since no write is pending
// between events. Bytes net/http still holds buffered from earlier writes
// (a few KiB) go out within grace.
type pacedWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	grace time.Duration
	rate  float64 // bytes per second
}

func (p *pacedWriter) due(n int) {
	_ = p.rc.SetWriteDeadline(time.Now().Add(p.grace + time.Duration(float64(n)/p.rate*float64(time.Second))))
}

// WriteHeader sets the deadline too: an interim (1xx) answer is written
// at once.
func (p *pacedWriter) WriteHeader(status int) {
	p.due(0)
	p.ResponseWriter.WriteHeader(status)
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	p.due(len(b))
	return p.ResponseWriter.Write(b)
}

// FlushError is what http.ResponseController.Flush calls.
func (p *pacedWriter) FlushError() error {
	p.due(0)
	return p.rc.Flush()
}

// Flush implements http.Flusher, for handlers that assert it.
func (p *pacedWriter) Flush() { _ = p.FlushError() }

// Unwrap lets http.ResponseController reach the connection's writer
// (Hijack, EnableFullDuplex).
func (p *pacedWriter) Unwrap() http.ResponseWriter { return p.ResponseWriter }

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
