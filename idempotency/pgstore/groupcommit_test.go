package pgstore_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// member is one deferred first request of a group commit test.
type member struct {
	scope   string // default: the bundle's
	key     string
	n       int // the row's n, default 1; below 1 breaks the CHECK (n > 0)
	wait    time.Duration
	replay  bool // the key already holds a completed record
	blocked bool // the key is held by an open transaction
}

// memberResult is how a member's deferred commit ended.
type memberResult struct {
	err error
	rec *idempotency.Record // the record that held the key, if it was taken
}

// groupBundle is a store whose first MaxMergedCommits pipelines are held
// back until release is closed, so the requests behind them queue and go
// as one merged pipeline.
type groupBundle struct {
	ctx        context.Context
	pool       *pgxpool.Pool
	store      *pgstore.Store
	deferred   idempotency.Store[*pgstore.Batch] // taking writeN
	writeN     string
	scope      string
	sizes      chan int // the size of every pipeline sent once armed
	release    chan struct{}
	armed      atomic.Bool
	statements statements // sent through pool
}

func setupGroup(t *testing.T) *groupBundle {
	t.Helper()
	return setupGroupWith(t, pgstore.Options{})
}

// setupGroupWith is setupGroup with the store's options.
func setupGroupWith(t *testing.T, opts pgstore.Options) *groupBundle {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgstoretest.URL(t))
	require.NoError(t, err, "parse the database URL")
	b := &groupBundle{}
	cfg.ConnConfig.Tracer = &b.statements
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err, "open a pool")
	t.Cleanup(pool.Close)
	b.init(t, pool, opts)
	b.holdBack()
	return b
}

// holdBack makes the bundle's store hold its first MaxMergedCommits
// pipelines back once armed, until release is closed (see run).
func (b *groupBundle) holdBack() {
	var calls atomic.Int32
	pgstore.WatchCommits(b.store, func(members int) {
		if !b.armed.Load() {
			return
		}
		b.sizes <- members
		if calls.Add(1) <= pgstore.MaxMergedCommits {
			<-b.release
		}
	})
}

func newGroupBundle(t *testing.T, pool *pgxpool.Pool, opts pgstore.Options) *groupBundle {
	t.Helper()
	b := &groupBundle{}
	b.init(t, pool, opts)
	return b
}

func (b *groupBundle) init(t *testing.T, pool *pgxpool.Pool, opts pgstore.Options) {
	t.Helper()
	store, err := pgstore.New(pool, opts)
	require.NoError(t, err, "open the store")
	b.ctx, b.pool, b.store, b.scope = t.Context(), pool, store, "group-"+rand.Text()
	b.writeN = "INSERT INTO writes (id, scope, n) SELECT $1, $2, $3 WHERE " + store.Guard()
	b.deferred, err = store.ClaimAtCommit(b.writeN)
	require.NoError(t, err, "bind the deferred write")
	b.sizes, b.release = make(chan int, 1000), make(chan struct{})
	warm(t, b.deferred)
}

// warm makes store's first claim, which reads the key table's version once,
// so that the statements a test counts are its claims' own.
func warm(t *testing.T, store idempotency.Store[*pgstore.Batch]) {
	t.Helper()
	lease, _, err := store.Claim(t.Context(), idempotency.ClaimRequest{Scope: "warm-up", Key: rand.Text(), TTL: time.Hour, Wait: time.Second})
	require.NoError(t, err, "the store's first claim")
	require.NoError(t, lease.Rollback(t.Context()))
}

func (b *groupBundle) request(scope, key string, wait time.Duration) idempotency.ClaimRequest {
	if scope == "" {
		scope = b.scope
	}
	return idempotency.ClaimRequest{
		Scope: scope, Key: key, Fingerprint: sha256.Sum256([]byte("POST /orders")),
		Method: http.MethodPost, Route: "/orders", TTL: time.Hour, Wait: wait,
	}
}

// attempt runs one deferred first request: claim, one order, commit.
func (b *groupBundle) attempt(m member) memberResult {
	return b.attemptWith(m, m.key)
}

// attemptWith is attempt with the response body to store.
func (b *groupBundle) attemptWith(m member, body string) memberResult {
	wait := m.wait
	if wait == 0 {
		wait = 5 * time.Second
	}
	lease, rec, err := b.deferred.Claim(b.ctx, b.request(m.scope, m.key, wait))
	if err != nil || lease == nil {
		return memberResult{err: err, rec: rec}
	}
	defer func() { _ = lease.Rollback(context.WithoutCancel(b.ctx)) }()
	n := m.n
	if n == 0 {
		n = 1
	}
	if _, err := lease.Unit().Exec(b.ctx, b.writeN, rand.Text(), []byte(lease.Ref().Scope), n); err != nil {
		return memberResult{err: err}
	}
	err = lease.Commit(b.ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte(body)})
	var taken *idempotency.TakenError
	if errors.As(err, &taken) {
		return memberResult{err: err, rec: taken.Record}
	}
	return memberResult{err: err}
}

// run holds the first pipelines back with one request each, queues
// members behind them, and releases them all: members go as one pipeline.
func (b *groupBundle) run(t *testing.T, members []member) []memberResult {
	t.Helper()
	b.armed.Store(true)
	var wg sync.WaitGroup
	for i := range pgstore.MaxMergedCommits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := b.attempt(member{key: "holder-" + rand.Text()})
			require.NoError(t, res.err, "request %d holding a pipeline back", i)
		}()
		require.Equal(t, 1, <-b.sizes, "members of held pipeline %d", i)
	}
	results := make([]memberResult, len(members))
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = b.attempt(m)
		}()
	}
	require.Eventually(t, func() bool { return pgstore.QueuedCommits(b.store) == len(members) },
		10*time.Second, time.Millisecond, "members queued behind the held pipelines")
	close(b.release)
	wg.Wait()
	return results
}

// sent is the sizes of the pipelines sent after the held ones, sorted.
func (b *groupBundle) sent() []int {
	var sizes []int
	for {
		select {
		case n := <-b.sizes:
			sizes = append(sizes, n)
		default:
			slices.Sort(sizes)
			return sizes
		}
	}
}

// resent is how many pipelines were sent after the merged one: the members
// that sent theirs again alone.
func (b *groupBundle) resent() int {
	n := 0
	for {
		select {
		case <-b.sizes:
			n++
		default:
			return n
		}
	}
}

// writes counts the rows the bundle's requests wrote.
func (b *groupBundle) writes(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT count(*) FROM writes WHERE scope = $1", []byte(b.scope)).Scan(&n), "count writes")
	return n
}

// TestGroupCommit checks that concurrent deferred commits are merged into
// one pipeline and that each member still gets exactly its own outcome,
// also when another member of the pipeline fails it.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	for _, size := range []struct {
		name string
		good int // ordinary members beside the odd one
		// statements is what the merged pipeline sends: a short one each
		// member's lone statement, a long one the claims' two statements
		// and each member's write.
		statements int64
	}{
		{name: "short", good: pgstore.MaxLoneMembers - 1, statements: pgstore.MaxLoneMembers},
		{name: "long", good: 9, statements: 2 + 10},
	} {
		t.Run(size.name, func(t *testing.T) {
			t.Parallel()
			testGroupCommit(t, size.good, size.statements)
		})
	}
}

func testGroupCommit(t *testing.T, good int, statements int64) {
	// A long pipeline's claims' lock wait on a key held elsewhere ran out,
	// and they cannot say whose key they waited for: every member goes
	// again alone, and the odd one waits for the holder a second time. In a
	// short one, it was the odd member's own statement: only the others go
	// again.
	heldResent := good + 1
	if good+1 <= pgstore.MaxLoneMembers {
		heldResent = good
	}
	tests := []struct {
		name string
		odd  member // one member beside good ordinary first requests
		// check is what the odd member must have got.
		check func(t *testing.T, b *groupBundle, res memberResult)
		// oddWrites is how many rows the odd member leaves.
		oddWrites int
		// resent is how many members send their pipeline again alone: all
		// but the odd one when its own write failed the merged pipeline.
		resent int
	}{
		{
			name:      "first requests",
			odd:       member{},
			check:     func(t *testing.T, _ *groupBundle, res memberResult) { require.NoError(t, res.err, "odd member") },
			oddWrites: 1,
		},
		{
			name: "a replay writes nothing and gets its record",
			odd:  member{replay: true},
			check: func(t *testing.T, _ *groupBundle, res memberResult) {
				var taken *idempotency.TakenError
				require.ErrorAs(t, res.err, &taken, "a replay in a merged pipeline")
				require.NotNil(t, res.rec, "the replay's record")
				require.Equal(t, "stored", string(res.rec.Response.Body), "the replayed body")
			},
			oddWrites: 1, // the one stored before
		},
		{
			name: "a failing member fails alone",
			odd:  member{n: -1},
			check: func(t *testing.T, b *groupBundle, res memberResult) {
				var pgErr *pgconn.PgError
				require.ErrorAs(t, res.err, &pgErr, "a row breaking a CHECK")
				require.Equal(t, "23514", pgErr.Code, "the failing member's error")
			},
			oddWrites: 0,
			resent:    good,
		},
		{
			name: "a key held elsewhere is in flight, the others commit",
			odd:  member{blocked: true, wait: 200 * time.Millisecond},
			check: func(t *testing.T, _ *groupBundle, res memberResult) {
				require.ErrorIs(t, res.err, idempotency.ErrInFlight, "a key held by an open transaction")
			},
			oddWrites: 0,
			resent:    heldResent,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setupGroup(t)
			odd := tt.odd
			odd.key = "odd-" + rand.Text()
			switch {
			case odd.replay:
				require.NoError(t, b.attemptWith(member{key: odd.key}, "stored").err, "store the replayed key's record")
			case odd.blocked:
				req := b.request("", odd.key, time.Second)
				lease, _, err := b.store.Claim(b.ctx, req) // a transaction holding the key row
				require.NoError(t, err, "claim the key transactionally")
				t.Cleanup(func() { _ = lease.Rollback(context.Background()) })
			}
			members := []member{odd}
			for range good {
				members = append(members, member{key: "good-" + rand.Text()})
			}
			before := b.statements.n.Load()
			results := b.run(t, members)
			sent := b.statements.n.Load() - before
			require.Equal(t, len(members), <-b.sizes, "members of the pipeline after the held ones")
			tt.check(t, b, results[0])
			for i, res := range results[1:] {
				require.NoError(t, res.err, "ordinary member %d beside the odd one", i)
			}
			require.Equal(t, pgstore.MaxMergedCommits+good+tt.oddWrites, b.writes(t), "rows written")
			require.Equal(t, tt.resent, b.resent(), "pipelines sent again alone")
			if tt.resent == 0 {
				// The held pipelines' one statement each, then the merged one.
				require.Equal(t, pgstore.MaxMergedCommits+statements, sent, "statements sent")
			}
		})
	}
}

// TestStatementsProbeTheIndex checks the plans PostgreSQL keeps for the
// statements on the key table. pgx prepares them, and after a
// few runs a prepared statement may settle on a generic plan, chosen while
// the table is small and kept as it grows (until an ANALYZE, which nothing
// promises): a multi-key look-up or a batch delete planned as a hash join
// then scans the whole table on every run. Each statement's generic plan,
// made on an empty table, must reach these tables through their indexes,
// unless the statement is never prepared.
func TestStatementsProbeTheIndex(t *testing.T) {
	t.Parallel()
	pool := oneSessionDatabase(t) // every statement is prepared on the connection inspected below
	ctx := t.Context()

	// What a server runs on the key table, on connections that live as long
	// as it does: a deferred first request, a replay, a transactional first
	// request, the cleanup and the statistics that metrics scrapes read
	// (which count the whole table while it is small, so they must not keep
	// a plan). (The operators' commands run once, on a connection of their
	// own: planned for the table as it is.)
	b := newGroupBundle(t, pool, pgstore.Options{})
	store := b.store
	key := "plans-" + rand.Text()
	require.NoError(t, b.attempt(member{key: key}).err, "a deferred first request")
	_, rec, err := store.Claim(ctx, b.request("", key, time.Second))
	require.NoError(t, err, "replay")
	require.NotNil(t, rec, "replay")
	lease, _, err := store.Claim(ctx, b.request("", "plans-"+rand.Text(), time.Second))
	require.NoError(t, err, "transactional claim")
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("{}")}), "transactional commit")
	_, err = store.PurgeExpired(ctx, 100)
	require.NoError(t, err, "purge")
	_, err = store.KeyStats(ctx)
	require.NoError(t, err, "key statistics")

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err, "acquire")
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err, "force generic plans")
	rows, err := conn.Query(ctx, `SELECT name, statement, cardinality(parameter_types)
		FROM pg_prepared_statements WHERE statement ~ 'idempotency_keys'`)
	require.NoError(t, err, "prepared statements")
	type prepared struct {
		Name, Statement string
		Params          int
	}
	statements, err := pgx.CollectRows(rows, pgx.RowToStructByPos[prepared])
	require.NoError(t, err, "prepared statements")

	var lookUps, purges, stats int
	for _, s := range statements {
		if strings.Contains(s.Statement, "reltuples") {
			stats++
		}
		if strings.Contains(s.Statement, "unnest(") || strings.Contains(s.Statement, "pgstore_claim AS") {
			lookUps++
		}
		if strings.Contains(s.Statement, "DELETE") {
			purges++
		}
		explain := "EXPLAIN EXECUTE " + pgx.Identifier{s.Name}.Sanitize()
		if s.Params > 0 {
			explain += "(" + strings.Repeat("NULL, ", s.Params-1) + "NULL)"
		}
		rows, err := conn.Query(ctx, explain)
		require.NoError(t, err, "explain %s", s.Statement)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, "explain %s", s.Statement)
		plan := strings.Join(lines, "\n")
		require.NotContains(t, plan, "Seq Scan on idempotency_keys", "generic plan of\n%s\n%s", s.Statement, plan)
	}
	require.Positive(t, lookUps, "a look-up among the prepared statements: %+v", statements)
	// The purge's batches are planned anew at every run (their join's
	// generic plan scans the table), so PostgreSQL keeps no plan of them.
	require.Zero(t, purges, "the purge among the prepared statements: %+v", statements)
	require.Zero(t, stats, "the key statistics among the prepared statements: %+v", statements)
}

// TestMergeByScope queues the deferred commits of two scopes behind held
// pipelines: merged by scope, each pipeline holds one scope's commits
// (and its peek names the scope once, see IdempotencyKeyPeekScope);
// merged freely, one pipeline holds them all. Every commit lands either
// way.
func TestMergeByScope(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		byScope bool
		sizes   []int
	}{
		{false, []int{6}},
		{true, []int{3, 3}},
	} {
		t.Run(fmt.Sprintf("by scope %v", tt.byScope), func(t *testing.T) {
			t.Parallel()
			b := setupGroupWith(t, pgstore.Options{MergeByScope: tt.byScope})
			other := "group-" + rand.Text()
			var members []member
			for i := range 3 {
				members = append(members, member{key: fmt.Sprintf("a-%d", i)}, member{scope: other, key: fmt.Sprintf("b-%d", i)})
			}
			for i, r := range b.run(t, members) {
				require.NoError(t, r.err, "member %d", i)
			}
			require.Equal(t, tt.sizes, b.sent(), "the pipelines after the held ones")
			var n int
			require.NoError(t, b.pool.QueryRow(b.ctx, "SELECT count(*) FROM writes WHERE scope = $1 OR scope = $2",
				[]byte(b.scope), []byte(other)).Scan(&n))
			require.Equal(t, 6+pgstore.MaxMergedCommits, n, "one write per member and per holder")
		})
	}
}
