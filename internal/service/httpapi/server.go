// Package httpapi is the HTTP face of the service: the chi router generated
// from openapi.yaml, the front door that enforces the contract and runs the
// idempotency protocol on the operations that declare an Idempotency-Key,
// thin handlers, and the one table from errors to problem responses.
package httpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/gen/apiserver"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/buildinfo"
	"github.com/oncekey/oncekey/internal/service/docspage"
	"github.com/oncekey/oncekey/internal/service/ledger"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/tracing"
)

// Defaults for Config fields left zero.
const (
	// DefaultMaxBodyBytes is about seven times the largest body the
	// contract allows (an order of 100 items: under 10 KB), so that no
	// caller makes the server read, and canonicalise, a megabyte.
	DefaultMaxBodyBytes   = 64 << 10
	DefaultRequestTimeout = 10 * time.Second
)

// Config is what the HTTP layer is built from. Backend is required.
type Config struct {
	Backend store.Backend
	// Reads serves the read operations (default: the backend); a replica
	// in front of it (postgres.Replica) serves reads that may lag.
	Reads store.Reads
	// Keys and DeferredKeys claim the keys of the operations that read as they
	// write and of those that only write (default: the backend's), so that
	// a record cache or the Redis fast path can go in front.
	Keys         idempotency.Store[store.Tx]
	DeferredKeys idempotency.Store[store.Deferred]
	// Auth finds the caller by API key (default: the backend).
	Auth auth.Store
	// Payments is the payment service, reading through Reads (default:
	// none; POST /payments then fails with a 500).
	Payments *payments.Service
	// Ready reports whether dependencies answer (GET /readyz; default: the
	// backend's Ready).
	Ready func(context.Context) error
	// TTL and Wait configure the idempotency protocol (see
	// idempotency.Config).
	TTL  time.Duration
	Wait time.Duration
	// RepeatWindow and RefuseRepeats spot, and refuse, a request sent
	// again under a new key (see idempotency.Config).
	RepeatWindow  time.Duration
	RefuseRepeats bool
	// MaxBodyBytes bounds request bodies (default 64 KiB); larger ones get 413.
	MaxBodyBytes int64
	// RequestTimeout bounds each request's work, database calls included
	// (default 10s): past it the request fails with 503 instead of hanging.
	RequestTimeout time.Duration
	Logger         *slog.Logger
	// Metrics receives request and idempotency metrics and is served at
	// GET /metrics (default: a fresh set).
	Metrics *metrics.Metrics
	// HideMetrics leaves GET /metrics off the API's router, for a service
	// that serves it on an internal listener instead.
	HideMetrics bool
	// Tracing wraps the handler in OpenTelemetry spans (exported by the
	// global tracer provider; see internal/service/tracing).
	Tracing bool
}

// New builds the service's http.Handler.
func New(cfg Config) (http.Handler, error) {
	if cfg.Backend == nil {
		return nil, errors.New("httpapi: no backend")
	}
	if cfg.Keys == nil {
		cfg.Keys = cfg.Backend.Keys()
	}
	if cfg.DeferredKeys == nil {
		cfg.DeferredKeys = cfg.Backend.DeferredKeys()
	}
	if cfg.Reads == nil {
		cfg.Reads = cfg.Backend
	}
	if cfg.Auth == nil {
		cfg.Auth = cfg.Backend
	}
	if cfg.Ready == nil {
		cfg.Ready = cfg.Backend.Ready
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	doc, err := LoadSpec()
	if err != nil {
		return nil, err
	}
	problems := problemWriter{log: cfg.Logger}
	spec := newContract(doc)
	engine := idempotency.New(idempotency.Config{
		Route:         routePattern,
		TTL:           cfg.TTL,
		Wait:          cfg.Wait,
		RepeatWindow:  cfg.RepeatWindow,
		RefuseRepeats: cfg.RefuseRepeats,
		WriteError:    problems.write,
		Logger:        cfg.Logger,
		Observer:      cfg.Metrics,
	})
	ops, err := oapi.New(doc, engine)
	if err != nil {
		return nil, err
	}
	for _, op := range ops.Covered() {
		cfg.Metrics.Operations(idempotency.OperationName(op.Method, op.Path))
	}
	spec.keyParsed(ops.Covered())
	h := &handlers{
		orders: orders.NewService(cfg.Reads), payments: cfg.Payments, ledger: ledger.NewService(cfg.Reads),
		ready: cfg.Ready,
	}
	protocols, err := bind(ops, cfg.Keys, cfg.DeferredKeys)
	if err != nil {
		return nil, err
	}
	front := &frontDoor{ops: ops, contract: spec, auth: cfg.Auth, maxBody: cfg.MaxBodyBytes, log: cfg.Logger,
		problems: problems, protocols: protocols}

	r := chi.NewRouter()
	r.Use(secure, observe(cfg.Logger, cfg.Metrics), recoverer(cfg.Logger, problems), timeout(cfg.RequestTimeout))
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		problems.write(w, req, fmt.Errorf("%w: %s", errNoEndpoint, req.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		// RFC 9110 §15.5.6: a 405 lists the methods the resource has.
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			if r.Match(chi.NewRouteContext(), m, req.URL.Path) {
				w.Header().Add("Allow", m)
			}
		}
		problems.write(w, req, fmt.Errorf("%w: %s is not allowed on %s", errMethodNotAllowed, req.Method, req.URL.Path))
	})
	// The docs page's static files are not API operations and stay out of
	// the contract.
	assets := docspage.Assets(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		problems.write(w, req, fmt.Errorf("%w: %s", errNoEndpoint, req.URL.Path))
	}))
	r.Get("/docs/assets/*", assets.ServeHTTP)
	r.Head("/docs/assets/*", assets.ServeHTTP)
	// Nor are the home page, for whoever opens the service's address in a
	// browser, and /docs/, the spelling of /docs that people and tools add
	// a slash to: it moves there for good, query and all.
	home := homePage(doc.Info.Version)
	r.Get("/", home)
	r.Head("/", home)
	r.Get("/docs/", toDocs)
	r.Head("/docs/", toDocs)
	// Operational, not part of the API contract: scrape it from inside the
	// network (docs/operations.md).
	if !cfg.HideMetrics {
		r.Method(http.MethodGet, "/metrics", cfg.Metrics.Handler())
	}

	strict := apiserver.NewStrictHandlerWithOptions(h, nil, apiserver.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  problems.request,
		ResponseErrorHandlerFunc: problems.write,
	})
	apiserver.HandlerWithOptions(strict, apiserver.ChiServerOptions{
		// An inline group of the router: its middleware, the front door,
		// runs once chi has routed the request (so it knows the route)
		// and before the generated code parses parameters and the body.
		BaseRouter:       r.With(front.handler),
		ErrorHandlerFunc: problems.request,
	})
	var handler http.Handler = r
	if cfg.Tracing {
		// The span is named "HTTP" here and renamed to method and route
		// once routing has matched (in observe).
		handler = otelhttp.NewHandler(handler, "HTTP")
	}
	return handler, nil
}

// homePage answers GET / with docspage.Home, rendered once: the versions
// it names do not change while the process runs.
func homePage(apiVersion string) http.HandlerFunc {
	page := docspage.Home(apiVersion, buildinfo.Version())
	return func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Content-Security-Policy", docspage.HomeContentSecurityPolicy)
		h.Set("Content-Length", strconv.Itoa(len(page)))
		_, _ = w.Write(page) // a HEAD's body goes nowhere; net/http drops it
	}
}

// toDocs redirects /docs/ to /docs permanently (301), keeping the query.
func toDocs(w http.ResponseWriter, r *http.Request) {
	target := "/docs"
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	http.Redirect(w, r, target, http.StatusMovedPermanently)
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

// routePattern is the route chi matched ("/orders/{id}"), empty before
// routing.
func routePattern(r *http.Request) string {
	if rc := chi.RouteContext(r.Context()); rc != nil {
		return rc.RoutePattern()
	}
	return ""
}

// observe writes one structured log line per request and records its
// metrics. It never logs the API key or the body. It puts the request's
// one per-request value in its context, which the front door fills in,
// with the request's id (requestID).
func observe(log *slog.Logger, m *metrics.Metrics) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			req := &request{}
			r = withRequest(r, req, requestID(r))
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			next.ServeHTTP(ww, r)
			route := req.route
			if p := routePattern(r); route == "" && p != "" && p != "/*" {
				route = p
			}
			elapsed := time.Since(start)
			m.ObserveHTTP(route, r.Method, ww.Status(), elapsed)
			if req.outcome == "" && req.op != nil && req.op.Idempotent {
				// Refused by the front door (auth, contract, size) before
				// the protocol saw it: no key was consumed.
				req.outcome = idempotency.OutcomeRejected
				if ww.Status() >= 500 {
					req.outcome = idempotency.OutcomeError
				}
				m.Outcome(idempotency.OperationName(r.Method, route), req.outcome)
			}
			// Attrs, not key-value pairs: the same line, without boxing
			// each value (nor building any of it when the handler
			// discards the level).
			attrs := [...]slog.Attr{
				slog.String("request_id", req.id), // what middleware.GetReqID finds
				slog.String("method", r.Method),
				slog.String("route", route),
				slog.Int("status", ww.Status()),
				slog.Int("bytes", ww.BytesWritten()),
				slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
				{}, // the outcome, if any
			}
			n := len(attrs) - 1
			// A span that records nothing (no tracing, or not sampled)
			// drops names and attributes: they are not made for it.
			span := trace.SpanFromContext(r.Context())
			recording := span.IsRecording()
			if route != "" && recording {
				span.SetName(idempotency.OperationName(r.Method, route))
				span.SetAttributes(semconv.HTTPRoute(route))
			}
			if req.outcome != "" {
				attrs[n], n = slog.String("idempotency", string(req.outcome)), n+1
				if recording {
					tracing.SetOutcome(r.Context(), string(req.outcome))
				}
			}
			log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs[:n]...)
		})
	}
}

// requestID is the id a request's log line carries (through chi's
// middleware.GetReqID): the client's X-Request-Id when it is short and
// plain, as a proxy in front sets it, else one of the server's own. A
// client's id goes no further than the log, and a long or odd one would
// let any caller, authenticated or not, fill the log with it.
func requestID(r *http.Request) string {
	id := r.Header.Get(middleware.RequestIDHeader)
	if !plainRequestID(id) {
		id = rand.Text()
	}
	return id
}

// plainRequestID reports whether a client's request id may be logged as it
// is: 1 to 64 letters, digits, '-', '_', '.' or ':'.
func plainRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}

// SecurityHeaders are set on every answer, whatever produced it: a handler,
// a problem, or a replay (whose stored headers do not include them).
var SecurityHeaders = map[string]string{
	// Browsers must not guess a JSON body's type into something they run.
	"X-Content-Type-Options": "nosniff",
}

// secure sets SecurityHeaders before anything else can answer.
func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for name, value := range SecurityHeaders {
			h.Set(name, value)
		}
		next.ServeHTTP(w, r)
	})
}

// recoverer turns a panic into a 500 problem. The idempotency layer has
// already rolled back by then (its deferred rollback runs during the panic),
// so nothing was stored and a retry runs the operation.
func recoverer(log *slog.Logger, problems problemWriter) func(http.Handler) http.Handler {
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
				problems.write(w, r, fmt.Errorf("panic: %v", v))
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
