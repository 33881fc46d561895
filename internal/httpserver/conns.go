package httpserver

import (
	"context"
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
type conns struct {
	mu       sync.Mutex
	open     map[net.Conn]*connInfo
	draining bool
}

func newConns() *conns {
	return &conns{open: map[net.Conn]*connInfo{}}
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
