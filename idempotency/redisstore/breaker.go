package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// A Redis that is down, paused or unreachable must cost requests nothing
// beyond the first few: each command to it would wait out a timeout, and a
// request makes several. After TripAfter consecutive failures the breaker
// opens, and requests leave Redis alone (going to the durable store
// directly) until a probe in the background finds it answering again.
// Requests never probe: only the prober's PING waits on a Redis that may
// not answer.
//
// The state machine is gobreaker's two-step breaker: requests only use
// Redis while it is closed; once it has been open for Cooldown it is
// half-open, and the prober's PING (the one request allowed then) closes
// it or opens it again.

// errBreakerOpen is what a command gets while the breaker is open: it is
// not sent.
var errBreakerOpen = errors.New("redisstore: Redis is left alone after failing")

// breaker guards the commands of one FastPath.
type breaker struct {
	cb       *gobreaker.TwoStepCircuitBreaker[struct{}]
	rdb      redis.UniversalClient
	cooldown time.Duration
	observer Observer
	log      *stateLog

	mu      sync.Mutex
	probing bool
	lastErr error // the last command's failure, for the log
}

func newBreaker(rdb redis.UniversalClient, cfg Config) *breaker {
	b := &breaker{rdb: rdb, cooldown: cfg.Cooldown, observer: cfg.Observer, log: &stateLog{log: cfg.Logger, every: stateLogEvery}}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "redis",
		MaxRequests: 1, // the prober's PING, when half-open
		Timeout:     cfg.Cooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(cfg.TripAfter) },
		// redis.Nil is an answer.
		IsSuccessful: func(err error) bool { return err == nil || errors.Is(err, redis.Nil) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			switch {
			case to == gobreaker.StateOpen && from == gobreaker.StateClosed:
				b.observer.Breaker(true)
				b.log.changed(true, b.failure())
				b.probe()
			case to == gobreaker.StateClosed:
				b.observer.Breaker(false)
				b.log.changed(false, nil)
			}
		},
	})
	return b
}

// do runs one command, fn, if the breaker is closed, and tells the breaker
// how it went; while it is open, fn is not run and errBreakerOpen comes
// back.
func (b *breaker) do(ctx context.Context, fn func() error) error {
	if b.cb.State() != gobreaker.StateClosed {
		return errBreakerOpen
	}
	done, err := b.cb.Allow()
	if err != nil {
		return errBreakerOpen
	}
	err = fn()
	switch {
	case ctx.Err() != nil:
		done(nil) // the request went away: no failure of Redis's
	case err != nil && !errors.Is(err, redis.Nil):
		b.failed(err)
		done(err)
	default:
		done(err)
	}
	return err
}

// failed keeps err, the failure that may trip the breaker, for its log.
func (b *breaker) failed(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastErr = err
}

func (b *breaker) failure() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastErr
}

// closed reports whether requests may use Redis now.
func (b *breaker) closed() bool { return b.cb.State() == gobreaker.StateClosed }

// probe pings Redis every cooldown, in the background, until the breaker
// is closed again.
func (b *breaker) probe() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.probing {
		return
	}
	b.probing = true
	go func() {
		defer func() {
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
		}()
		for {
			time.Sleep(b.cooldown)
			if b.cb.State() == gobreaker.StateClosed {
				return
			}
			done, err := b.cb.Allow()
			if err != nil {
				continue // still open, or another probe under way
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err = b.rdb.Ping(ctx).Err()
			cancel()
			done(err)
			if errors.Is(err, redis.ErrClosed) {
				return // the client was closed: nothing left to probe
			}
		}
	}()
}
