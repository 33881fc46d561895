package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/gen/apiserver"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/store"
)

// PaymentRetryAfter is what a pending payment advertises in Retry-After, in
// seconds: a charge usually settles within it.
const PaymentRetryAfter = 1

func (h *handlers) CreatePayment(ctx context.Context, req apiserver.CreatePaymentRequestObject) (apiserver.CreatePaymentResponseObject, error) {
	c, err := callFrom[store.Tx](ctx)
	if err != nil {
		return nil, err
	}
	if h.payments == nil {
		return nil, errNoPayments
	}
	p, err := h.payments.Create(ctx, c.unit, c.account, payments.NewPayment{OrderID: req.Body.OrderId, Amount: req.Body.Amount, Currency: req.Body.Currency})
	if err != nil {
		return nil, err
	}
	location, retryAfter := paymentLocation(p), PaymentRetryAfter
	return apiserver.CreatePayment202JSONResponse{
		Body:    toAPIPayment(p),
		Headers: apiserver.CreatePayment202ResponseHeaders{Location: &location, RetryAfter: &retryAfter},
	}, nil
}

// errNoPayments means the service was built without a payment service: a
// wiring bug, answered with 500.
var errNoPayments = errors.New("the service has no payment service")

func (h *handlers) GetPayment(ctx context.Context, req apiserver.GetPaymentRequestObject) (apiserver.GetPaymentResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	if h.payments == nil {
		return nil, errNoPayments
	}
	p, err := h.payments.Get(consistent(ctx, req.Params.Consistency), acct, req.Id)
	if err != nil {
		return nil, err
	}
	resp := apiserver.GetPayment200JSONResponse{Body: toAPIPayment(p)}
	if !p.Final() {
		retryAfter := PaymentRetryAfter
		resp.Headers.RetryAfter = &retryAfter
	}
	return resp, nil
}

// PaymentOutcome is the response a payment's client key replays once the
// payment is final: 200 with the final payment, rendered by the generated
// code exactly as a handler would write it. It is payments.WorkerConfig.Render.
func PaymentOutcome(p payments.Payment) (idempotency.Response, error) {
	if !p.Final() {
		return idempotency.Response{}, fmt.Errorf("payment %s is still pending", p.ID)
	}
	location := paymentLocation(p)
	return recorded(func(w http.ResponseWriter) error {
		return apiserver.CreatePayment200JSONResponse{
			Body:    toAPIPayment(p),
			Headers: apiserver.CreatePayment200ResponseHeaders{Location: &location},
		}.VisitCreatePaymentResponse(w)
	})
}

// RefundOutcome is PaymentOutcome for a refund: payments.WorkerConfig.RenderRefund.
func RefundOutcome(r payments.Refund) (idempotency.Response, error) {
	if !r.Final() {
		return idempotency.Response{}, fmt.Errorf("refund %s is still pending", r.ID)
	}
	location := refundLocation(r)
	return recorded(func(w http.ResponseWriter) error {
		return apiserver.CreateRefund200JSONResponse{
			Body:    toAPIRefund(r),
			Headers: apiserver.CreateRefund200ResponseHeaders{Location: &location},
		}.VisitCreateRefundResponse(w)
	})
}

// recorded is the response visit writes, as the key stores it: status,
// the replayed headers and the body.
func recorded(visit func(http.ResponseWriter) error) (idempotency.Response, error) {
	rec := httptest.NewRecorder()
	if err := visit(rec); err != nil {
		return idempotency.Response{}, fmt.Errorf("render the final response: %w", err)
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

func (h *handlers) CreateRefund(ctx context.Context, req apiserver.CreateRefundRequestObject) (apiserver.CreateRefundResponseObject, error) {
	c, err := callFrom[store.Tx](ctx)
	if err != nil {
		return nil, err
	}
	if h.payments == nil {
		return nil, errNoPayments
	}
	r, err := h.payments.CreateRefund(ctx, c.unit, c.account, req.Id, payments.NewRefund{Amount: req.Body.Amount, Reason: req.Body.Reason})
	if err != nil {
		return nil, err
	}
	location, retryAfter := refundLocation(r), PaymentRetryAfter
	return apiserver.CreateRefund202JSONResponse{
		Body:    toAPIRefund(r),
		Headers: apiserver.CreateRefund202ResponseHeaders{Location: &location, RetryAfter: &retryAfter},
	}, nil
}

func (h *handlers) GetRefund(ctx context.Context, req apiserver.GetRefundRequestObject) (apiserver.GetRefundResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	if h.payments == nil {
		return nil, errNoPayments
	}
	r, err := h.payments.GetRefund(consistent(ctx, req.Params.Consistency), acct, req.Id)
	if err != nil {
		return nil, err
	}
	resp := apiserver.GetRefund200JSONResponse{Body: toAPIRefund(r)}
	if !r.Final() {
		retryAfter := PaymentRetryAfter
		resp.Headers.RetryAfter = &retryAfter
	}
	return resp, nil
}

func (h *handlers) ListRefunds(ctx context.Context, req apiserver.ListRefundsRequestObject) (apiserver.ListRefundsResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	if h.payments == nil {
		return nil, errNoPayments
	}
	list, err := h.payments.ListRefunds(consistent(ctx, req.Params.Consistency), acct, req.Id)
	if err != nil {
		return nil, err
	}
	out := apiserver.ListRefunds200JSONResponse{Items: make([]api.Refund, 0, len(list))}
	for _, r := range list {
		out.Items = append(out.Items, toAPIRefund(r))
	}
	return out, nil
}

func refundLocation(r payments.Refund) string { return "/refunds/" + r.ID.String() }

func toAPIRefund(r payments.Refund) api.Refund {
	out := api.Refund{
		Id:          r.ID.String(),
		PaymentId:   r.PaymentID.String(),
		Status:      api.RefundStatus(r.Status),
		Amount:      r.Amount,
		Currency:    r.Currency,
		Reason:      r.Reason,
		CreatedAt:   r.CreatedAt,
		CompletedAt: r.CompletedAt,
	}
	if r.FailureReason != "" {
		reason := api.RefundFailureReason(r.FailureReason)
		out.FailureReason = &reason
	}
	if r.ProviderRefundID != "" {
		out.ProviderRefundId = &r.ProviderRefundID
	}
	return out
}
