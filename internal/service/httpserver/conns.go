package httpserver

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// phase is how far a connection's current request has come.
type phase uint8

const (
	// phaseWaiting: accepted, idle between requests, or reading headers.
	// net/http reports a connection active only once it has read a
	// request's headers, so headers still coming count as waiting.
	phaseWaiting phase = iota
	// phaseReading: the headers are read; the body is being read. At
	// shutdown such a request may finish if its body keeps coming
	// (drainStall).
	phaseReading
	// phaseRunning: the handler runs past its body read, or its response is
	// being written. Shutdown waits for it.
	phaseRunning
)

// drainStall is how long, once shutdown has started, a body being read may
// go without bringing a byte before its connection is closed. A client
// uploading when SIGTERM comes is let finish; one that has stopped sending
// does not hold the shutdown for its BodyTimeout.
const drainStall = 250 * time.Millisecond

type connInfo struct {
	phase phase
	idle  bool      // waiting after a request, as a keep-alive connection
	since time.Time // when it entered its phase
}

// conns tracks every open connection's phase, from http.Server.ConnState
// and from admission marking a request running. One mutex covers the
// phases and the drain, so a connection is either closed by the drain or
// kept, and then its request may run.
//
// It also caps the number of open connections. golang.org/x/net/netutil's
// LimitListener would do that by not calling Accept at the cap, which
// leaves new clients in the kernel's accept queue until they time out: the
// very failure this package was written for. Here a new connection at the
// cap is accepted and makes room by closing another with no request
// running (see evict); only when every connection has one running is the
// new one closed at once, and its client sees a reset rather than a hang.
type conns struct {
	max    int
	logger *slog.Logger

	mu      sync.Mutex
	open    map[net.Conn]*connInfo
	refused throttle
	// draining is set once, under mu, when shutdown starts; pacedReader
	// reads it without the lock.
	draining atomic.Bool
}

func newConns(maxConns int, logger *slog.Logger) *conns {
	return &conns{max: maxConns, logger: logger, open: map[net.Conn]*connInfo{}}
}

// observe is the http.Server.ConnState hook. Every call for one connection
// comes from that connection's own goroutine, in order, except StateNew,
// which comes from the accept loop before that goroutine starts.
func (cs *conns) observe(c net.Conn, state http.ConnState) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	switch state {
	case http.StateNew:
		if cs.draining.Load() {
			// Accepted between the drain and the listener's close.
			_ = c.Close()
			return
		}
		if len(cs.open) >= cs.max && !cs.evict() {
			_ = c.Close()
			cs.refused.warn(cs.logger, "connections refused: MaxConns connections are open, each with a request running", "max_conns", cs.max)
			return
		}
		cs.open[c] = &connInfo{phase: phaseWaiting, since: time.Now()}
	case http.StateActive:
		// A connection already closed (drained, evicted) is not brought back.
		if info, ok := cs.open[c]; ok {
			*info = connInfo{phase: phaseReading, since: time.Now()}
		}
	case http.StateIdle:
		// The response is out: a write deadline left from it must not
		// fall on what net/http writes by itself on this connection later
		// (a 400 for a malformed next request).
		_ = c.SetWriteDeadline(time.Time{})
		if info, ok := cs.open[c]; ok {
			*info = connInfo{phase: phaseWaiting, idle: true, since: time.Now()}
		}
	case http.StateHijacked, http.StateClosed:
		delete(cs.open, c)
	}
}

// evict closes the connection whose loss costs least, if one has no request
// running: the one idle longest, since an idle client loses only a
// reconnect; or else the one that has spent longest sending its request
// (or sending nothing), which a flood of stalled clients is made of, while
// a well-behaved newcomer's request is read in a moment and so is the last
// to go. Nothing of an evicted request has reached the handler, so a retry
// is safe; a client that sends its next request on an idle connection just
// as it is closed sees what IdleTimeout would show it, and net/http's
// client retries such a request by itself when it is idempotent or carries
// an Idempotency-Key.
func (cs *conns) evict() bool {
	var victim net.Conn
	var worst *connInfo
	for c, info := range cs.open {
		if info.phase == phaseRunning {
			continue
		}
		if worst == nil || info.idle && !worst.idle || info.idle == worst.idle && info.since.Before(worst.since) {
			victim, worst = c, info
		}
	}
	if victim == nil {
		return false
	}
	_ = victim.Close()
	delete(cs.open, victim)
	return true
}

// run marks c's request running and reports whether it may run: not on a
// connection already closed (by the drain, or to make room).
func (cs *conns) run(c net.Conn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	info, ok := cs.open[c]
	if !ok {
		return false
	}
	info.phase = phaseRunning
	return true
}

// drain starts the shutdown. Every connection with no request under way
// (idle, sending headers, or new) is closed; one whose body is being read
// gets drainStall to bring its next bytes (pacedReader keeps that up to
// the end of the body); one running is left to finish. It returns how many
// of each there were.
func (cs *conns) drain() (closed, reading, running int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.draining.Store(true)
	for c, info := range cs.open {
		switch info.phase {
		case phaseRunning:
			running++
		case phaseReading:
			_ = c.SetReadDeadline(time.Now().Add(drainStall))
			reading++
		default:
			_ = c.Close()
			delete(cs.open, c)
			closed++
		}
	}
	return closed, reading, running
}

type connKey struct{}

// withConn is the http.Server.ConnContext hook: it lets admission find the
// connection its request came on.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

func connOf(r *http.Request) net.Conn {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	return c
}

// throttle lets a warning through at most once a minute, so that a flood
// is reported without flooding the log.
type throttle struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (t *throttle) warn(logger *slog.Logger, msg string, args ...any) {
	t.mu.Lock()
	if now := time.Now(); now.Sub(t.last) >= time.Minute {
		args = append(args, "suppressed_since_last", t.suppressed)
		t.last, t.suppressed = now, 0
		t.mu.Unlock()
		logger.Warn(msg, args...)
		return
	}
	t.suppressed++
	t.mu.Unlock()
}
