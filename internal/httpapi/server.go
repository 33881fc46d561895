// Package httpapi is the HTTP face of the service: the chi router generated
// from openapi.yaml, the gate that enforces the contract before handlers
// run, the idempotency middleware on unsafe operations, thin handlers, and
// the one mapping from errors to problem responses.
package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/docspage"
	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/ledger"
	"github.com/oncekey/oncekey/internal/metrics"
	"github.com/oncekey/oncekey/internal/orders"
	"github.com/oncekey/oncekey/internal/payments"
	"github.com/oncekey/oncekey/internal/problem"
	"github.com/oncekey/oncekey/internal/tracing"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxBodyBytes   = 1 << 20
	DefaultRequestTimeout = 10 * time.Second
)

// Config is what the HTTP layer is built from.
type Config struct {
	Orders      *orders.Service
	Payments    *payments.Service
	Ledger      *ledger.Service
	Auth        auth.Store
	Idempotency idempotency.Store
	// Ready reports whether dependencies answer (GET /readyz).
	Ready func(context.Context) error
	// TTL and Wait configure the idempotency protocol (see idempotency.Config).
	TTL  time.Duration
	Wait time.Duration
	// MaxBodyBytes bounds request bodies (default 1 MiB); larger ones get 413.
	MaxBodyBytes int64
	// RequestTimeout bounds each request's work, database calls included
	// (default 10s): past it the request fails with 503 instead of hanging.
	RequestTimeout time.Duration
	Logger         *slog.Logger
	// Metrics receives request and idempotency metrics and is served at
	// GET /metrics (default: a fresh set).
	Metrics *metrics.Metrics
	// Tracing wraps the handler in OpenTelemetry spans (exported by the
	// global tracer provider; see internal/tracing).
	Tracing bool
	// WithoutIdempotency leaves the idempotency middleware out, so unsafe
	// operations run on every request. It exists only for the benchmark's
	// baseline (cmd/bench), which measures the protocol's cost against the
	// same handler without it; serve never sets it.
	WithoutIdempotency bool
}

// New builds the service's http.Handler.
func New(cfg Config) (http.Handler, error) {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Ready == nil {
		cfg.Ready = func(context.Context) error { return nil }
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	doc, err := LoadSpec()
	if err != nil {
		return nil, err
	}
	g, err := newGate(doc, cfg.Auth, cfg.MaxBodyBytes, cfg.Logger)
	if err != nil {
		return nil, err
	}
	idem := idempotency.New(idempotency.Config{
		Store:    cfg.Idempotency,
		Account:  auth.AccountFrom,
		Route:    func(r *http.Request) string { return chi.RouteContext(r.Context()).RoutePattern() },
		TTL:      cfg.TTL,
		Wait:     cfg.Wait,
		Logger:   cfg.Logger,
		Observer: cfg.Metrics,
		// Creating an order only inserts it: its claim can wait for its
		// commit, one round trip in all. Payments (which enqueue a job) and
		// bonus debits (which read the balance) claim first.
		Deferrable: func(op string) bool { return op == "POST /orders" },
		Refuse:     refuseBody,
	})
	errs := errorResponder{log: cfg.Logger}

	r := chi.NewRouter()
	r.Use(middleware.RequestID, observe(cfg.Logger, cfg.Metrics), recoverer(cfg.Logger), timeout(cfg.RequestTimeout), g.handler)
	notFound := func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, problem.NotFound, "no such endpoint: "+r.URL.Path)
	}
	r.NotFound(notFound)
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// RFC 9110 §15.5.6: a 405 lists the methods the resource has.
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if r.Match(chi.NewRouteContext(), m, req.URL.Path) {
				w.Header().Add("Allow", m)
			}
		}
		problem.Write(w, problem.MethodNotAllowed, req.Method+" is not allowed on "+req.URL.Path)
	})
	// The docs page's static files are not API operations and stay out of
	// the contract.
	assets := docspage.Assets(notFound)
	r.Get("/docs/assets/*", assets.ServeHTTP)
	r.Head("/docs/assets/*", assets.ServeHTTP)
	// Operational, not part of the API contract: scrape it from inside the
	// network (docs/operations.md).
	r.Method(http.MethodGet, "/metrics", cfg.Metrics.Handler())
	// The last is the outermost: the body's schema is checked inside the
	// idempotency layer, only when the operation is about to run (see gate).
	middlewares := []api.MiddlewareFunc{validateBody, idem.Handler}
	if cfg.WithoutIdempotency {
		middlewares = middlewares[:1]
	}
	strict := api.NewStrictHandlerWithOptions(&handlers{orders: cfg.Orders, payments: cfg.Payments, ledger: cfg.Ledger, ready: cfg.Ready}, nil, api.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  errs.request,
		ResponseErrorHandlerFunc: errs.response,
	})
	handler := api.HandlerWithOptions(strict, api.ChiServerOptions{
		BaseRouter: r,
		// Registered per operation, after routing, so it sees the route
		// pattern and the raw body bytes.
		Middlewares:      middlewares,
		ErrorHandlerFunc: errs.request,
	})
	if cfg.Tracing {
		// The span is named "HTTP" here and renamed to method and route
		// once routing has matched (in observe).
		handler = otelhttp.NewHandler(handler, "HTTP")
	}
	return handler, nil
}

// LoadSpec parses and validates the embedded openapi.yaml.
func LoadSpec() (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(bytes.Clone(oncekey.OpenAPISpec))
	if err != nil {
		return nil, fmt.Errorf("load openapi.yaml: %w", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, fmt.Errorf("openapi.yaml is invalid: %w", err)
	}
	return doc, nil
}

// requestInfo is filled in as a request travels down the stack and read
// by observe when it comes back: the route (from the contract gate, or
// chi's pattern once routed) and the idempotency outcome.
type requestInfo struct {
	route   string
	outcome idempotency.Outcome
}

type requestInfoKey struct{}

func setRoute(ctx context.Context, route string) {
	if info, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		info.route = route
	}
}

// observe writes one structured log line per request and records its
// metrics. It never logs the API key or the body.
func observe(log *slog.Logger, m *metrics.Metrics) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			info := &requestInfo{}
			ctx := context.WithValue(r.Context(), requestInfoKey{}, info)
			r = r.WithContext(idempotency.WithOutcome(ctx, &info.outcome))
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			next.ServeHTTP(ww, r)
			if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" && rc.RoutePattern() != "/*" {
				info.route = rc.RoutePattern()
			}
			elapsed := time.Since(start)
			m.ObserveHTTP(info.route, r.Method, ww.Status(), elapsed)
			if info.outcome == idempotency.OutcomeNone && info.route != "" && idempotency.Unsafe(r.Method) {
				// Refused by the gate (auth, contract, size) before the
				// idempotency layer saw it: no key was consumed.
				info.outcome = idempotency.OutcomeRejected
				if ww.Status() >= 500 {
					info.outcome = idempotency.OutcomeError
				}
				m.Outcome(idempotency.Operation(r.Method, info.route), info.outcome)
			}
			attrs := []any{
				"request_id", middleware.GetReqID(r.Context()),
				"method", r.Method,
				"route", info.route,
				"status", ww.Status(),
				"bytes", ww.BytesWritten(),
				"duration_ms", float64(elapsed.Microseconds()) / 1000,
			}
			span := trace.SpanFromContext(r.Context())
			if info.route != "" {
				span.SetName(idempotency.Operation(r.Method, info.route))
				span.SetAttributes(semconv.HTTPRoute(info.route))
			}
			if info.outcome != idempotency.OutcomeNone {
				attrs = append(attrs, "idempotency", string(info.outcome))
				tracing.SetOutcome(r.Context(), string(info.outcome))
			}
			log.InfoContext(r.Context(), "request", attrs...)
		})
	}
}

// recoverer turns a panic into a 500 problem. The idempotency layer has
// already rolled back by then (its deferred rollback runs during the panic),
// so nothing was stored and a retry runs the operation.
func recoverer(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				v := recover()
				if v == nil {
					return
				}
				if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(v) // the server's own signal to drop the connection
				}
				log.ErrorContext(r.Context(), "panic", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				problem.Write(w, problem.Internal, "the request could not be completed; if it carried an Idempotency-Key, retrying with the same key is safe")
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// timeout bounds a request's context; pgx honours it, so a database that
// stops answering turns into a 503, not a hung request.
func timeout(d time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), d)
			defer cancel()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}
