package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/payments"
)

// PaymentRetryAfter is what a pending payment advertises in Retry-After, in
// seconds: a charge usually settles within it.
const PaymentRetryAfter = 1

func (h *handlers) CreatePayment(ctx context.Context, req api.CreatePaymentRequestObject) (api.CreatePaymentResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	unit, claim, err := h.tx(ctx)
	if err != nil {
		return nil, err
	}
	if h.payments == nil {
		return nil, errNoPayments
	}
	p, err := h.payments.Create(ctx, unit, claim, acct, payments.NewPayment{OrderID: req.Body.OrderId, Amount: req.Body.Amount, Currency: req.Body.Currency})
	if err != nil {
		return nil, err
	}
	location, retryAfter := paymentLocation(p), PaymentRetryAfter
	return api.CreatePayment202JSONResponse{
		Body:    toAPIPayment(p),
		Headers: api.CreatePayment202ResponseHeaders{Location: &location, RetryAfter: &retryAfter},
	}, nil
}

// errNoPayments means the service was built without a payment service: a
// wiring bug, answered with 500.
var errNoPayments = errors.New("the service has no payment service")

func (h *handlers) GetPayment(ctx context.Context, req api.GetPaymentRequestObject) (api.GetPaymentResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	if h.payments == nil {
		return nil, errNoPayments
	}
	p, err := h.payments.Get(ctx, acct, req.Id)
	if err != nil {
		return nil, err
	}
	resp := api.GetPayment200JSONResponse{Body: toAPIPayment(p)}
	if !p.Final() {
		retryAfter := PaymentRetryAfter
		resp.Headers.RetryAfter = &retryAfter
	}
	return resp, nil
}

// PaymentOutcome is the response a payment's client key replays once the
// payment is final: 200 with the final payment, rendered by the generated
// code exactly as a handler would write it. It is payments.Config.Render.
func PaymentOutcome(p payments.Payment) (idempotency.Response, error) {
	if !p.Final() {
		return idempotency.Response{}, fmt.Errorf("payment %s is still pending", p.ID)
	}
	location := paymentLocation(p)
	rec := httptest.NewRecorder()
	err := api.CreatePayment200JSONResponse{
		Body:    toAPIPayment(p),
		Headers: api.CreatePayment200ResponseHeaders{Location: &location},
	}.VisitCreatePaymentResponse(rec)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("render payment %s: %w", p.ID, err)
	}
	header := http.Header{}
	for _, name := range idempotency.DefaultReplayHeaders {
		if v := rec.Header().Values(name); len(v) > 0 {
			header[http.CanonicalHeaderKey(name)] = v
		}
	}
	return idempotency.Response{Status: rec.Code, Header: header, Body: rec.Body.Bytes()}, nil
}

func paymentLocation(p payments.Payment) string { return "/payments/" + p.ID.String() }

func toAPIPayment(p payments.Payment) api.Payment {
	out := api.Payment{
		Id:          p.ID.String(),
		OrderId:     p.OrderID.String(),
		Status:      api.PaymentStatus(p.Status),
		Amount:      p.Amount,
		Currency:    p.Currency,
		CreatedAt:   p.CreatedAt,
		CompletedAt: p.CompletedAt,
	}
	if p.FailureReason != "" {
		reason := api.PaymentFailureReason(p.FailureReason)
		out.FailureReason = &reason
	}
	if p.ProviderChargeID != "" {
		out.ProviderChargeId = &p.ProviderChargeID
	}
	return out
}
