package testdb

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Lag is how a test's streaming replica lags behind its primary.
type Lag string

const (
	// Delayed: each transaction is applied on the replica ReplicaDelay
	// after it commits on the primary (recovery_min_apply_delay), as a
	// replica under load lags.
	Delayed Lag = "delayed"
	// Paused: the replica's WAL replay is paused once the test's database
	// is migrated, so it never shows anything the test writes.
	Paused Lag = "paused"
)

// Lags are the ways a replica lags, for suites that run under each.
var Lags = []Lag{Delayed, Paused}

// ReplicaDelay is how late a Delayed replica applies each transaction.
const ReplicaDelay = 500 * time.Millisecond

// Replicated is a migrated database of a test's own on a primary with a
// streaming replica that lags.
type Replicated struct {
	URL        string        // the database on the primary
	ReplicaURL string        // the same database on the replica
	Pool       *pgxpool.Pool // on the primary; closed when the test ends
	Primary    *Cluster
	Replica    *Cluster
}

// FreshReplicated creates a migrated database of the test's own on a
// primary with a replica that lags as lag says; it returns once the
// replica holds the migrated database. Delayed databases share one
// primary and replica per test binary (started on first use, stopped by
// Main); a Paused one gets a primary and replica of its own, since pausing
// is the whole server's.
func FreshReplicated(t testing.TB, lag Lag) Replicated {
	t.Helper()
	setup(t) // skips or fails like every other database test
	var primary, replica *Cluster
	switch lag {
	case Delayed:
		primary, replica = sharedDelayed(t)
	case Paused:
		primary = NewCluster(t)
		replica = primary.Replica(t, 0)
	default:
		t.Fatalf("testdb: no such lag %q", lag)
	}
	dbURL, pool := freshOn(t, primary.URL(), true)
	replica.CatchUp(t, primary)
	if lag == Paused {
		replica.Exec(t, "SELECT pg_wal_replay_pause()")
		if err := replica.await("SELECT pg_get_wal_replay_pause_state()", "paused"); err != nil {
			t.Fatalf("testdb: %v", err)
		}
	}
	return Replicated{
		URL:        dbURL,
		ReplicaURL: strings.Replace(dbURL, "127.0.0.1:"+primary.Port(), "127.0.0.1:"+replica.Port(), 1),
		Pool:       pool,
		Primary:    primary,
		Replica:    replica,
	}
}

// The Delayed pair this test binary shares.
var (
	delayedOnce               sync.Once
	delayedPrimary, delayedRe *Cluster
	delayedErr                error
	shared                    []*Cluster // stopped by Main, replicas first
	sharedMu                  sync.Mutex
)

func sharedDelayed(t testing.TB) (primary, replica *Cluster) {
	t.Helper()
	delayedOnce.Do(func() {
		delayedPrimary, delayedErr = newCluster(freePort(t))
		if delayedErr != nil {
			return
		}
		keep(delayedPrimary)
		delayedRe, delayedErr = delayedPrimary.replica(freePort(t), "", ReplicaDelay)
		if delayedErr == nil {
			keep(delayedRe)
		}
	})
	switch {
	case errors.Is(delayedErr, errNoServer) && os.Getenv("CI") == "":
		t.Skip("testdb: no initdb under /usr/lib/postgresql")
	case delayedErr != nil:
		t.Fatalf("testdb: the shared delayed replica: %v", delayedErr)
	}
	return delayedPrimary, delayedRe
}

func keep(c *Cluster) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	shared = append(shared, c)
}

// stopShared stops the clusters the binary's tests shared, last started
// first.
func stopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for i := len(shared) - 1; i >= 0; i-- {
		shared[i].halt()
	}
	shared = nil
}
