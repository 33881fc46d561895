package memory

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// CreatePayment implements payments.Unit. Like PostgreSQL's foreign key, it
// refuses a payment of an order that does not exist, and like its
// payments_one_active_per_order, a second pending or succeeded payment of
// an order (retrying is the answer: see the PostgreSQL store).
func (u *unit) CreatePayment(_ context.Context, p payments.Payment) error {
	s := u.s
	var err error
	u.write(func() {
		if _, ok := s.orders[p.AccountID][p.OrderID]; !ok {
			err = orders.ErrNotFound
			return
		}
		for _, other := range s.payments[p.AccountID] {
			if other.OrderID == p.OrderID && other.Status != payments.StatusFailed {
				err = fmt.Errorf("%w: order %s has another pending or succeeded payment", idempotency.ErrUnavailable, p.OrderID)
				return
			}
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

// GetPayment implements payments.Reads and payments.Settlements.
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

// FinishPayment implements payments.Settlements. The payment and its key's
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

// LockPayment implements payments.RefundUnit (see LockOrder).
func (u *unit) LockPayment(ctx context.Context, account, id uuid.UUID) (payments.Payment, error) {
	u.lock()
	var (
		p  payments.Payment
		ok bool
	)
	u.read(func() { p, ok = u.s.payments[account][id] })
	if !ok {
		return payments.Payment{}, payments.ErrNotFound
	}
	return p, nil
}

// taskQueue is the in-process stand-in for River's job table: charges and
// refunds enqueued by committed units of work, each with its attempt count
// and the time it is due.
type taskQueue struct {
	mu   sync.Mutex
	jobs []taskJob
	wake chan struct{} // signalled (without blocking) when a job is added
}

type taskJob struct {
	task    payments.Task
	attempt int // attempts made so far
	due     time.Time
}

func newTaskQueue() taskQueue { return taskQueue{wake: make(chan struct{}, 1)} }

func (q *taskQueue) push(j taskJob) {
	q.mu.Lock()
	q.jobs = append(q.jobs, j)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// enqueue writes t's job inside the unit's lease, undone if it rolls back.
func (u *unit) enqueue(t payments.Task) {
	s := u.s
	u.write(func() {
		s.tasks.push(taskJob{task: t, due: s.now()})
	}, func() {
		q := &s.tasks
		q.mu.Lock()
		defer q.mu.Unlock()
		q.jobs = slices.DeleteFunc(q.jobs, func(j taskJob) bool { return j.task == t })
	})
}

// EnqueueCharge implements payments.Unit.
func (u *unit) EnqueueCharge(_ context.Context, ref payments.Ref) error {
	u.enqueue(payments.ChargeTask(ref))
	return nil
}

// EnqueueRefund implements payments.RefundUnit.
func (u *unit) EnqueueRefund(_ context.Context, ref payments.RefundRef) error {
	u.enqueue(payments.RefundTask(ref))
	return nil
}

// NextTask implements payments.LocalQueue: it blocks until a committed task
// is due or ctx ends, and hands it out with its attempt number.
func (s *Store) NextTask(ctx context.Context) (payments.Task, int, error) {
	for {
		wait := time.Hour
		// The data lock keeps out jobs of leases that have not committed:
		// a lease holds it from its first write until it settles.
		s.data.RLock()
		q := &s.tasks
		q.mu.Lock()
		now := s.now()
		for i, j := range q.jobs {
			if !j.due.After(now) {
				q.jobs = slices.Delete(q.jobs, i, i+1)
				q.mu.Unlock()
				s.data.RUnlock()
				return j.task, j.attempt + 1, nil
			}
			wait = min(wait, j.due.Sub(now))
		}
		q.mu.Unlock()
		s.data.RUnlock()
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return payments.Task{}, 0, ctx.Err()
		case <-q.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// QueuedTasks is how many tasks wait in the queue, due or not: with the
// worker stopped, the attempts it would still make.
func (s *Store) QueuedTasks() int {
	s.tasks.mu.Lock()
	defer s.tasks.mu.Unlock()
	return len(s.tasks.jobs)
}

// RetryTask implements payments.LocalQueue: attempt failed, run the next
// one at due.
func (s *Store) RetryTask(t payments.Task, attempt int, due time.Time) {
	s.tasks.push(taskJob{task: t, attempt: attempt, due: due})
}

// CountPayments returns how many payments the account has.
func (s *Store) CountPayments(_ context.Context, account uuid.UUID) (int, error) {
	var n int
	s.read(func() { n = len(s.payments[account]) })
	return n, nil
}

// PendingStats implements metrics.PendingSource.
func (s *Store) PendingStats(context.Context) (payments.PendingStats, error) {
	var st payments.PendingStats
	now := s.now()
	count := func(p *payments.Pending, createdAt time.Time) {
		p.Count++
		p.OldestAge = max(p.OldestAge, now.Sub(createdAt))
	}
	s.read(func() {
		for _, byID := range s.payments {
			for _, p := range byID {
				if !p.Final() {
					count(&st.Payments, p.CreatedAt)
				}
			}
		}
		for _, byID := range s.refunds {
			for _, r := range byID {
				if !r.Final() {
					count(&st.Refunds, r.CreatedAt)
				}
			}
		}
	})
	return st, nil
}
