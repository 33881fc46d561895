package memory

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
)

// CreatePayment implements payments.Unit. Like PostgreSQL's foreign key, it
// refuses a payment of an order that does not exist.
func (u *unit) CreatePayment(_ context.Context, p payments.Payment) error {
	s := u.s
	var err error
	u.write(func() {
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
func (s *Store) GetPayment(_ context.Context, account, id uuid.UUID) (payments.Payment, error) {
	var (
		p  payments.Payment
		ok bool
	)
	s.read(func() { p, ok = s.payments[account][id] })
	if !ok {
		return payments.Payment{}, payments.ErrNotFound
	}
	return p, nil
}

// FinishPayment implements payments.Repository. The payment and its key's
// record change under the data lock together, as in one transaction.
func (s *Store) FinishPayment(_ context.Context, p payments.Payment, final idempotency.Response) (bool, error) {
	var changed bool
	s.write(func() {
		cur, ok := s.payments[p.AccountID][p.ID]
		if !ok || cur.Final() {
			return
		}
		cur.Status, cur.FailureReason, cur.ProviderChargeID, cur.CompletedAt = p.Status, p.FailureReason, p.ProviderChargeID, p.CompletedAt
		s.payments[p.AccountID][p.ID] = cur
		s.keys.ReplaceProvisional(idempotency.Ref{Scope: auth.Scope(cur.AccountID), Key: cur.Key, ClaimedAt: cur.KeyClaimedAt}, final)
		changed = true
	})
	return changed, nil
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

// EnqueueCharge implements payments.Unit: the job is written inside the
// unit's lease and undone if it rolls back.
func (u *unit) EnqueueCharge(_ context.Context, ref payments.Ref) error {
	s := u.s
	u.write(func() {
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
func (s *Store) CountPayments(_ context.Context, account uuid.UUID) (int, error) {
	var n int
	s.read(func() { n = len(s.payments[account]) })
	return n, nil
}
