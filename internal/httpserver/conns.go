package httpserver

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// phase is how far a connection's current request has come.
type phase uint8

const (
	// waiting: accepted, idle between requests, or reading headers. net/http
	// reports a connection active only once it has read a request's
	// headers, so headers still coming count as waiting.
	waiting phase = iota
	// reading: the headers are read; the body is being read.
	reading
	// running: the handler runs past its body read, or its response is
	// being written. Only this phase is waited for at shutdown.
	running
)

type connInfo struct {
	phase     phase
	idleSince time.Time // zero unless idle after a request
}

// conns tracks every open connection's phase, from http.Server.ConnState
// and from admission marking a request running. One mutex covers the
// phases and the draining flag, so a request is marked running either
// before shutdown starts (and is waited for) or not at all.
//
// It also caps the number of open connections. golang.org/x/net/netutil's
// LimitListener would do that by not calling Accept at the cap, which
// leaves new clients in the kernel's accept queue until they time out: the
// very failure this package was written for. Here a connection over the cap
// is accepted and closed at once (its client sees a reset and can go
// elsewhere), after first trying to make room by closing the connection
// idle longest: an idle keep-alive connection costs its client only a
// reconnect, and otherwise idle connections could lock out every new
// client until IdleTimeout.
type conns struct {
	max    int
	logger *slog.Logger

	mu       sync.Mutex
	open     map[net.Conn]*connInfo
	draining bool
	refused  throttle
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
		if cs.draining {
			// Accepted between the drain and the listener's close.
			_ = c.Close()
			return
		}
		if len(cs.open) >= cs.max && !cs.evictIdle() {
			_ = c.Close()
			cs.refused.warn(cs.logger, "connections refused: MaxConns connections are open and none is idle", "max_conns", cs.max)
			return
		}
		cs.open[c] = &connInfo{phase: waiting}
	case http.StateActive:
		// A connection already closed (drained) is not brought back.
		if info, ok := cs.open[c]; ok {
			info.phase, info.idleSince = reading, time.Time{}
		}
	case http.StateIdle:
		if info, ok := cs.open[c]; ok {
			info.phase, info.idleSince = waiting, time.Now()
		}
	case http.StateHijacked, http.StateClosed:
		delete(cs.open, c)
	}
}

// evictIdle closes the connection idle longest, if any is idle. A client
// that sends its next request on it just then sees the connection closed
// before any answer, as with IdleTimeout; net/http's client retries such a
// request by itself when it is idempotent or carries an Idempotency-Key.
func (cs *conns) evictIdle() bool {
	var victim net.Conn
	var since time.Time
	for c, info := range cs.open {
		if !info.idleSince.IsZero() && (victim == nil || info.idleSince.Before(since)) {
			victim, since = c, info.idleSince
		}
	}
	if victim == nil {
		return false
	}
	_ = victim.Close()
	delete(cs.open, victim)
	return true
}

// run marks c's request running and reports whether it may run: not once
// shutdown has started, and not on a connection already closed.
func (cs *conns) run(c net.Conn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	info, ok := cs.open[c]
	if !ok || cs.draining {
		return false
	}
	info.phase = running
	return true
}

// drain starts the shutdown: from now on no request starts running, and
// every connection whose request is not running is closed. It returns how
// many were closed and how many are left running.
func (cs *conns) drain() (closed, left int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.draining = true
	for c, info := range cs.open {
		if info.phase == running {
			left++
			continue
		}
		_ = c.Close()
		delete(cs.open, c)
		closed++
	}
	return closed, left
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
