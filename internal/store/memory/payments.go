package memory

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
)

// CreatePayment implements payments.Repository. Like PostgreSQL's foreign
// key, it refuses a payment of an order that does not exist.
func (s *Store) CreatePayment(ctx context.Context, p payments.Payment) error {
	var err error
	s.write(ctx, func() {
		if _, ok := s.orders[p.AccountID][p.OrderID]; !ok {
			err = orders.ErrNotFound
			return
		}
		byID := s.payments[p.AccountID]
		if byID == nil {
			byID = map[uuid.UUID]payments.Payment{}
			s.payments[p.AccountID] = byID
		}
		byID[p.ID] = p
	}, func() {
		delete(s.payments[p.AccountID], p.ID)
	})
	return err
}

// GetPayment implements payments.Repository.
func (s *Store) GetPayment(ctx context.Context, account, id uuid.UUID) (payments.Payment, error) {
	var (
		p  payments.Payment
		ok bool
	)
	s.read(ctx, func() { p, ok = s.payments[account][id] })
	if !ok {
		return payments.Payment{}, payments.ErrNotFound
	}
	return p, nil
}

// FinishPayment implements payments.Repository. The payment and its key's
// record change under the data lock together, as in one transaction.
func (s *Store) FinishPayment(ctx context.Context, p payments.Payment, final idempotency.Response) (bool, error) {
	var changed bool
	var before payments.Payment
	s.write(ctx, func() {
		cur, ok := s.payments[p.AccountID][p.ID]
		if !ok || cur.Final() {
			return
		}
		before = cur
		cur.Status, cur.FailureReason, cur.ProviderChargeID, cur.CompletedAt = p.Status, p.FailureReason, p.ProviderChargeID, p.CompletedAt
		s.payments[p.AccountID][p.ID] = cur
		s.replaceProvisional(cur.AccountID, cur.Key, cur.KeyClaimedAt, final)
		changed = true
	}, func() {
		// Only inside a lease, which the worker never uses; kept exact.
		if changed {
			s.payments[p.AccountID][p.ID] = before
		}
	})
	return changed, nil
}

// replaceProvisional swaps the provisional response stored under the key
// record claimed at claimedAt for final. A record that expired and was
// claimed again, or was never provisional, is left alone.
func (s *Store) replaceProvisional(account uuid.UUID, key string, claimedAt time.Time, final idempotency.Response) {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	e := s.keys[scope{account, key}]
	if e == nil || e.rec == nil || !e.rec.CreatedAt.Equal(claimedAt) || !idempotency.Provisional(e.rec.Response.Status) {
		return
	}
	rec := copyRecord(idempotency.Record{Fingerprint: e.rec.Fingerprint, Response: final, CreatedAt: e.rec.CreatedAt, ExpiresAt: e.rec.ExpiresAt})
	e.rec = &rec
}

// chargeQueue is the in-process stand-in for River's job table: charges
// enqueued by committed payments, each with its attempt count and the time
// it is due.
type chargeQueue struct {
	mu   sync.Mutex
	jobs []chargeJob
	wake chan struct{} // signalled (without blocking) when a job is added
}

type chargeJob struct {
	ref     payments.Ref
	attempt int // attempts made so far
	due     time.Time
}

func newChargeQueue() chargeQueue { return chargeQueue{wake: make(chan struct{}, 1)} }

func (q *chargeQueue) push(j chargeJob) {
	q.mu.Lock()
	q.jobs = append(q.jobs, j)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// EnqueueCharge implements payments.Queue: the job is written inside ctx's
// lease and undone if it rolls back.
func (s *Store) EnqueueCharge(ctx context.Context, ref payments.Ref) error {
	s.write(ctx, func() {
		s.charges.push(chargeJob{ref: ref, due: s.now()})
	}, func() {
		q := &s.charges
		q.mu.Lock()
		defer q.mu.Unlock()
		q.jobs = slices.DeleteFunc(q.jobs, func(j chargeJob) bool { return j.ref == ref })
	})
	return nil
}

// NextCharge implements payments.LocalQueue: it blocks until a committed
// charge is due or ctx ends, and hands it out with its attempt number.
func (s *Store) NextCharge(ctx context.Context) (payments.Ref, int, error) {
	for {
		wait := time.Hour
		// The data lock keeps out jobs of leases that have not committed:
		// a lease holds it from its first write until it settles.
		s.data.RLock()
		q := &s.charges
		q.mu.Lock()
		now := s.now()
		for i, j := range q.jobs {
			if !j.due.After(now) {
				q.jobs = slices.Delete(q.jobs, i, i+1)
				q.mu.Unlock()
				s.data.RUnlock()
				return j.ref, j.attempt + 1, nil
			}
			wait = min(wait, j.due.Sub(now))
		}
		q.mu.Unlock()
		s.data.RUnlock()
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return payments.Ref{}, 0, ctx.Err()
		case <-q.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// RetryCharge implements payments.LocalQueue: attempt failed, run the next
// one at due.
func (s *Store) RetryCharge(ref payments.Ref, attempt int, due time.Time) {
	s.charges.push(chargeJob{ref: ref, attempt: attempt, due: due})
}

// CountPayments returns how many payments the account has.
func (s *Store) CountPayments(ctx context.Context, account uuid.UUID) (int, error) {
	var n int
	s.read(ctx, func() { n = len(s.payments[account]) })
	return n, nil
}
