package contracttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/oncekey/oncekey/idempotency"
	"net/http"
	"strings"
	"sync"
	"time"
)

// settleTime bounds how long a check waits for a payment or a refund to
// become final.
const settleTime = 30 * time.Second

// paymentOf is the body of a payment of the whole order o (in RUB).
func paymentOf(o resource) string {
	return fmt.Sprintf(`{"order_id":%q,"amount":%d,"currency":"RUB"}`, o.ID, o.Amount)
}

func refundOf(amount int64) string {
	return fmt.Sprintf(`{"amount":%d,"reason":"one item returned"}`, amount)
}

// paid pays a new order of 1200 for the check name, waits until the payment
// succeeded and returns it.
func (s *session) paid(ctx context.Context, name string) (resource, error) {
	o, err := s.order(ctx, name)
	if err != nil {
		return resource{}, err
	}
	a, err := s.want(ctx, http.StatusAccepted, "", http.MethodPost, "/payments", s.key(name+"-payment"), paymentOf(o))
	if err != nil {
		return resource{}, fmt.Errorf("pay an order: %w", err)
	}
	p, err := decode(a)
	if err != nil {
		return resource{}, err
	}
	if _, err := s.settle(ctx, "/payments/"+p.ID); err != nil {
		return resource{}, err
	}
	return p, nil
}

// settle polls GET path until the payment or refund there is final, for at
// most settleTime, and returns the answer; it must have succeeded.
func (s *session) settle(ctx context.Context, path string) (answer, error) {
	deadline := time.Now().Add(settleTime)
	for {
		a, err := s.want(ctx, http.StatusOK, "", http.MethodGet, path, "", "")
		if err != nil {
			return a, err
		}
		r, err := decode(a)
		if err != nil {
			return a, err
		}
		switch {
		case r.Status == "succeeded":
			return a, nil
		case r.Status != "pending":
			return a, fmt.Errorf("%s ended %s, want succeeded: %s", path, r.Status, a.body)
		case time.Now().After(deadline):
			return a, fmt.Errorf("%s is still pending after %s", path, settleTime)
		}
		select {
		case <-ctx.Done():
			return a, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// refunds lists the refunds of payment p.
func (s *session) refunds(ctx context.Context, p resource) ([]json.RawMessage, error) {
	a, err := s.want(ctx, http.StatusOK, "", http.MethodGet, "/payments/"+p.ID+"/refunds", "", "")
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(a.body, &list); err != nil {
		return nil, fmt.Errorf("GET /payments/%s/refunds: %w", p.ID, err)
	}
	return list.Items, nil
}

// onlyRefund waits until the refund accepted with answer accepted
// succeeded, checks that it is the only refund of p and returns its final
// GET.
func (s *session) onlyRefund(ctx context.Context, p resource, accepted answer) (answer, error) {
	r, err := decode(accepted)
	if err != nil {
		return answer{}, err
	}
	final, err := s.settle(ctx, "/refunds/"+r.ID)
	if err != nil {
		return final, err
	}
	list, err := s.refunds(ctx, p)
	if err != nil {
		return final, err
	}
	if len(list) != 1 || !sameJSON(list[0], final.body) {
		return final, fmt.Errorf("GET /payments/%s/refunds lists %d refunds: %s\nwant only %s", p.ID, len(list), list, final.body)
	}
	return final, nil
}

// refundReplay is isReplay for a refund: while the refund is pending a
// retry replays the 202; once it is final, a 200 with the same refund.
func refundReplay(ran, a answer) error {
	if a.status != http.StatusOK {
		return replayOf(ran, a)
	}
	first, err := decode(ran)
	if err != nil {
		return err
	}
	final, err := decode(a)
	if err != nil {
		return err
	}
	if !replayed(a) || final.ID != first.ID || a.header.Get("Location") != ran.header.Get("Location") {
		return fmt.Errorf("a 200 retry is not the refund replayed:\nfirst: %s\nretry: %s (%s: %q, Location %q)",
			ran.body, a.body, headerReplayed, a.header.Get(headerReplayed), a.header.Get("Location"))
	}
	return nil
}

// paymentChecks cover paying an order and refunding a payment.
var paymentChecks = []check{
	{"a cancellation and a payment of one order sent together: exactly one succeeds", func(ctx context.Context, s *session) error {
		for i := range 5 {
			name := fmt.Sprintf("race-%d", i)
			o, err := s.order(ctx, name)
			if err != nil {
				return err
			}
			var cancel, pay answer
			var cancelErr, payErr error
			var wg sync.WaitGroup
			wg.Go(func() { cancel, cancelErr = s.do(ctx, http.MethodDelete, "/orders/"+o.ID, s.key(name+"-cancel"), "") })
			wg.Go(func() { pay, payErr = s.do(ctx, http.MethodPost, "/payments", s.key(name+"-payment"), paymentOf(o)) })
			wg.Wait()
			if err := errors.Join(cancelErr, payErr); err != nil {
				return err
			}
			cancelled := expect(cancel, http.StatusOK, "") == nil && expect(pay, http.StatusConflict, "order-cancelled") == nil
			paid := expect(cancel, http.StatusConflict, "order-not-cancellable") == nil && expect(pay, http.StatusAccepted, "") == nil
			if !cancelled && !paid {
				return fmt.Errorf("sent together, the cancellation got %d %.200s and the payment %d %.200s; want exactly one to succeed",
					cancel.status, cancel.body, pay.status, pay.body)
			}
		}
		return nil
	}},
	{"an order with a payment can be neither changed nor cancelled: 409, stored under the key", func(ctx context.Context, s *session) error {
		o, err := s.order(ctx, "paid")
		if err != nil {
			return err
		}
		if _, err := s.want(ctx, http.StatusAccepted, "", http.MethodPost, "/payments", s.key("paid-payment"), paymentOf(o)); err != nil {
			return err
		}
		path := "/orders/" + o.ID
		if _, err := s.twice(ctx, http.StatusConflict, "order-not-modifiable", http.MethodPatch, path, s.key("paid-change"), changeOrder); err != nil {
			return err
		}
		if _, err := s.twice(ctx, http.StatusConflict, "order-not-cancellable", http.MethodDelete, path, s.key("paid-cancel"), ""); err != nil {
			return err
		}
		return s.unchanged(ctx, o)
	}},
	{"an order is paid once whatever the key: another key's payment is a stored 409 naming the first", payOnce},
	{"a refund is accepted at once, ends succeeded, then its key answers 200 with the final refund", func(ctx context.Context, s *session) error {
		p, err := s.paid(ctx, "refund")
		if err != nil {
			return err
		}
		path, key, body := "/payments/"+p.ID+"/refunds", s.key("refund"), refundOf(300)
		first, err := s.fresh(ctx, http.StatusAccepted, "", http.MethodPost, path, key, body)
		if err != nil {
			return err
		}
		r, err := decode(first)
		if err != nil {
			return err
		}
		location := first.header.Get("Location")
		if r.Status != "pending" || r.PaymentID != p.ID || r.Amount != 300 {
			return fmt.Errorf("the refund was accepted as %s, want a pending refund of 300 of payment %s", first.body, p.ID)
		}
		if !strings.HasSuffix(location, "/refunds/"+r.ID) || first.header.Get("Retry-After") == "" {
			return fmt.Errorf("the 202 has Location %q and Retry-After %q, want the refund's URL and a delay",
				location, first.header.Get("Retry-After"))
		}
		again, err := s.do(ctx, http.MethodPost, path, key, body)
		if err != nil {
			return err
		}
		if err := refundReplay(first, again); err != nil {
			return fmt.Errorf("a retry at once: %w", err)
		}
		final, err := s.onlyRefund(ctx, p, first)
		if err != nil {
			return err
		}
		replay, err := s.want(ctx, http.StatusOK, "", http.MethodPost, path, key, body)
		if err != nil {
			return fmt.Errorf("a retry once the refund succeeded: %w", err)
		}
		if !replayed(replay) || replay.header.Get("Location") != location || !sameJSON(replay.body, final.body) {
			return fmt.Errorf("a retry once the refund succeeded answered %s (%s: %q, Location %q)\nwant the final refund replayed\n%s",
				replay.body, headerReplayed, replay.header.Get(headerReplayed), replay.header.Get("Location"), final.body)
		}
		return nil
	}},
	{"a refund's key with another body is 409", func(ctx context.Context, s *session) error {
		p, err := s.paid(ctx, "refund-mismatch")
		if err != nil {
			return err
		}
		path, key := "/payments/"+p.ID+"/refunds", s.key("refund-mismatch")
		first, err := s.want(ctx, http.StatusAccepted, "", http.MethodPost, path, key, refundOf(300))
		if err != nil {
			return err
		}
		if _, err := s.want(ctx, http.StatusConflict, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug, http.MethodPost, path, key, refundOf(400)); err != nil {
			return err
		}
		_, err = s.onlyRefund(ctx, p, first)
		return err
	}},
	{"concurrent duplicate refunds make one refund", func(ctx context.Context, s *session) error {
		p, err := s.paid(ctx, "refund-storm")
		if err != nil {
			return err
		}
		path, key := "/payments/"+p.ID+"/refunds", s.key("refund-storm")
		ran, err := s.burst(ctx, http.StatusAccepted, func(ctx context.Context) (answer, error) {
			return s.do(ctx, http.MethodPost, path, key, refundOf(300))
		}, refundReplay)
		if err != nil {
			return err
		}
		_, err = s.onlyRefund(ctx, p, ran)
		return err
	}},
	{"refunding an unknown payment is 404, stored under the key; reading its refunds or an unknown refund is 404", func(ctx context.Context, s *session) error {
		path := "/payments/" + unknownID + "/refunds"
		_, err := s.twice(ctx, http.StatusNotFound, "not-found", http.MethodPost, path, s.key("refund-unknown"), refundOf(300))
		if err != nil {
			return err
		}
		if _, err := s.want(ctx, http.StatusNotFound, "not-found", http.MethodGet, path, "", ""); err != nil {
			return err
		}
		_, err = s.want(ctx, http.StatusNotFound, "not-found", http.MethodGet, "/refunds/"+unknownID, "", "")
		return err
	}},
	{"a rejected refund consumes no key", func(ctx context.Context, s *session) error {
		p, err := s.paid(ctx, "refund-rejected")
		if err != nil {
			return err
		}
		path := "/payments/" + p.ID + "/refunds"
		_, err = s.consumesNoKey(ctx, http.MethodPost, s.key("refund-rejected"), []rejected{
			{status: 400, problemType: "validation-error", path: path, body: `{"amount":0,"reason":"one item returned"}`},
			{status: 400, problemType: "validation-error", path: path, body: `{"amount":300,"reason":"one item returned","note":"x"}`},
			{status: 400, problemType: "validation-error", path: path, body: `{"amount":300}`},
		}, http.StatusAccepted, path, refundOf(300))
		return err
	}},
	{"a refund of more than is left of the payment is 422, stored under the key", func(ctx context.Context, s *session) error {
		p, err := s.paid(ctx, "refund-exceeds")
		if err != nil {
			return err
		}
		path := "/payments/" + p.ID + "/refunds"
		if p.Amount != 1200 {
			return fmt.Errorf("the payment is of %d, want 1200", p.Amount)
		}
		if _, err := s.want(ctx, http.StatusAccepted, "", http.MethodPost, path, s.key("refund-exceeds"), refundOf(1000)); err != nil {
			return err
		}
		if _, err := s.twice(ctx, http.StatusUnprocessableEntity, "refund-exceeds-payment", http.MethodPost, path, s.key("refund-exceeds-more"), refundOf(201)); err != nil {
			return err
		}
		if _, err := s.fresh(ctx, http.StatusAccepted, "", http.MethodPost, path, s.key("refund-exceeds-rest"), refundOf(200)); err != nil {
			return fmt.Errorf("a refund of exactly what is left: %w", err)
		}
		list, err := s.refunds(ctx, p)
		if err == nil && len(list) != 2 {
			err = errors.New("the payment does not list the two refunds accepted")
		}
		return err
	}},
}

// payOnce pays one order under a key, then under a second key at once (the
// first payment pending, or already paid if the provider is quick) and a
// third once the first succeeded: each other key gets a 409 naming the
// first payment, stored (its retry replays it, even after the order's state
// moved on), and the first key still answers with its own payment. A
// client that lost its first key is never charged twice.
func payOnce(ctx context.Context, s *session) error {
	o, err := s.order(ctx, "pay-once")
	if err != nil {
		return err
	}
	body, firstKey, secondKey := paymentOf(o), s.key("pay-once-first"), s.key("pay-once-second")
	accepted, err := s.fresh(ctx, http.StatusAccepted, "", http.MethodPost, "/payments", firstKey, body)
	if err != nil {
		return err
	}
	p, err := decode(accepted)
	if err != nil {
		return err
	}
	second, err := s.do(ctx, http.MethodPost, "/payments", secondKey, body)
	if err != nil {
		return err
	}
	inProgress, paid := expect(second, http.StatusConflict, "payment-in-progress"), expect(second, http.StatusConflict, "order-already-paid")
	switch {
	case inProgress != nil && paid != nil:
		return fmt.Errorf("a second key's payment of order %s: %w; or %w", o.ID, inProgress, paid)
	case replayed(second):
		return errors.New("a second key's payment, sent once, was answered with a replay")
	case !strings.Contains(string(second.body), p.ID):
		return fmt.Errorf("a second key's 409 does not name the payment %s: %s", p.ID, second.body)
	}
	if again, err := s.do(ctx, http.MethodPost, "/payments", secondKey, body); err != nil {
		return err
	} else if err := replayOf(second, again); err != nil {
		return fmt.Errorf("the second key retried: %w", err)
	}
	if _, err := s.settle(ctx, "/payments/"+p.ID); err != nil {
		return err
	}
	third, err := s.twice(ctx, http.StatusConflict, "order-already-paid", http.MethodPost, "/payments", s.key("pay-once-third"), body)
	if err != nil {
		return fmt.Errorf("a third key once the order is paid: %w", err)
	}
	if !strings.Contains(string(third.body), p.ID) {
		return fmt.Errorf("a third key's 409 does not name the payment %s: %s", p.ID, third.body)
	}
	if later, err := s.do(ctx, http.MethodPost, "/payments", secondKey, body); err != nil {
		return err
	} else if err := replayOf(second, later); err != nil {
		return fmt.Errorf("the second key retried once the order is paid: %w", err)
	}
	final, err := s.want(ctx, http.StatusOK, "", http.MethodPost, "/payments", firstKey, body)
	if err != nil {
		return fmt.Errorf("the first key once its payment succeeded: %w", err)
	}
	if got, err := decode(final); err != nil || got.ID != p.ID {
		return fmt.Errorf("the first key answers %s, want its payment %s", final.body, p.ID)
	}
	return nil
}
