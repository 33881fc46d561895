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

	"github.com/oncekey/oncekey/internal/problem"
)

// admission wraps the application's handler: it reads the request body in
// full, under the body deadline, and calls the handler only then.
type admission struct {
	cfg   Config
	conns *conns
	// slots holds one token per running request, up to MaxInFlight.
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
	whole := true
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		if whole, err = a.readBody(w, rc, r); err != nil {
			// Stalled, too slow, or gone: close the connection without an
			// answer. ErrAbortHandler is net/http's way to do so silently.
			a.cfg.Logger.Debug("closed a connection whose request body did not arrive in time",
				"remote", r.RemoteAddr, "error", err.Error())
			panic(http.ErrAbortHandler)
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
	select {
	case a.slots <- struct{}{}:
		defer func() { <-a.slots }()
	default:
		a.overloaded.warn(a.cfg.Logger, "requests refused: MaxInFlight requests are running", "max_in_flight", a.cfg.MaxInFlight)
		w.Header().Set("Retry-After", a.retryAfter)
		a.cfg.Overloaded(w, r)
		return
	}
	a.cfg.Handler.ServeHTTP(w, r)
}

// writeUnavailable is Config.Overloaded's default.
func writeUnavailable(w http.ResponseWriter, _ *http.Request) {
	problem.Write(w, problem.Unavailable, "the server is running as many requests as it can; retry after the delay in Retry-After")
}

// readBody replaces r.Body with the body read in full, and reports whether
// it was. A body over the limit is read only up to it; the handler then
// gets those bytes followed by the *http.MaxBytesError, and answers 413 as
// it would have on its own.
func (a *admission) readBody(w http.ResponseWriter, rc *http.ResponseController, r *http.Request) (whole bool, err error) {
	body, err := io.ReadAll(&pacedReader{
		// MaxBytesReader, given w, also marks the response Connection:
		// close once the limit is hit, so net/http does not try to drain
		// the rest of an oversized body (with no deadline) after the reply.
		body:     http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes),
		rc:       rc,
		start:    time.Now(),
		grace:    a.cfg.BodyTimeout,
		rate:     float64(a.cfg.MinBodyRate),
		draining: &a.conns.draining,
	})
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
// after n bytes, the next ones are due grace + n/rate after start. A client
// sending at least rate bytes a second keeps ahead of it by grace; one that
// stalls is cut off grace after its last burst was due. Once shutdown has
// started, the next bytes are also due within drainStall.
type pacedReader struct {
	body     io.Reader
	rc       *http.ResponseController
	start    time.Time
	grace    time.Duration
	rate     float64 // bytes per second
	draining *atomic.Bool
	n        int64
}

func (p *pacedReader) Read(b []byte) (int, error) {
	due := p.start.Add(p.grace + time.Duration(float64(p.n)/p.rate*float64(time.Second)))
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
	return n, err
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
