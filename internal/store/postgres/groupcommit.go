package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Group commit of deferred claims.
//
// A deferred claim's pipeline is a handful of cheap statements and one
// durable commit, and the commit is what costs: PostgreSQL waits for the WAL
// flush, and every waiting backend is put to sleep and woken again. Measured
// here with pgbench at 32 clients, the same work ran 1.5 to 1.8 times faster
// with synchronous_commit off than on. So deferred commits that arrive while
// others are on their way are not sent one by one: the pipelines queued in
// the meantime are sent back to back as one, which PostgreSQL runs as one
// implicit transaction with one commit. A lone request is sent at once, so
// merging adds no wait; under load the pipelines that queued behind the ones
// in flight go together.
//
// Each member of a merged pipeline behaves as it would alone: its claim is
// the insert of its own key row, and its writes are guarded by that row
// having been inserted by this transaction (claimGuard), which holds however
// many other key rows the transaction inserts. A member whose key is taken
// writes nothing and learns what holds the key, as alone.
//
// The price is shared fate, paid only on failure: if any statement of a
// merged pipeline fails (a lock wait that ran out, a constraint), or its
// commit does, the transaction is rolled back, or its outcome unknown, for
// all its members. The member whose statement failed for a reason of its
// own (its values, its lock wait) gets the answer it would have got alone;
// every other member sends its pipeline again on its own. That is always
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
)

// groupCommitter merges concurrent deferred commits into shared pipelines.
// It starts no goroutine while idle and needs no closing: a goroutine sends
// pipelines while any are queued and ends when the queue is empty.
type groupCommitter struct {
	pool *pgxpool.Pool
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
	batch *pgx.Batch
	done  chan struct{}
	taken bool  // under groupCommitter.mu: in a pipeline on its way
	err   error // set before done is closed
}

// commit sends l's pipeline batch, merged with those of concurrent commits,
// and returns l's outcome: nil when its key was claimed and its writes made,
// *idempotency.TakenError or ErrInFlight when the key was not free, anything
// else translated.
func (g *groupCommitter) commit(ctx context.Context, l *deferredLease, batch *pgx.Batch) error {
	m := &member{ctx: ctx, lease: l, batch: batch, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, m)
	var first []*member
	if g.inFlight < maxMergedCommits {
		g.inFlight++
		first = g.takeLocked()
	}
	g.mu.Unlock()
	if first != nil {
		go g.send(first)
	}

	select {
	case <-m.done:
	case <-ctx.Done():
		g.mu.Lock()
		if !m.taken {
			// Still queued: nothing was sent, nothing will be.
			g.queue = slices.DeleteFunc(g.queue, func(q *member) bool { return q == m })
			g.mu.Unlock()
			return translate(fmt.Errorf("commit: %w", ctx.Err()))
		}
		g.mu.Unlock()
		// On its way: wait for what became of it, so that the answer is
		// true (a commit that happened is a success) and no statement of
		// this request outlives it. Not for long: a pipeline of this
		// member alone runs under ctx, which pgx cancels in PostgreSQL,
		// and a merged one ends by the latest deadline of its members.
		<-m.done
		if errors.Is(m.err, errSendAlone) {
			return translate(fmt.Errorf("commit: %w", ctx.Err()))
		}
	}
	if errors.Is(m.err, errSendAlone) {
		if g.sent != nil {
			g.sent(1)
		}
		return l.send(ctx, batch)
	}
	return m.err
}

// takeLocked takes the next pipeline's members off the queue: in queue
// order, at most maxMembers, and no two of one key (in one transaction the
// second would see the first's key row as its own and write too; from a
// later pipeline it waits for that row and finds it taken).
// Members are sorted by key, so that pipelines in flight at once, here or on
// other replicas, take key-row locks in one order and cannot deadlock.
func (g *groupCommitter) takeLocked() []*member {
	var (
		taken []*member
		rest  = g.queue[:0]
		seen  = map[memberKey]bool{}
	)
	for _, m := range g.queue {
		k := memberKey{m.lease.req.Account, m.lease.req.Key}
		if len(taken) == maxMembers || seen[k] {
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
		if c := slices.Compare(a.lease.req.Account[:], b.lease.req.Account[:]); c != 0 {
			return c
		}
		return cmp.Compare(a.lease.req.Key, b.lease.req.Key)
	})
	return taken
}

type memberKey struct {
	account [16]byte
	key     string
}

// send sends members as one pipeline, then the next queued ones, until the
// queue is empty.
func (g *groupCommitter) send(members []*member) {
	for {
		g.sendMerged(members)
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.inFlight--
			g.mu.Unlock()
			return
		}
		members = g.takeLocked()
		g.mu.Unlock()
	}
}

// sendMerged sends members' pipelines back to back as one and sets each
// member's outcome.
func (g *groupCommitter) sendMerged(members []*member) {
	defer func() {
		for _, m := range members {
			close(m.done)
		}
	}()
	if g.sent != nil {
		g.sent(len(members))
	}
	if len(members) == 1 {
		// Alone, as if never queued: under its own request's context.
		m := members[0]
		m.err = m.lease.send(m.ctx, m.batch)
		return
	}
	ctx, cancel := mergedContext(members)
	defer cancel()
	var batch pgx.Batch
	for _, m := range members {
		for _, q := range m.batch.QueuedQueries {
			// A copy: pgx binds a queued query to the prepared statement
			// of the connection it is sent on, and a member may have to
			// send its own batch again, on another connection.
			q := *q
			batch.QueuedQueries = append(batch.QueuedQueries, &q)
		}
	}
	br := g.pool.SendBatch(ctx, &batch)
	results := make([]deferredResults, len(members))
	failed, failure := -1, error(nil)
	for i, m := range members {
		var err error
		if results[i], err = m.lease.read(br); err != nil {
			failed, failure = i, err
			break
		}
	}
	closeErr := br.Close()
	switch {
	case failed >= 0 && ownFailure(ctx, failure):
		// The first statement that failed was this member's, for a reason
		// of its own: it gets the answer it would have got alone, at once
		// (a lock wait that ran out is not waited for twice); the others
		// were rolled back with it and go again on their own.
		for i, m := range members {
			m.err = errSendAlone
			if i == failed {
				m.err = readError(m.ctx, failure)
			}
		}
	case failed >= 0 || closeErr != nil:
		for _, m := range members {
			m.err = errSendAlone
		}
	default:
		for i, m := range members {
			m.err = m.lease.outcome(results[i])
		}
	}
}

// ownFailure reports whether err, the first failure in a merged pipeline,
// belongs to the member whose statement it failed rather than to the
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
