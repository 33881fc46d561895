package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
)

// Group settles.
//
// A held operation ends with one statement of its own, the settle of its
// record (or its release), and what that statement costs is its durable
// commit: the WAL flush. So settles and releases that arrive while others
// are on their way are sent together, as claims at commit are
// (groupcommit.go): the statements queued in the meantime go as one
// pipeline, which PostgreSQL runs as one implicit transaction with one
// commit. Each statement forces its transaction's commit to be durable,
// whatever synchronous_commit the session has, so the shared commit is as
// durable as each alone. A lone settle is sent at once: merging adds no
// wait.
//
// Each member's statement is the one it would send alone, on its own key
// row: it reports whether its record was there to settle or release. The
// price is shared fate, paid only on failure: if the merged transaction
// fails, nothing of it is committed, and every member is sent again
// alone, under its own context, which is safe, since a settle or release
// that finds its record no longer held changes nothing.

// settleGroup merges concurrent settles and releases into shared
// pipelines. It starts no goroutine while idle: a goroutine sends
// pipelines while any are queued and ends when the queue is empty.
type settleGroup struct {
	pool  *pgxpool.Pool
	store *Store
	// byScope merges only members of the first queued member's scope
	// (Options.MergeByScope).
	byScope bool
	// sent, if set, is told the size of every pipeline sent (tests).
	sent func(members int)

	mu       sync.Mutex
	queue    []*settleMember
	inFlight int // senders running
}

// settleMember is one settle (resp set) or release waiting to be sent.
type settleMember struct {
	ctx   context.Context
	scope string // ref.Scope as sent
	ref   idempotency.Ref
	resp  *idempotency.Response // nil: release
	done  chan struct{}
	taken bool // under settleGroup.mu: in a pipeline on its way
	// Set before done is closed: whether the record was there, or why
	// the member is to be sent again alone (errSendAlone) or failed.
	ok  bool
	err error
}

// run settles (resp set) or releases ref's record, merged with concurrent
// settles and releases, and reports whether the record was there.
func (g *settleGroup) run(ctx context.Context, ref idempotency.Ref, resp *idempotency.Response) (bool, error) {
	m := &settleMember{ctx: ctx, scope: string(g.store.scope.arg(ref.Scope)), ref: ref, resp: resp, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, m)
	var first []*settleMember
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
			g.queue = slices.DeleteFunc(g.queue, func(q *settleMember) bool { return q == m })
			g.mu.Unlock()
			return false, Translate(fmt.Errorf("settle: %w", ctx.Err()))
		}
		g.mu.Unlock()
		// On its way: wait for what became of it, so that the answer is
		// true. Not for long: the pipeline ends by its members' latest
		// deadline.
		<-m.done
	}
	if errors.Is(m.err, errSendAlone) {
		return g.store.settleAlone(ctx, ref, resp)
	}
	return m.ok, m.err
}

// takeLocked takes the next pipeline's members off the queue: in queue
// order, at most maxMembers, no two of one key, and with byScope only
// those of the first one's scope; sorted by key, so that pipelines in
// flight at once lock key rows in one order.
func (g *settleGroup) takeLocked() []*settleMember {
	var (
		taken []*settleMember
		rest  = g.queue[:0]
		seen  = map[memberKey]bool{}
	)
	for _, m := range g.queue {
		k := memberKey{m.scope, m.ref.Key}
		if len(taken) == maxMembers || seen[k] || (g.byScope && len(taken) > 0 && k.scope != taken[0].scope) {
			rest = append(rest, m)
			continue
		}
		seen[k] = true
		m.taken = true
		taken = append(taken, m)
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	slices.SortFunc(taken, func(a, b *settleMember) int {
		if c := cmp.Compare(a.scope, b.scope); c != 0 {
			return c
		}
		return cmp.Compare(a.ref.Key, b.ref.Key)
	})
	return taken
}

// send sends members as one pipeline, then the next queued ones, until
// the queue is empty.
func (g *settleGroup) send(members []*settleMember) {
	for members != nil {
		g.sendMerged(members)
		members = g.next()
	}
}

// next takes the members of the next pipeline off the queue, or, when
// none are queued, ends the sender's turn (nil).
func (g *settleGroup) next() []*settleMember {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.inFlight--
		return nil
	}
	return g.takeLocked()
}

// sendMerged sends members' statements as one pipeline, sets what became
// of each and tells it. A member alone is sent as its own statement,
// under its own context.
func (g *settleGroup) sendMerged(members []*settleMember) {
	defer func() {
		for _, m := range members {
			close(m.done)
		}
	}()
	if g.sent != nil {
		g.sent(len(members))
	}
	if len(members) == 1 {
		m := members[0]
		m.ok, m.err = g.store.settleAlone(m.ctx, m.ref, m.resp)
		return
	}
	ctx, cancel := mergedSettleContext(members)
	defer cancel()
	p := &queue{}
	queued := make([]*settleMember, 0, len(members))
	for _, m := range members {
		// Queued, not run: what these return is not their result, but an
		// error is the member's own, found before anything was sent (a
		// response that cannot be encoded).
		var err error
		if m.resp == nil {
			_, err = g.store.release(ctx, p, m.ref)
		} else {
			_, err = g.store.replace(ctx, p, m.ref, idempotency.StatusHeld, *m.resp)
		}
		if err != nil {
			m.err = err
			continue
		}
		queued = append(queued, m)
	}
	if len(queued) == 0 {
		return
	}
	br := g.pool.SendBatch(ctx, &p.batch)
	var failure error
	for _, m := range queued {
		tag, err := br.Exec()
		if err != nil {
			failure = err
			break
		}
		m.ok = tag.RowsAffected() == 1
	}
	if err := br.Close(); failure == nil {
		failure = err
	}
	if failure != nil {
		// Nothing of the transaction is committed, or its commit is in
		// doubt: each member goes again alone, which finds its record
		// settled if the commit did happen.
		for _, m := range queued {
			m.ok, m.err = false, errSendAlone
		}
	}
}

// mergedSettleContext is the context of a merged pipeline: it keeps the
// first member's values and ends at the latest of its members' deadlines
// (mergedTimeout from now for one without).
func mergedSettleContext(members []*settleMember) (context.Context, context.CancelFunc) {
	ms := make([]*member, len(members))
	for i, m := range members {
		ms[i] = &member{ctx: m.ctx}
	}
	return mergedContext(ms)
}

// settleAlone settles (resp set) or releases ref's record in a statement
// of its own.
func (s *Store) settleAlone(ctx context.Context, ref idempotency.Ref, resp *idempotency.Response) (bool, error) {
	if resp == nil {
		return s.release(ctx, s.pool, ref)
	}
	return s.replace(ctx, s.pool, ref, idempotency.StatusHeld, *resp)
}
