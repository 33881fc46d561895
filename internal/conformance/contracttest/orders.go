package contracttest

import (
	"context"
	"errors"
	"fmt"
	"github.com/oncekey/oncekey/idempotency"
	"net/http"
	"strings"
)

const (
	// changeOrder is a change of seedOrder: three items for 1800.
	changeOrder = `{"items":[{"sku":"SKU-1","qty":3}],"amount":1800}`
	changeAgain = `{"amount":2400}`
)

// order creates an order of seedOrder (1200 RUB) for the check name and
// returns it.
func (s *session) order(ctx context.Context, name string) (resource, error) {
	a, err := s.want(ctx, http.StatusCreated, "", http.MethodPost, "/orders", s.key(name+"-order"), seedOrder)
	if err != nil {
		return resource{}, fmt.Errorf("create an order: %w", err)
	}
	return decode(a)
}

// orders creates one order for each name.
func (s *session) orders(ctx context.Context, names ...string) ([]resource, error) {
	out := make([]resource, 0, len(names))
	for _, name := range names {
		o, err := s.order(ctx, name)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// unchanged checks that the order o is still as it was created.
func (s *session) unchanged(ctx context.Context, o resource) error {
	got, err := s.get(ctx, "/orders/"+o.ID)
	if err != nil {
		return err
	}
	if got.Status != "created" || got.Amount != o.Amount {
		return fmt.Errorf("order %s changed: it is %s with amount %d, want created with %d", o.ID, got.Status, got.Amount, o.Amount)
	}
	return nil
}

// rejected is a request the service must refuse before it runs anything.
type rejected struct {
	status      int
	problemType string
	path, body  string
	header      []string
}

// consumesNoKey sends each request of bad under key, then method path with
// body under the same key: that one must run, with status.
func (s *session) consumesNoKey(ctx context.Context, method, key string, bad []rejected, status int, path, body string) (answer, error) {
	for _, r := range bad {
		if _, err := s.want(ctx, r.status, r.problemType, method, r.path, key, r.body, r.header...); err != nil {
			return answer{}, err
		}
	}
	a, err := s.fresh(ctx, status, "", method, path, key, body)
	if err != nil {
		return a, fmt.Errorf("the same key after the rejected requests: %w", err)
	}
	return a, nil
}

// orderBurst is the check that a burst of duplicates of method on a new
// order, with body, runs once.
func orderBurst(name, method, body string) func(context.Context, *session) error {
	return func(ctx context.Context, s *session) error {
		o, err := s.order(ctx, name)
		if err != nil {
			return err
		}
		key := s.key(name)
		_, err = s.burst(ctx, http.StatusOK, func(ctx context.Context) (answer, error) {
			return s.do(ctx, method, "/orders/"+o.ID, key, body)
		}, nil)
		return err
	}
}

// orderChecks cover changing (PATCH) and cancelling (DELETE) an order.
var orderChecks = []check{
	{"an order change runs once, a retry replays it and changes nothing", func(ctx context.Context, s *session) error {
		o, err := s.order(ctx, "change")
		if err != nil {
			return err
		}
		path, key := "/orders/"+o.ID, s.key("change")
		first, err := s.twice(ctx, http.StatusOK, "", http.MethodPatch, path, key, changeOrder)
		if err != nil {
			return err
		}
		if changed, err := decode(first); err != nil || changed.ID != o.ID || changed.Amount != 1800 {
			return errors.Join(err, fmt.Errorf("the change answered %s, want order %s with amount 1800", first.body, o.ID))
		}
		// A later change under another key: a retry of the first key must
		// replay the first change, not run it again over the later one.
		if _, err := s.fresh(ctx, http.StatusOK, "", http.MethodPatch, path, s.key("change-later"), changeAgain); err != nil {
			return err
		}
		again, err := s.do(ctx, http.MethodPatch, path, key, changeOrder)
		if err != nil {
			return err
		}
		if err := replayOf(first, again); err != nil {
			return fmt.Errorf("a retry after a later change: %w", err)
		}
		if got, err := s.get(ctx, path); err != nil || got.Amount != 2400 {
			return errors.Join(err, fmt.Errorf("the order's amount is %d after the retry, want the later change's 2400", got.Amount))
		}
		return nil
	}},
	{"an order change's key with another body or on another order is 409", func(ctx context.Context, s *session) error {
		o, err := s.orders(ctx, "change-mismatch", "change-mismatch-other")
		if err != nil {
			return err
		}
		key := s.key("change-mismatch")
		if _, err := s.want(ctx, http.StatusOK, "", http.MethodPatch, "/orders/"+o[0].ID, key, changeOrder); err != nil {
			return err
		}
		if _, err := s.want(ctx, http.StatusConflict, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, http.MethodPatch, "/orders/"+o[0].ID, key, changeAgain); err != nil {
			return fmt.Errorf("another body: %w", err)
		}
		if _, err := s.want(ctx, http.StatusConflict, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, http.MethodPatch, "/orders/"+o[1].ID, key, changeOrder); err != nil {
			return fmt.Errorf("another order: %w", err)
		}
		if got, err := s.get(ctx, "/orders/"+o[0].ID); err != nil || got.Amount != 1800 {
			return errors.Join(err, fmt.Errorf("the order's amount is %d, want the first change's 1800", got.Amount))
		}
		return s.unchanged(ctx, o[1])
	}},
	{"concurrent duplicate order changes run once", orderBurst("change-storm", http.MethodPatch, changeOrder)},
	{"a rejected order change consumes no key", func(ctx context.Context, s *session) error {
		o, err := s.order(ctx, "change-rejected")
		if err != nil {
			return err
		}
		path := "/orders/" + o.ID
		_, err = s.consumesNoKey(ctx, http.MethodPatch, s.key("change-rejected"), []rejected{
			{status: 400, problemType: "validation-error", path: path, body: `{"amount":0}`},
			{status: 400, problemType: "validation-error", path: path, body: `{"colour":"red"}`},
			{status: 400, problemType: "validation-error", path: path, body: `{}`},
			{status: 415, problemType: "unsupported-media-type", path: path, body: changeOrder, header: []string{"Content-Type", "application/json"}},
		}, http.StatusOK, path, changeOrder)
		return err
	}},
	{"a cancellation runs once, every retry replays its 200", func(ctx context.Context, s *session) error {
		o, err := s.order(ctx, "cancel")
		if err != nil {
			return err
		}
		path, key := "/orders/"+o.ID, s.key("cancel")
		first, err := s.twice(ctx, http.StatusOK, "", http.MethodDelete, path, key, "")
		if err != nil {
			return err
		}
		cancelled, err := decode(first)
		if err != nil {
			return err
		}
		if cancelled.Status != "cancelled" || cancelled.CancelledAt == nil {
			return fmt.Errorf("the cancellation answered %s, want a cancelled order with cancelled_at", first.body)
		}
		// Cancelling it again under another key answers the order as the
		// first cancellation left it; the first key still replays its 200.
		other, err := s.fresh(ctx, http.StatusOK, "", http.MethodDelete, path, s.key("cancel-other"), "")
		if err != nil {
			return fmt.Errorf("a cancelled order cancelled under another key: %w", err)
		}
		if !sameJSON(other.body, first.body) {
			return fmt.Errorf("a cancelled order cancelled under another key answered\n%s\nwant the cancelled order\n%s", other.body, first.body)
		}
		again, err := s.do(ctx, http.MethodDelete, path, key, "")
		if err != nil {
			return err
		}
		if err := replayOf(first, again); err != nil {
			return fmt.Errorf("the third cancellation with the key: %w", err)
		}
		got, err := s.want(ctx, http.StatusOK, "", http.MethodGet, path, "", "")
		if err == nil && !sameJSON(got.body, first.body) {
			err = fmt.Errorf("GET %s answers\n%s\nwant the cancelled order\n%s", path, got.body, first.body)
		}
		return err
	}},
	{"a cancellation's key on another order or for a change is 409, a cancellation without a key is 400", func(ctx context.Context, s *session) error {
		o, err := s.orders(ctx, "cancel-mismatch", "cancel-mismatch-other")
		if err != nil {
			return err
		}
		key := s.key("cancel-mismatch")
		if _, err := s.want(ctx, http.StatusOK, "", http.MethodDelete, "/orders/"+o[0].ID, key, ""); err != nil {
			return err
		}
		if _, err := s.want(ctx, http.StatusConflict, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, http.MethodDelete, "/orders/"+o[1].ID, key, ""); err != nil {
			return fmt.Errorf("another order: %w", err)
		}
		if _, err := s.want(ctx, http.StatusConflict, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, http.MethodPatch, "/orders/"+o[0].ID, key, changeOrder); err != nil {
			return fmt.Errorf("a change: %w", err)
		}
		if _, err := s.want(ctx, http.StatusBadRequest, idempotency.ProblemOf(idempotency.ErrMissingKey).Slug, http.MethodDelete, "/orders/"+o[1].ID, "", ""); err != nil {
			return err
		}
		return s.unchanged(ctx, o[1])
	}},
	{"concurrent duplicate cancellations run once", orderBurst("cancel-storm", http.MethodDelete, "")},
	{"a rejected cancellation consumes no key", func(ctx context.Context, s *session) error {
		o, err := s.order(ctx, "cancel-rejected")
		if err != nil {
			return err
		}
		_, err = s.consumesNoKey(ctx, http.MethodDelete, s.key("cancel-rejected"), []rejected{
			{status: 400, problemType: "validation-error", path: "/orders/" + strings.Repeat("0", 65)},
		}, http.StatusOK, "/orders/"+o.ID, "")
		return err
	}},
	{"changing or cancelling an unknown order is 404, stored under the key", func(ctx context.Context, s *session) error {
		path := "/orders/" + unknownID
		_, err := s.twice(ctx, http.StatusNotFound, "not-found", http.MethodPatch, path, s.key("change-unknown"), changeOrder)
		if err != nil {
			return err
		}
		_, err = s.twice(ctx, http.StatusNotFound, "not-found", http.MethodDelete, path, s.key("cancel-unknown"), "")
		return err
	}},
	{"a cancelled order can be neither paid nor changed: 409, stored under the key", func(ctx context.Context, s *session) error {
		o, err := s.order(ctx, "cancelled")
		if err != nil {
			return err
		}
		path := "/orders/" + o.ID
		if _, err := s.want(ctx, http.StatusOK, "", http.MethodDelete, path, s.key("cancelled"), ""); err != nil {
			return err
		}
		if _, err := s.twice(ctx, http.StatusConflict, "order-cancelled", http.MethodPost, "/payments", s.key("cancelled-pay"), paymentOf(o)); err != nil {
			return err
		}
		_, err = s.twice(ctx, http.StatusConflict, "order-not-modifiable", http.MethodPatch, path, s.key("cancelled-change"), changeOrder)
		return err
	}},
}
