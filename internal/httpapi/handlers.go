package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/docspage"
	"github.com/oncekey/oncekey/internal/ledger"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
)

// handlers implements the generated strict server. Each method takes the
// caller from the context, calls the domain and maps the result; errors go
// to errorResponder.response, the one place that turns them into problems.
type handlers struct {
	orders   *orders.Service
	payments *payments.Service
	ledger   *ledger.Service
	ready    func(context.Context) error
}

var _ api.StrictServerInterface = (*handlers)(nil)

// errNotReady makes /readyz answer 503.
var errNotReady = errors.New("not ready")

// errNoAccount means a protected operation ran without an authenticated
// caller: a wiring bug, answered with 500.
var errNoAccount = errors.New("operation reached without an authenticated account")

func account(ctx context.Context) (uuid.UUID, error) {
	id, ok := auth.AccountFrom(ctx)
	if !ok {
		return uuid.UUID{}, errNoAccount
	}
	return id, nil
}

func (h *handlers) CreateOrder(ctx context.Context, req api.CreateOrderRequestObject) (api.CreateOrderResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	in := orders.NewOrder{Amount: req.Body.Amount, Currency: req.Body.Currency}
	for _, it := range req.Body.Items {
		in.Items = append(in.Items, orders.Item{SKU: it.Sku, Qty: it.Qty})
	}
	o, err := h.orders.Create(ctx, acct, in)
	if err != nil {
		return nil, err
	}
	location := "/orders/" + o.ID.String()
	return api.CreateOrder201JSONResponse{
		Body:    toAPIOrder(o),
		Headers: api.CreateOrder201ResponseHeaders{Location: &location},
	}, nil
}

func (h *handlers) GetOrder(ctx context.Context, req api.GetOrderRequestObject) (api.GetOrderResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	o, err := h.orders.Get(ctx, acct, req.Id)
	if err != nil {
		return nil, err
	}
	return api.GetOrder200JSONResponse(toAPIOrder(o)), nil
}

// DefaultPageSize matches the default in openapi.yaml.
const DefaultPageSize = 20

func (h *handlers) ListOrders(ctx context.Context, req api.ListOrdersRequestObject) (api.ListOrdersResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	limit := DefaultPageSize
	if req.Params.Limit != nil {
		limit = *req.Params.Limit
	}
	cursor := ""
	if req.Params.Cursor != nil {
		cursor = *req.Params.Cursor
	}
	page, err := h.orders.List(ctx, acct, cursor, limit)
	if err != nil {
		return nil, err
	}
	out := api.ListOrders200JSONResponse{Items: make([]api.Order, 0, len(page.Orders))}
	for _, o := range page.Orders {
		out.Items = append(out.Items, toAPIOrder(o))
	}
	if page.Next != "" {
		out.NextCursor = &page.Next
	}
	return out, nil
}

func (h *handlers) GetHealth(context.Context, api.GetHealthRequestObject) (api.GetHealthResponseObject, error) {
	return api.GetHealth200JSONResponse{Status: "ok"}, nil
}

func (h *handlers) GetReadiness(ctx context.Context, _ api.GetReadinessRequestObject) (api.GetReadinessResponseObject, error) {
	if err := h.ready(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotReady, err)
	}
	return api.GetReadiness200JSONResponse{Status: "ok"}, nil
}

func (h *handlers) GetDocs(context.Context, api.GetDocsRequestObject) (api.GetDocsResponseObject, error) {
	page := docspage.HTML()
	csp := docspage.ContentSecurityPolicy
	return api.GetDocs200TexthtmlResponse{
		Body:          bytes.NewReader(page),
		ContentLength: int64(len(page)),
		Headers:       api.GetDocs200ResponseHeaders{ContentSecurityPolicy: &csp},
	}, nil
}

func (h *handlers) GetSpec(context.Context, api.GetSpecRequestObject) (api.GetSpecResponseObject, error) {
	return api.GetSpec200ApplicationyamlResponse{
		Body:          bytes.NewReader(oncekey.OpenAPISpec),
		ContentLength: int64(len(oncekey.OpenAPISpec)),
	}, nil
}

func toAPIOrder(o orders.Order) api.Order {
	items := make([]api.OrderItem, 0, len(o.Items))
	for _, it := range o.Items {
		items = append(items, api.OrderItem{Sku: it.SKU, Qty: it.Qty})
	}
	return api.Order{
		Id:        o.ID.String(),
		Status:    api.OrderStatus(o.Status),
		Amount:    o.Amount,
		Currency:  o.Currency,
		Items:     items,
		CreatedAt: o.CreatedAt,
	}
}
