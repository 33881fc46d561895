package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/gen/apiserver"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/service/docspage"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/store"
)

// handlers implements the generated strict server. Each method takes its
// call (the caller and, for an idempotent operation, its unit of work)
// from the request, calls the domain and maps the result; errors go to the
// one table that turns them into problems (problemWriter).
type handlers struct {
	orders   *orders.Service
	payments *payments.Service
	ledger   *ledger.Service
	ready    func(context.Context) error
}

var _ apiserver.StrictServerInterface = (*handlers)(nil)

// bind declares how each operation of openapi.yaml that takes an
// Idempotency-Key commits, and returns each one's protocol for the front
// door. Creating an order only writes: its claim waits for its commit,
// with its writes, in one round trip. Every other one reads as it writes
// (a payment reads its order, a debit the balance), in the transaction
// that claims its key.
func bind(ops *oapi.Operations, keys idempotency.Store[store.Tx], deferredKeys idempotency.Store[store.Deferred]) (map[string]protocol, error) {
	createOrder, err := oapi.Bind(ops, "createOrder", deferredKeys)
	if err != nil {
		return nil, err
	}
	protocols := map[string]protocol{"createOrder": underProtocol(createOrder)}
	for id, op := range oapi.BindRest(ops, keys) {
		protocols[id] = underProtocol(op)
	}
	return protocols, nil
}

// account is the authenticated caller of a read, in ctx.
func account(ctx context.Context) (uuid.UUID, error) {
	c, err := callFrom[noUnit](ctx)
	return c.account, err
}

// orderWriter is the caller of the order creation in ctx, and the writes
// it creates the order through.
func (h *handlers) orderWriter(ctx context.Context) (uuid.UUID, orders.Writer, error) {
	c, err := callFrom[store.Deferred](ctx)
	if err != nil {
		return uuid.Nil, nil, err
	}
	return c.account, c.unit, nil
}

// errNoUnit means an idempotent operation ran outside the protocol: a
// wiring bug, answered with 500.
var errNoUnit = errors.New("operation reached without the unit of work of its claim")

func (h *handlers) CreateOrder(ctx context.Context, req apiserver.CreateOrderRequestObject) (apiserver.CreateOrderResponseObject, error) {
	acct, w, err := h.orderWriter(ctx)
	if err != nil {
		return nil, err
	}
	in := orders.NewOrder{Amount: req.Body.Amount, Currency: req.Body.Currency, Items: fromAPIItems(req.Body.Items)}
	o, err := h.orders.Create(ctx, w, acct, in)
	if err != nil {
		return nil, err
	}
	location := "/orders/" + o.ID.String()
	return apiserver.CreateOrder201JSONResponse{
		Body:    toAPIOrder(o),
		Headers: apiserver.CreateOrder201ResponseHeaders{Location: &location},
	}, nil
}

func (h *handlers) GetOrder(ctx context.Context, req apiserver.GetOrderRequestObject) (apiserver.GetOrderResponseObject, error) {
	acct, err := account(ctx)
	if err != nil {
		return nil, err
	}
	o, err := h.orders.Get(consistent(ctx, req.Params.Consistency), acct, req.Id)
	if err != nil {
		return nil, err
	}
	return apiserver.GetOrder200JSONResponse(toAPIOrder(o)), nil
}

func (h *handlers) UpdateOrder(ctx context.Context, req apiserver.UpdateOrderRequestObject) (apiserver.UpdateOrderResponseObject, error) {
	c, err := callFrom[store.Tx](ctx)
	if err != nil {
		return nil, err
	}
	patch := orders.Patch{Amount: req.Body.Amount, Currency: req.Body.Currency}
	if req.Body.Items != nil {
		items := fromAPIItems(*req.Body.Items)
		patch.Items = &items
	}
	o, err := h.orders.Update(ctx, c.unit, c.account, req.Id, patch)
	if err != nil {
		return nil, err
	}
	return apiserver.UpdateOrder200JSONResponse{Body: toAPIOrder(o)}, nil
}

func (h *handlers) CancelOrder(ctx context.Context, req apiserver.CancelOrderRequestObject) (apiserver.CancelOrderResponseObject, error) {
	c, err := callFrom[store.Tx](ctx)
	if err != nil {
		return nil, err
	}
	o, err := h.orders.Cancel(ctx, c.unit, c.account, req.Id)
	if err != nil {
		return nil, err
	}
	return apiserver.CancelOrder200JSONResponse{Body: toAPIOrder(o)}, nil
}

// DefaultPageSize matches the default in openapi.yaml.
const DefaultPageSize = 20

func (h *handlers) ListOrders(ctx context.Context, req apiserver.ListOrdersRequestObject) (apiserver.ListOrdersResponseObject, error) {
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
	page, err := h.orders.List(consistent(ctx, req.Params.Consistency), acct, cursor, limit)
	if err != nil {
		return nil, err
	}
	out := apiserver.ListOrders200JSONResponse{Items: make([]api.Order, 0, len(page.Orders))}
	for _, o := range page.Orders {
		out.Items = append(out.Items, toAPIOrder(o))
	}
	if page.Next != "" {
		out.NextCursor = &page.Next
	}
	return out, nil
}

func (h *handlers) GetHealth(context.Context, apiserver.GetHealthRequestObject) (apiserver.GetHealthResponseObject, error) {
	return apiserver.GetHealth200JSONResponse{Status: "ok"}, nil
}

func (h *handlers) GetReadiness(ctx context.Context, _ apiserver.GetReadinessRequestObject) (apiserver.GetReadinessResponseObject, error) {
	if err := h.ready(ctx); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotReady, err)
	}
	return apiserver.GetReadiness200JSONResponse{Status: "ok"}, nil
}

func (h *handlers) GetDocs(context.Context, apiserver.GetDocsRequestObject) (apiserver.GetDocsResponseObject, error) {
	page := docspage.HTML()
	csp := docspage.ContentSecurityPolicy
	return apiserver.GetDocs200TexthtmlResponse{
		Body:          bytes.NewReader(page),
		ContentLength: int64(len(page)),
		Headers:       apiserver.GetDocs200ResponseHeaders{ContentSecurityPolicy: &csp},
	}, nil
}

func (h *handlers) GetSpec(context.Context, apiserver.GetSpecRequestObject) (apiserver.GetSpecResponseObject, error) {
	return apiserver.GetSpec200ApplicationyamlResponse{
		Body:          bytes.NewReader(oncekey.OpenAPISpec),
		ContentLength: int64(len(oncekey.OpenAPISpec)),
	}, nil
}

func fromAPIItems(items []api.OrderItem) []orders.Item {
	out := make([]orders.Item, 0, len(items))
	for _, it := range items {
		out = append(out, orders.Item{SKU: it.Sku, Qty: it.Qty})
	}
	return out
}

func toAPIOrder(o orders.Order) api.Order {
	items := make([]api.OrderItem, 0, len(o.Items))
	for _, it := range o.Items {
		items = append(items, api.OrderItem{Sku: it.SKU, Qty: it.Qty})
	}
	return api.Order{
		Id:          o.ID.String(),
		Status:      api.OrderStatus(o.Status),
		Amount:      o.Amount,
		Currency:    o.Currency,
		Items:       items,
		CreatedAt:   o.CreatedAt,
		CancelledAt: o.CancelledAt,
	}
}

// consistent is ctx with its reads on the primary when the request's
// Consistency header says strong, so that a client reads its own writes
// where reads may come from a replica.
func consistent[C ~string](ctx context.Context, c *C) context.Context {
	if c != nil && *c == "strong" {
		return store.Strong(ctx)
	}
	return ctx
}
