package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sony/gobreaker/v2"

	"github.com/oncekey/oncekey/gen/db"
	"github.com/oncekey/oncekey/internal/service/store"
)

// Replica serves the HTTP layer's reads (store.Reads: an order, a page of
// orders, a payment and its refunds, the bonus balance) from a streaming
// replica of the primary, and nothing else: it implements no write and no
// settlement, so a worker, which is given the Store, cannot read through
// it. A read on the replica comes back to the primary when
//   - its context is store.Strong (Consistency: strong);
//   - the replica has no such row: it may lag, and a client that has just
//     created a payment must not be told that it does not exist (a page or
//     a balance is an answer, and may be stale);
//   - the replica fails or does not answer within ReplicaConfig.Timeout;
//   - the replica's breaker is open: after TripAfter such failures in a
//     row, reads leave it alone until a probe in the background finds it
//     answering again, so that a hung replica costs a few reads their
//     timeout, not every read.
type Replica struct {
	reads
	primary *Store
	pool    *pgxpool.Pool
	cfg     ReplicaConfig
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]

	mu      sync.Mutex
	probing bool
	closed  bool
}

// ReplicaConfig configures a Replica; zero fields take the defaults.
type ReplicaConfig struct {
	// Timeout bounds a read on the replica before it is made on the
	// primary instead (default 500ms).
	Timeout time.Duration
	// TripAfter is how many failed or timed-out reads in a row open the
	// breaker (default 3).
	TripAfter int
	// Cooldown is how long the breaker stays open before each probe
	// (default 5s).
	Cooldown time.Duration
	// Observer is told where each read went and when the breaker opens
	// and closes (default: nobody).
	Observer ReplicaObserver
}

// Where a read went, as ReplicaObserver.ReplicaRead is told.
const (
	ReadReplica = "replica" // the replica answered
	ReadStrong  = "strong"  // Consistency: strong sent it to the primary
	ReadMissing = "missing" // the replica had no such row; the primary answered
	ReadFailed  = "failed"  // the replica failed or timed out; the primary answered
	ReadSkipped = "skipped" // the breaker was open; the primary answered
)

// ReplicaObserver is told what the replica does (internal/service/metrics
// implements it).
type ReplicaObserver interface {
	ReplicaRead(where string)
	ReplicaBreaker(open bool)
}

type noReplicaObserver struct{}

func (noReplicaObserver) ReplicaRead(string)  {}
func (noReplicaObserver) ReplicaBreaker(bool) {}

// Defaults of ReplicaConfig.
const (
	DefaultReplicaTimeout   = 500 * time.Millisecond
	DefaultReplicaTripAfter = 3
	DefaultReplicaCooldown  = 5 * time.Second
)

// NewReplica returns the reads of primary served from replica, a pool on
// a streaming replica of primary's database (OpenReplica). Close stops its
// probe; the pools are the caller's.
func NewReplica(primary *Store, replica *pgxpool.Pool, cfg ReplicaConfig) *Replica {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultReplicaTimeout
	}
	if cfg.TripAfter <= 0 {
		cfg.TripAfter = DefaultReplicaTripAfter
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = DefaultReplicaCooldown
	}
	if cfg.Observer == nil {
		cfg.Observer = noReplicaObserver{}
	}
	r := &Replica{primary: primary, pool: replica, cfg: cfg}
	r.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "replica",
		MaxRequests: 1, // the probe, when half-open
		Timeout:     cfg.Cooldown,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(cfg.TripAfter) },
		IsSuccessful: func(err error) bool {
			return err == nil || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, errCallerGone)
		},
		OnStateChange: func(_ string, from, to gobreaker.State) {
			switch {
			case to == gobreaker.StateOpen && from == gobreaker.StateClosed:
				cfg.Observer.ReplicaBreaker(true)
				r.probe()
			case to == gobreaker.StateClosed:
				cfg.Observer.ReplicaBreaker(false)
			}
		},
	})
	r.reads = reads{route: r.route}
	return r
}

// errCallerGone marks a replica read cut short because its caller's
// context ended: not the replica's failure.
var errCallerGone = errors.New("the caller went away")

// route runs fn on the replica, or on the primary when the replica will
// not do (see Replica).
func (r *Replica) route(ctx context.Context, fn func(context.Context, *db.Queries) error) error {
	primary := func(where string) error {
		r.cfg.Observer.ReplicaRead(where)
		return fn(ctx, db.New(r.primary.pool))
	}
	if store.IsStrong(ctx) {
		return primary(ReadStrong)
	}
	if r.cb.State() != gobreaker.StateClosed {
		return primary(ReadSkipped)
	}
	done, err := r.cb.Allow()
	if err != nil {
		return primary(ReadSkipped)
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	err = fn(rctx, db.New(r.pool))
	cancel()
	if err != nil && ctx.Err() != nil {
		done(errCallerGone)
		return err
	}
	done(err)
	switch {
	case err == nil:
		r.cfg.Observer.ReplicaRead(ReadReplica)
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return primary(ReadMissing)
	default:
		return primary(ReadFailed)
	}
}

// probe pings the replica every cooldown, in the background, until the
// breaker closes again. Reads never probe: only the probe waits on a
// replica that may not answer.
func (r *Replica) probe() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.probing || r.closed {
		return
	}
	r.probing = true
	go func() {
		defer func() {
			r.mu.Lock()
			r.probing = false
			r.mu.Unlock()
		}()
		for {
			time.Sleep(r.cfg.Cooldown)
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed || r.cb.State() == gobreaker.StateClosed {
				return
			}
			done, err := r.cb.Allow()
			if err != nil {
				continue // still open
			}
			ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Timeout)
			done(r.pool.Ping(ctx))
			cancel()
		}
	}()
}

// Close stops the probe. Reads still work afterwards.
func (r *Replica) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}

// Skipped reports whether reads leave the replica alone now (its breaker
// is open).
func (r *Replica) Skipped() bool { return r.cb.State() != gobreaker.StateClosed }

// Lag is how far the replica's replay is behind what it has received from
// the primary, in time: zero when it has replayed everything it received
// (or is not a replica at all), else the age of the last transaction it
// replayed. A replica paused, or applying with recovery_min_apply_delay,
// lags by this much; one cut off from the primary is caught by the
// primary's own monitoring, not here.
func (r *Replica) Lag(ctx context.Context) (time.Duration, error) {
	lag, err := db.New(r.pool).HealthReplicaLagSeconds(ctx)
	if err != nil {
		return 0, translate(fmt.Errorf("read the replica's lag: %w", err))
	}
	return seconds(lag), nil
}
