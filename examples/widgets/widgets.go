package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/examples/widgets/api"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/idempotency/pgstore"
)

// spec is the document the protocol reads.
//
//go:embed openapi.yaml
var spec []byte

// problemBase prefixes the type URI of every problem this service answers,
// the protocol's (idempotency-key-mismatch, ...) and its own (not-found).
const problemBase = "https://widgets.example/problems/"

// schema is the service's own table. A real service keeps it in its
// migrations; pgstore.Migrate adds the key table beside it.
const schema = `CREATE TABLE IF NOT EXISTS widgets (
	tenant     text        NOT NULL,
	id         uuid        NOT NULL,
	name       text        NOT NULL,
	color      text        NOT NULL,
	paints     integer     NOT NULL DEFAULT 0,
	created_at timestamptz NOT NULL,
	PRIMARY KEY (tenant, id)
)`

// insertWidget is queued in a pgstore.Batch, which runs it after the claim
// in the same transaction. Calling pgstore's guard
// (idempotency_keys_guard(), Store.Guard) makes it insert nothing unless
// its own claim inserted the key row: a replay, a mismatch or a lost race
// writes no widget, and raises no error. ClaimAtCommit takes it when the
// operation is bound, and would refuse it at start-up if it were not so
// guarded.
const insertWidget = `INSERT INTO widgets (tenant, id, name, color, created_at)
SELECT $1, $2, $3, $4, $5 WHERE idempotency_keys_guard()`

const widgetColumns = `id, name, color, paints, created_at`

// migrate creates the widgets table and the key table.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create widgets table: %w", err)
	}
	return pgstore.Migrate(ctx, pool, pgstore.Options{})
}

// service implements the handlers generated from openapi.yaml.
type service struct {
	pool *pgxpool.Pool
	// create only inserts, so it is declared on the deferred store: its
	// claim, its insert and its response reach PostgreSQL in one round
	// trip. paint reads what it writes, so it runs in a transaction.
	create *idempotency.Operation[*pgstore.Batch]
	paint  *idempotency.Operation[pgx.Tx]
}

// newHandler returns the service's routes, with every operation that
// openapi.yaml covers (Idempotency-Key, x-idempotency) under the protocol.
func newHandler(pool *pgxpool.Pool, keys *pgstore.Store) (http.Handler, error) {
	engine := idempotency.New(idempotency.Config{
		Scope:           func(r *http.Request) (string, error) { return tenantOf(r.Context()) },
		ProblemTypeBase: problemBase,
	})
	doc, err := openapi3.NewLoader().LoadFromData(spec)
	if err != nil {
		return nil, fmt.Errorf("load openapi.yaml: %w", err)
	}
	ops, err := oapi.New(doc, engine)
	if err != nil {
		return nil, err
	}
	s := &service{pool: pool}
	deferred, err := keys.ClaimAtCommit(insertWidget)
	if err != nil {
		return nil, err
	}
	if s.create, err = oapi.Bind(ops, "createWidget", deferred); err != nil {
		return nil, err
	}
	if s.paint, err = oapi.Bind(ops, "paintWidget", keys); err != nil {
		return nil, err
	}
	protocol, err := ops.Middleware(nil) // fails if a covered operation is left unbound
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(authenticate)
	strict := api.NewStrictHandlerWithOptions(s, nil, api.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  badRequest,
		ResponseErrorHandlerFunc: writeProblem,
	})
	// The protocol runs once chi has routed a request and before the
	// generated code binds its parameters (see package oapi).
	api.HandlerWithOptions(strict, api.ChiServerOptions{BaseRouter: r.With(protocol), ErrorHandlerFunc: badRequest})
	return r, nil
}

// CreateWidget queues the widget's insert in the claim's Batch and answers
// with the widget: the engine stores that answer with the insert, or
// neither, and replays it to every repeat of the request.
func (s *service) CreateWidget(ctx context.Context, req api.CreateWidgetRequestObject) (api.CreateWidgetResponseObject, error) {
	if detail := invalid(req.Body.Name, req.Body.Color); detail != "" {
		return api.CreateWidget400ApplicationProblemPlusJSONResponse{BadRequestApplicationProblemPlusJSONResponse: badBody(detail)}, nil
	}
	batch, ok := s.create.Unit(ctx)
	if !ok {
		return nil, errors.New("createWidget ran without its idempotency middleware")
	}
	w := api.Widget{
		Id: uuid.New(), Name: req.Body.Name, Color: req.Body.Color,
		// Microseconds, as PostgreSQL keeps it, so GET shows what POST said.
		CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
	}
	// Exec only queues: the insert runs at the lease's commit. The claim's
	// scope is the tenant (Config.Scope).
	if _, err := batch.Exec(ctx, insertWidget, batch.Ref().Scope, w.Id, w.Name, w.Color, w.CreatedAt); err != nil {
		return nil, err
	}
	location := "/widgets/" + w.Id.String()
	return api.CreateWidget201JSONResponse{Body: w, Headers: api.CreateWidget201ResponseHeaders{Location: &location}}, nil
}

// PaintWidget repaints a widget and counts it, in the claim's transaction,
// and answers with the widget as the update left it. A 404 is an outcome
// too: a retry of the same request replays it.
func (s *service) PaintWidget(ctx context.Context, req api.PaintWidgetRequestObject) (api.PaintWidgetResponseObject, error) {
	if detail := invalid("-", req.Body.Color); detail != "" {
		return api.PaintWidget400ApplicationProblemPlusJSONResponse{BadRequestApplicationProblemPlusJSONResponse: badBody(detail)}, nil
	}
	tx, ok := s.paint.Unit(ctx)
	if !ok {
		return nil, errors.New("paintWidget ran without its idempotency middleware")
	}
	tenant, _ := tenantOf(ctx)
	w, err := scanWidget(tx.QueryRow(ctx, `UPDATE widgets SET color = $3, paints = paints + 1
		WHERE tenant = $1 AND id = $2 RETURNING `+widgetColumns, tenant, req.Id, req.Body.Color))
	if errors.Is(err, pgx.ErrNoRows) {
		return api.PaintWidget404ApplicationProblemPlusJSONResponse{NotFoundApplicationProblemPlusJSONResponse: notFound(req.Id)}, nil
	}
	if err != nil {
		return nil, pgstore.Translate(err) // a 5xx: rolled back, and the key stays free
	}
	return api.PaintWidget200JSONResponse(w), nil
}

// GetWidget is safe, so no key and no protocol: it reads the pool.
func (s *service) GetWidget(ctx context.Context, req api.GetWidgetRequestObject) (api.GetWidgetResponseObject, error) {
	tenant, _ := tenantOf(ctx)
	w, err := scanWidget(s.pool.QueryRow(ctx, `SELECT `+widgetColumns+` FROM widgets WHERE tenant = $1 AND id = $2`, tenant, req.Id))
	if errors.Is(err, pgx.ErrNoRows) {
		return api.GetWidget404ApplicationProblemPlusJSONResponse{NotFoundApplicationProblemPlusJSONResponse: notFound(req.Id)}, nil
	}
	if err != nil {
		return nil, pgstore.Translate(err)
	}
	return api.GetWidget200JSONResponse(w), nil
}

func scanWidget(row pgx.Row) (api.Widget, error) {
	var w api.Widget
	err := row.Scan(&w.Id, &w.Name, &w.Color, &w.Paints, &w.CreatedAt)
	w.CreatedAt = w.CreatedAt.UTC()
	return w, err
}

// invalid checks what the spec says of a name and a color, which the
// generated code does not: a 400 stores nothing, so the key stays free.
func invalid(name, color string) string {
	switch {
	case strings.TrimSpace(name) == "" || len(name) > 100:
		return "name must be 1 to 100 characters"
	case strings.TrimSpace(color) == "" || len(color) > 32:
		return "color must be 1 to 32 characters"
	}
	return ""
}

type tenantKey struct{}

// authenticate takes the tenant from "Authorization: Bearer <tenant>". A
// real service verifies a token here; the tenant it names scopes both the
// widgets and the Idempotency-Keys, so two tenants' keys never meet.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tenant == "" || len(tenant) > 64 {
			writeProblem(w, r, idempotency.ErrNoScope)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

func tenantOf(ctx context.Context) (string, error) {
	if tenant, ok := ctx.Value(tenantKey{}).(string); ok {
		return tenant, nil
	}
	return "", idempotency.ErrNoScope
}

// writeProblem answers the protocol's errors and the handlers' failures
// (a 500 whose details stay in the log, a 503 to retry with the same key).
var writeProblem = idempotency.ProblemWriter(problemBase)

// badRequest answers a request the generated code could not bind (the
// protocol has checked its Idempotency-Key before).
func badRequest(w http.ResponseWriter, _ *http.Request, err error) {
	p := badBody(err.Error())
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func badBody(detail string) api.BadRequestApplicationProblemPlusJSONResponse {
	return api.BadRequestApplicationProblemPlusJSONResponse{Type: problemBase + "invalid-request",
		Title: "The request is invalid", Status: http.StatusBadRequest, Detail: &detail}
}

func notFound(id uuid.UUID) api.NotFoundApplicationProblemPlusJSONResponse {
	detail := "this tenant has no widget " + id.String()
	return api.NotFoundApplicationProblemPlusJSONResponse{Type: problemBase + "not-found",
		Title: "No such widget", Status: http.StatusNotFound, Detail: &detail}
}
