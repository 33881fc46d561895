package redisstore

import (
	"log/slog"
	"sync"
	"time"
)

// stateLogEvery is the least time between two lines of one kind (failing,
// recovered) while Redis flaps.
const stateLogEvery = time.Minute

// stateLog writes a WARN line when Redis starts failing (the breaker
// opens: requests leave it alone) and when it recovers (the breaker
// closes), so that an operator reading the log sees what only the metrics
// showed. It writes a line a change, never a line a request; and for a
// Redis that flaps (answers a probe, then fails again), at most one line of
// each kind per every: a change within every of the last line of its kind
// is held, and when that interval ends, the state Redis is in then is
// written with how many changes the line stands for.
type stateLog struct {
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	failing bool         // the state as last changed
	err     error        // what failed last
	last    [2]time.Time // when a line last said recovered ([0]) and failing ([1])
	changes int          // changes since the last line
	held    *time.Timer  // the line due when an interval ends; nil: none
}

func (l *stateLog) changed(failing bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failing, l.changes = failing, l.changes+1
	if failing {
		l.err = err
	}
	if l.held != nil {
		return
	}
	last := l.last[kind(failing)]
	if wait := l.every - time.Since(last); !last.IsZero() && wait > 0 {
		l.held = time.AfterFunc(wait, l.flush)
		return
	}
	l.write()
}

// flush writes the state held since the last line.
func (l *stateLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = nil
	if l.changes > 0 {
		l.write()
	}
}

func (l *stateLog) write() {
	var attrs []any
	if l.changes > 1 {
		attrs = append(attrs, "changes", l.changes)
	}
	if l.failing {
		l.log.Warn("redisstore: Redis tier failing; requests go to the durable store alone until it answers again", append(attrs, "err", l.err)...)
	} else {
		l.log.Warn("redisstore: Redis tier recovered; requests use it again", attrs...)
	}
	l.last[kind(l.failing)] = time.Now()
	l.changes = 0
}

func kind(failing bool) int {
	if failing {
		return 1
	}
	return 0
}
