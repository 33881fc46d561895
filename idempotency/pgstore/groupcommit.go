package pgstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency/pgstore/internal/keydb"
)

// Group commit of deferred claims.
//
// A deferred claim's pipeline is a handful of cheap statements and one
// durable commit, and the commit is what costs: PostgreSQL waits for the WAL
// flush, and every waiting backend is put to sleep and woken again. So
// deferred commits that arrive while others are on their way are not sent
// one by one: the pipelines queued in the meantime are sent back to back as
// one, which PostgreSQL runs as one implicit transaction with one commit. A
// lone request is sent at once, so merging adds no wait; under load the
// pipelines that queued behind the ones in flight go together
// (docs/benchmarks.md has the measurements).
//
// Each member of a merged pipeline behaves as it would alone: its claim is
// the insert of its own key row (one multi-row statement inserts them all,
// after another has looked at what holds each key), and its writes are
// guarded by that row having been inserted by this transaction (see
// Batch), which holds however many other key rows the transaction
// inserts. A member whose key is taken writes nothing and learns what holds
// the key, as alone.
//
// The price is shared fate, paid only on failure: if any statement of a
// merged pipeline fails (a lock wait that ran out, a constraint), or its
// commit does, the transaction is rolled back, or its outcome unknown, for
// all its members. A member whose own write failed for a reason of its
// own (its values, its lock wait) gets the answer it would have got alone;
// every other member sends its claim and writes again on its own. (The
// claims are two statements for all members, so a failure there, such as a
// lock wait on a key held elsewhere that ran out, is nobody's in
// particular: every member goes again alone.) A short pipeline, of at most
// maxLoneMembers whose writes fit it, is its members' lone statements
// instead (see lone.go), each claiming, writing and peeking for its own
// member: fewer statements than the claims' two and the writes, and a
// failure at one is that member's own. That is always
// safe: a member whose first attempt did commit finds its own key row and
// replays it, and one whose attempt was rolled back claims again.

// errSendAlone tells a member of a merged pipeline that failed to send its
// own pipeline again, on its own.
var errSendAlone = errors.New("postgres: merged commit failed; send alone")

// Group commit limits.
const (
	// maxMergedCommits is how many pipelines may be in flight at once. One
	// is enough to merge everything behind it; a second keeps PostgreSQL
	// and the service busy while the first one's answer is on its way.
	maxMergedCommits = 2
	// maxMembers bounds one merged pipeline, so that its transaction stays
	// short and one member's failure sends few others again.
	maxMembers = 64
	// mergedTimeout bounds a merged pipeline whose members set no deadline
	// (each member's peek bounds every statement in PostgreSQL anyway).
	mergedTimeout = 10 * time.Second
	// maxLoneMembers is the longest pipeline sent as its members' lone
	// statements rather than as the merged claims and their writes.
	maxLoneMembers = 4
)

// groupCommitter merges concurrent deferred commits into shared pipelines.
// It starts no goroutine while idle and needs no closing: a goroutine sends
// pipelines while any are queued and ends when the queue is empty.
type groupCommitter struct {
	pool  *pgxpool.Pool
	store *Store
	// byScope merges only members of the first queued member's scope
	// (Options.MergeByScope).
	byScope bool
	// sent, if set, is told the size of every pipeline sent (tests).
	sent func(members int)

	mu       sync.Mutex
	queue    []*member
	inFlight int // senders running
}

// member is one deferred commit waiting for its pipeline to be sent.
type member struct {
	ctx   context.Context
	lease *deferredLease
	done  chan struct{}
	taken bool  // under groupCommitter.mu: in a pipeline on its way
	err   error // set before done is closed
}

// commit sends l's claim and writes, merged with those of concurrent
// commits, and returns what became of l: nil when its key was claimed and its
// writes made, *idempotency.TakenError or ErrInFlight when the key was not
// free, anything else translated.
func (g *groupCommitter) commit(ctx context.Context, l *deferredLease) error {
	m := &member{ctx: ctx, lease: l, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, m)
	var first []*member
	if g.inFlight < maxMergedCommits {
		g.inFlight++
		first = g.takeLocked()
	}
	g.mu.Unlock()
	if first != nil {
		// Sent on this request's goroutine, which waits for it anyway;
		// what queues meanwhile is sent by a goroutine of its own.
		g.sendMerged(first)
		if next := g.next(); next != nil {
			go g.send(next)
		}
	}

	select {
	case <-m.done:
	case <-ctx.Done():
		g.mu.Lock()
		if !m.taken {
			// Still queued: nothing was sent, nothing will be.
			g.queue = slices.DeleteFunc(g.queue, func(q *member) bool { return q == m })
			g.mu.Unlock()
			return Translate(fmt.Errorf("commit: %w", ctx.Err()))
		}
		g.mu.Unlock()
		// On its way: wait for what became of it, so that the answer is
		// true (a commit that happened is a success) and no statement of
		// this request outlives it. Not for long: a pipeline of this
		// member alone runs under ctx, which pgx cancels in PostgreSQL,
		// and a merged one ends by the latest deadline of its members.
		<-m.done
		if errors.Is(m.err, errSendAlone) {
			return Translate(fmt.Errorf("commit: %w", ctx.Err()))
		}
	}
	if errors.Is(m.err, errSendAlone) {
		alone := &member{ctx: ctx, lease: l}
		g.sendAlone(alone)
		return alone.err
	}
	return m.err
}

// takeLocked takes the next pipeline's members off the queue: in queue
// order, at most maxMembers, no two of one key (in one transaction the
// second would see the first's key row as its own and write too; from a
// later pipeline it waits for that row and finds it taken), and with
// byScope only those of the first one's scope.
// Members are sorted by key, so that pipelines in flight at once, here or on
// other replicas, take key-row locks in one order and cannot deadlock.
func (g *groupCommitter) takeLocked() []*member {
	var (
		taken []*member
		rest  = g.queue[:0]
		seen  = map[memberKey]bool{}
	)
	for _, m := range g.queue {
		k := memberKey{m.lease.scope, m.lease.req.Key}
		if len(taken) == maxMembers || seen[k] || (g.byScope && len(taken) > 0 && k.scope != taken[0].lease.scope) {
			rest = append(rest, m)
			continue
		}
		seen[k] = true
		m.taken = true
		taken = append(taken, m)
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	slices.SortFunc(taken, func(a, b *member) int {
		if c := cmp.Compare(a.lease.scope, b.lease.scope); c != 0 {
			return c
		}
		return cmp.Compare(a.lease.req.Key, b.lease.req.Key)
	})
	return taken
}

type memberKey struct {
	scope string
	key   string
}

// send sends members as one pipeline, then the next queued ones, until the
// queue is empty.
func (g *groupCommitter) send(members []*member) {
	for members != nil {
		g.sendMerged(members)
		members = g.next()
	}
}

// next takes the members of the next pipeline off the queue for a sender
// that has sent its own, or, when none are queued, ends its turn (nil).
func (g *groupCommitter) next() []*member {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.inFlight--
		return nil
	}
	return g.takeLocked()
}

// sendMerged sends members' claims and writes as one pipeline, sets what
// became of each member and tells it.
func (g *groupCommitter) sendMerged(members []*member) {
	defer func() {
		for _, m := range members {
			close(m.done)
		}
	}()
	if len(members) == 1 {
		g.sendAlone(members[0])
		return
	}
	if len(members) <= maxLoneMembers && g.sendLones(members) {
		return
	}
	ctx, cancel := mergedContext(members)
	defer cancel()
	g.sendPipeline(ctx, members)
}

// sendAlone sends a member alone, as if never queued: under its own
// request's context, as one statement if its writes allow (sendLone), else
// as a pipeline.
func (g *groupCommitter) sendAlone(m *member) {
	if !g.sendLone(m.ctx, m) {
		g.sendPipeline(m.ctx, []*member{m})
	}
}

// sendPipeline sends members' claims and writes as one pipeline under ctx
// and sets each member's err: what became of it, or errSendAlone when a
// merged pipeline failed for a reason not its own. A pipeline of one member
// gets its answer whatever happened.
func (g *groupCommitter) sendPipeline(ctx context.Context, members []*member) {
	if g.sent != nil {
		g.sent(len(members))
	}
	br := g.pool.SendBatch(ctx, g.pipelineOf(ctx, members))
	results, failed, failure := readPipeline(br, members)
	closeErr := br.Close()
	switch {
	case len(members) == 1:
		m := members[0]
		switch {
		case failure != nil:
			m.err = readError(ctx, g.store.table, failure)
		case closeErr != nil:
			m.err = Translate(fmt.Errorf("commit: %w", closeErr))
		default:
			m.err = m.lease.answer(results[0])
		}
	case failed >= 0 && ownFailure(ctx, failure):
		// The first statement that failed was this member's own write,
		// failing for a reason of its own: it gets the answer it would
		// have got alone; the others were rolled back with it and go
		// again on their own.
		for i, m := range members {
			m.err = errSendAlone
			if i == failed {
				m.err = readError(m.ctx, g.store.table, failure)
			}
		}
	case failure != nil || closeErr != nil:
		for _, m := range members {
			m.err = errSendAlone
		}
	default:
		for i, m := range members {
			m.err = m.lease.answer(results[i])
		}
	}
}

// pipelineOf queues members' claims, two statements for all of them, then
// each member's writes.
func (g *groupCommitter) pipelineOf(ctx context.Context, members []*member) *pgx.Batch {
	n := len(members)
	peek := keydb.IdempotencyKeyPeekManyParams{Scopes: make([][]byte, n), IdempotencyKeys: make([]string, n)}
	claim := keydb.IdempotencyKeyInsertCompletedManyParams{
		Scopes: peek.Scopes, IdempotencyKeys: peek.IdempotencyKeys,
		Fingerprints: make([][]byte, n), RequestMethods: make([]string, n), RequestRoutes: make([]string, n),
		ResponseStatuses: make([]int32, n), ResponseHeaders: make([]json.RawMessage, n), ResponseBodies: make([][]byte, n),
		CreatedAts: make([]time.Time, n), TtlSeconds: make([]float64, n),
	}
	// The pipeline's lock waits are bounded by the shortest member's wait,
	// so that no member waits beyond its own; should the claims' lock wait
	// run out, every member sends its pipeline again alone, with its own.
	wait := members[0].lease.req.Wait
	for i, m := range members {
		l, req := m.lease, m.lease.req
		wait = min(wait, req.Wait)
		peek.Scopes[i], peek.IdempotencyKeys[i] = []byte(l.scope), req.Key
		claim.Fingerprints[i] = req.Fingerprint[:]
		claim.RequestMethods[i], claim.RequestRoutes[i] = req.Method, req.Route
		claim.ResponseStatuses[i], claim.ResponseHeaders[i], claim.ResponseBodies[i] = l.status, l.headers, l.body
		claim.CreatedAts[i], claim.TtlSeconds[i] = l.ref.ClaimedAt, req.TTL.Seconds()
	}
	ms := waitMillis(wait)
	peek.LockTimeout = strconv.FormatInt(ms, 10)
	peek.StatementTimeout = strconv.FormatInt(ms+statementSlack.Milliseconds(), 10)
	p := &queue{}
	q := g.store.queries(p)
	// Queued, not run: what these return is not their result. Keys of one
	// scope are peeked with the scope as a parameter of its own, so that a
	// key table partitioned by scope is read in one partition; both give
	// the same rows.
	if oneScope(members) {
		_, _ = q.IdempotencyKeyPeekScope(ctx, keydb.IdempotencyKeyPeekScopeParams{
			LockTimeout: peek.LockTimeout, StatementTimeout: peek.StatementTimeout,
			Scope: peek.Scopes[0], IdempotencyKeys: peek.IdempotencyKeys,
		})
	} else {
		_, _ = q.IdempotencyKeyPeekMany(ctx, peek)
	}
	_, _ = q.IdempotencyKeyInsertCompletedMany(ctx, claim)
	for _, m := range members {
		for _, w := range m.lease.writes.queued.QueuedQueries {
			// A copy: pgx binds a queued query to the prepared statement
			// of the connection it is sent on, and a member may have to
			// send its writes again, on another connection.
			w := *w
			p.batch.QueuedQueries = append(p.batch.QueuedQueries, &w)
		}
	}
	return &p.batch
}

// oneScope reports whether members' keys are all of one scope.
func oneScope(members []*member) bool {
	for _, m := range members[1:] {
		if m.lease.scope != members[0].lease.scope {
			return false
		}
	}
	return true
}

// queue is a DBTX that queues the store's own statements into a pipeline
// instead of running them; their results are read off the batch.
type queue struct{ batch pgx.Batch }

// errQueued is what a statement queued into a pipeline returns to its
// sqlc method; its rows arrive from the batch.
var errQueued = errors.New("pgstore: queued in a pipeline")

func (p *queue) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	p.batch.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

func (p *queue) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	p.batch.Queue(sql, args...)
	return nil, errQueued
}

func (p *queue) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	p.batch.Queue(sql, args...)
	return errRow{errQueued}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// readPipeline reads a pipeline's results: each member's, or, on the first
// failure, which member's write failed (-1: the claims themselves) and why.
func readPipeline(br pgx.BatchResults, members []*member) (results []claimResult, failed int, failure error) {
	rows, err := br.Query()
	var peeked []keydb.IdempotencyKeyPeekManyRow
	if err == nil {
		peeked, err = pgx.CollectRows(rows, pgx.RowToStructByPos[keydb.IdempotencyKeyPeekManyRow])
	}
	if err == nil && len(peeked) != len(members) {
		err = fmt.Errorf("%d rows for %d keys", len(peeked), len(members))
	}
	if err != nil {
		return nil, -1, &claimStepError{"peek", err}
	}
	rows, err = br.Query()
	var claimed []keydb.IdempotencyKeyInsertCompletedManyRow
	if err == nil {
		claimed, err = pgx.CollectRows(rows, pgx.RowToStructByPos[keydb.IdempotencyKeyInsertCompletedManyRow])
	}
	if err != nil {
		return nil, -1, &claimStepError{"claim", err}
	}
	held := make(map[memberKey]keydb.IdempotencyKeyPeekManyRow, len(peeked))
	for _, row := range peeked {
		held[memberKey{string(row.Scope), row.IdempotencyKey}] = row
	}
	inserted := make(map[memberKey]bool, len(claimed))
	for _, c := range claimed {
		inserted[memberKey{string(c.Scope), c.IdempotencyKey}] = true
	}
	results = make([]claimResult, len(members))
	for i, m := range members {
		k := memberKey{m.lease.scope, m.lease.req.Key}
		results[i] = claimResult{peeked: held[k], inserted: inserted[k]}
		if err := m.lease.readWrites(br); err != nil {
			return nil, i, err
		}
	}
	return results, -1, nil
}

// ownFailure reports whether err, the first failure in a merged pipeline,
// at one member's write, belongs to that member rather than to the
// pipeline: a data or integrity error of its own values, or its lock wait or
// statement running out of time (not the pipeline's context).
func ownFailure(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch {
	case pgErr.Code[:2] == "22", pgErr.Code[:2] == "23", pgErr.Code == "55P03":
		return true
	case pgErr.Code == "57014":
		return ctx.Err() == nil
	}
	return false
}

// mergedContext is the context a pipeline is sent under: no member's
// cancellation ends it (the others still want it), but it ends by the
// latest of their deadlines.
func mergedContext(members []*member) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, m := range members {
		d, ok := m.ctx.Deadline()
		if !ok {
			d = time.Now().Add(mergedTimeout)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(members[0].ctx), latest)
}
