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
	phase phase
	idle  bool      // waiting after a request, as a keep-alive connection
	since time.Time // when it entered its phase
}

// conns tracks every open connection's phase, from http.Server.ConnState
// and from admission marking a request running. One mutex covers the
// phases and the draining flag, so a request is marked running either
// before shutdown starts (and is waited for) or not at all.
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
		if len(cs.open) >= cs.max && !cs.evict() {
			_ = c.Close()
			cs.refused.warn(cs.logger, "connections refused: MaxConns connections are open, each with a request running", "max_conns", cs.max)
			return
		}
		cs.open[c] = &connInfo{phase: waiting, since: time.Now()}
	case http.StateActive:
		// A connection already closed (drained, evicted) is not brought back.
		if info, ok := cs.open[c]; ok {
			*info = connInfo{phase: reading, since: time.Now()}
		}
	case http.StateIdle:
		if info, ok := cs.open[c]; ok {
			*info = connInfo{phase: waiting, idle: true, since: time.Now()}
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
		if info.phase == running {
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
