// Package gateway puts the idempotency protocol in front of any HTTP API: a
// reverse proxy (httputil.ReverseProxy) whose covered routes run as held
// operations of the engine. A gateway cannot join its upstream's
// transaction, so it commits a key as held before the request goes
// upstream, and settles it with what came back: a key whose request was
// written upstream and never answered is recorded as of unknown outcome,
// never run a second time. docs/gateway.md has the table of outcomes.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/forward"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// Route is one covered operation: requests of Method on a path that Path
// matches ("/transfers/{id}", a segment in braces matching any one
// segment) run under the protocol.
type Route struct {
	Method string
	Path   string
	// TTL and Wait override Config's for this route.
	TTL, Wait time.Duration
	// RepeatWindow overrides Config's for this route (negative: off), and
	// RefuseRepeats refuses repeats on this route whatever Config says:
	// see idempotency.OperationConfig.
	RepeatWindow  time.Duration
	RefuseRepeats bool
	// MaxStored bounds the responses this route stores for replays,
	// instead of Config.MaxStored (zero: Config's): a route whose answers
	// carry personal data keeps less of them, for as long as its keys
	// live. Negative (StoreNone) stores no response at all: every answer
	// passes through once, and the key records only that it ran and was
	// not stored, so that it still never runs twice (its retries are told
	// so: idempotency.ErrNotStored).
	MaxStored int64
	// Validate, if set, checks a request's body before it goes upstream;
	// an error (a *problem.Error, else a 400) consumes no key.
	Validate func(r *http.Request, body []byte) error
	// Profile, ErrorTemplate and Key override Config's for this route.
	Profile       frontdoor.Profile
	ErrorTemplate *frontdoor.Template
	Key           frontdoor.KeyPlace
}

// Config configures a gateway.
type Config struct {
	// Upstream is the API behind the gateway.
	Upstream *url.URL
	// Routes are the covered operations; every other request passes
	// through untouched.
	Routes []Route
	// Scope names the caller a request's key belongs to (keyscope).
	Scope func(r *http.Request) (string, error)
	// PreviousScopes, if set, names the scopes that earlier scope rules
	// gave the caller of a request whose Scope was found
	// (keyscope.Rule.Previous): a store wrapped by NewPreviousScopes
	// looks keys up under them too, so that a retry across a change of
	// the rule replays.
	PreviousScopes func(r *http.Request) []string
	// Guard, if set, checks every request, covered or passed through,
	// before anything else (keyscope.Rule.Guard: a scope header from a
	// peer that is not trusted); an error refuses it, as a request
	// without a scope (401), and nothing reaches the upstream.
	Guard func(r *http.Request) error
	// Namespace keeps this gateway's keys apart from those of gateways in
	// front of other upstreams on the same store: every key is stored
	// under NamespacedScope(Namespace, scope). Empty: DefaultNamespace of
	// the upstream.
	Namespace string
	// TTL, Wait and MaxBodyBytes are the engine's (zero: its defaults).
	TTL, Wait    time.Duration
	MaxBodyBytes int64
	// RepeatWindow and RefuseRepeats are the engine's: how long a request
	// is remembered to spot the same request under a new key (zero: 5
	// minutes; negative: off), and whether every route refuses such a
	// repeat rather than only counting it.
	RepeatWindow  time.Duration
	RefuseRepeats bool
	// Profile is the answers for a key in flight or reused (default
	// frontdoor.IETF): what the upstream's clients understand.
	Profile frontdoor.Profile
	// ErrorTemplate, if set, shapes every answer the gateway writes itself
	// as the upstream's errors are; nil: RFC 9457 problem documents.
	ErrorTemplate *frontdoor.Template
	// Key is where requests carry their key (default: the
	// Idempotency-Key header).
	Key frontdoor.KeyPlace
	// UpstreamTimeout bounds the wait for the upstream's answer (its
	// response headers); past it the outcome is unknown. Default 30s.
	UpstreamTimeout time.Duration
	// MaxStored bounds the responses stored for replays; larger ones pass
	// through once (idempotency.HeldConfig.MaxStored). A route may set
	// its own (Route.MaxStored).
	MaxStored int64
	// RetryUnknown runs a request whose outcome is unknown again under its
	// key: for upstreams that deduplicate the forwarded Idempotency-Key.
	RetryUnknown bool
	// Transport reaches the upstream (default: a transport of its own).
	// The gateway never lets it resend a request (see forwarder).
	Transport http.RoundTripper
	Logger    *slog.Logger
	Observer  idempotency.Observer
	// ObserveHTTP, if set, is told of every request once it is answered:
	// its route pattern (the covered route, or "" for one passed
	// through), method, status and duration.
	ObserveHTTP func(route, method string, status int, d time.Duration)
}

// StoreNone is Route.MaxStored for a route that stores no response.
const StoreNone = -1

// engineStoreNone is the engine's HeldConfig.MaxStored for a route that
// stores no response, an empty one neither.
const engineStoreNone = -1

// heldLimit is the engine's HeldConfig.MaxStored for rt under cfg.
func (rt *Route) heldLimit(cfg Config) int64 {
	switch {
	case rt.MaxStored < 0:
		return engineStoreNone
	case rt.MaxStored > 0:
		return rt.MaxStored
	}
	return cfg.MaxStored
}

// DefaultUpstreamTimeout is Config.UpstreamTimeout's default.
const DefaultUpstreamTimeout = 30 * time.Second

// leaseMargin is how long past the upstream timeout a held key is presumed
// held by a live gateway: the time to settle it once the answer came.
const leaseMargin = 10 * time.Second

// New returns the gateway for cfg, whose keys store keeps.
func New[U any](cfg Config, store idempotency.Store[U]) (*Gateway, error) {
	if cfg.Upstream == nil || cfg.Upstream.Scheme == "" || cfg.Upstream.Host == "" {
		return nil, errors.New("gateway: the upstream must be an absolute URL, such as http://127.0.0.1:3000")
	}
	if cfg.Scope == nil {
		return nil, errors.New("gateway: a scope source is required")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace(cfg.Upstream)
	}
	if err := CheckNamespace(cfg.Namespace); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Profile == "" {
		cfg.Profile = frontdoor.IETF
	}
	routes, err := compile(cfg.Routes)
	if err != nil {
		return nil, err
	}
	answers := answers{profile: cfg.Profile, template: cfg.ErrorTemplate}
	for i := range routes {
		rt := &routes[i]
		if rt.Profile == "" {
			rt.Profile = cfg.Profile
		}
		if rt.ErrorTemplate == nil {
			rt.ErrorTemplate = cfg.ErrorTemplate
		}
		if rt.Key == (frontdoor.KeyPlace{}) {
			rt.Key = cfg.Key
		}
		if err := rt.Key.Check(); err != nil {
			return nil, fmt.Errorf("gateway: route %s %s: %w", rt.Method, rt.Path, err)
		}
	}
	// The front door reads each request's scope itself (frontDoor), so
	// the engine needs none.
	scope := namespaced(cfg.Namespace, cfg.Scope)
	e := idempotency.New(idempotency.Config{
		Route:         matchedRoute,
		TTL:           cfg.TTL,
		Wait:          cfg.Wait,
		RepeatWindow:  cfg.RepeatWindow,
		RefuseRepeats: cfg.RefuseRepeats,
		MaxBodyBytes:  cfg.MaxBodyBytes,
		Validate: func(r *http.Request, body []byte) error {
			if rt, ok := r.Context().Value(routeKey{}).(*route); ok && rt.Validate != nil {
				return rt.Validate(r, body)
			}
			return nil
		},
		WriteError: answers.write,
		Logger:     cfg.Logger,
		Observer:   cfg.Observer,
	})
	fwd := newForwarder(cfg, answers)
	g := &Gateway{routes: routes, pass: fwd, observe: cfg.ObserveHTTP, engine: e, answers: answers, guard: cfg.Guard}
	held := idempotency.HeldConfig{Lease: cfg.UpstreamTimeout + leaseMargin, MaxStored: cfg.MaxStored, RetryUnknown: cfg.RetryUnknown}
	for i := range routes {
		name := idempotency.OperationName(routes[i].Method, routes[i].Path)
		// Each route's own copy: its limit on the responses stored.
		held := held
		held.MaxStored = routes[i].heldLimit(cfg)
		op := idempotency.NewOperation(e, store, idempotency.OperationConfig{Name: name, TTL: routes[i].TTL, Wait: routes[i].Wait,
			RepeatWindow: routes[i].RepeatWindow, RefuseRepeats: routes[i].RefuseRepeats, Held: &held})
		routes[i].handler = frontDoor(e, op, name, &routes[i], cfg, scope, fwd)
	}
	return g, nil
}

// Gateway routes covered requests through their operation, and passes
// every other request through.
type Gateway struct {
	routes  []route
	pass    http.Handler
	observe func(route, method string, status int, d time.Duration)
	engine  *idempotency.Engine
	answers answers
	guard   func(*http.Request) error
}

// Shutdown stores what the gateway's answers left unsettled, once it has
// stopped serving: a settle the store failed is kept in memory and
// retried until then (idempotency.HeldConfig.MaxPending); here it is
// tried once more within ctx, and each key left is logged, of unknown
// outcome once its lease ends.
func (g *Gateway) Shutdown(ctx context.Context) error { return g.engine.Shutdown(ctx) }

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, pattern := g.pass, ""
	if refuse := g.guarded(r); refuse != nil {
		h = refuse
	} else if refuse := ambiguous(r, g.answers); refuse != nil {
		h = refuse
	} else if rt := g.match(r); rt != nil {
		r = r.WithContext(context.WithValue(r.Context(), routeKey{}, rt))
		h, pattern = rt.handler, rt.Path
	}
	if g.observe == nil {
		h.ServeHTTP(w, r)
		return
	}
	// chi's writer, as the service's metrics use it: it notes the status
	// (not an interim one), and flushes and unwraps for a stream.
	start, ww := time.Now(), middleware.NewWrapResponseWriter(w, r.ProtoMajor)
	defer func() {
		// A handler that panics (http.ErrAbortHandler) is observed too.
		status := ww.Status()
		if status == 0 {
			status = http.StatusBadGateway
		}
		g.observe(pattern, r.Method, status, time.Since(start))
	}()
	h.ServeHTTP(ww, r)
}

// guarded is the answer to a request that the guard refuses, or nil.
func (g *Gateway) guarded(r *http.Request) http.Handler {
	if g.guard == nil {
		return nil
	}
	err := g.guard(r)
	if err == nil {
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.answers.write(w, r, err) })
}

// match is the covered route r is of, or nil.
func (g *Gateway) match(r *http.Request) *route {
	segments := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	for i := range g.routes {
		// Methods too match in any case: an upstream may read "post" as POST.
		if rt := &g.routes[i]; strings.EqualFold(rt.Method, r.Method) && rt.matches(segments) {
			return rt
		}
	}
	return nil
}

// route is a Route ready to match, with its operation's handler.
type route struct {
	Route
	segments []string
	literal  int // literal segments: the more, the more specific
	handler  http.Handler
}

// compile checks the routes and orders them most specific first, so that
// "/transfers/batch" wins over "/transfers/{id}".
func compile(in []Route) ([]route, error) {
	out := make([]route, 0, len(in))
	seen := map[string]bool{}
	for _, r := range in {
		r.Method = strings.ToUpper(r.Method)
		if !idempotency.Unsafe(r.Method) {
			return nil, fmt.Errorf("gateway: route %s %s: only unsafe methods (POST, PUT, PATCH, DELETE) take an Idempotency-Key", r.Method, r.Path)
		}
		if !strings.HasPrefix(r.Path, "/") {
			return nil, fmt.Errorf("gateway: route %s %q: the path must start with /", r.Method, r.Path)
		}
		if seen[r.Method+" "+r.Path] {
			return nil, fmt.Errorf("gateway: route %s %s is given twice", r.Method, r.Path)
		}
		seen[r.Method+" "+r.Path] = true
		rt := route{Route: r, segments: strings.Split(strings.Trim(r.Path, "/"), "/")}
		for _, s := range rt.segments {
			if !isParam(s) {
				rt.literal++
			}
		}
		out = append(out, rt)
	}
	slices.SortStableFunc(out, func(a, b route) int { return b.literal - a.literal })
	return out, nil
}

func isParam(segment string) bool {
	return strings.HasPrefix(segment, "{") && strings.HasSuffix(segment, "}")
}

func (rt *route) matches(got []string) bool {
	if len(got) != len(rt.segments) {
		return false
	}
	for i, s := range rt.segments {
		if !isParam(s) && !segmentMatches(s, got[i]) {
			return false
		}
	}
	return true
}

// routeKey carries the *route a request matched to the engine's Route
// and Validate, and to the forwarder.
type routeKey struct{}

// matchedRoute is the route pattern the request matched, which its key's
// fingerprint binds it to.
func matchedRoute(r *http.Request) string {
	if rt, ok := r.Context().Value(routeKey{}).(*route); ok {
		return rt.Path
	}
	return r.URL.Path
}

// forwarder is the reverse proxy to the upstream.
type forwarder struct {
	proxy   *httputil.ReverseProxy
	log     *slog.Logger
	maxBody int64 // 0: no limit of the gateway's own
	answers answers
}

func newForwarder(cfg Config, answers answers) *forwarder {
	transport := cfg.Transport
	if transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = cfg.UpstreamTimeout
		t.MaxIdleConnsPerHost = 256
		// Idle connections are dropped before a typical upstream drops
		// them (Node.js: 5s), so that a request is rarely written to a
		// connection the upstream has just closed: an error there after
		// the write makes the outcome unknown.
		t.IdleConnTimeout = 4 * time.Second
		transport = t
	}
	f := &forwarder{log: cfg.Logger, maxBody: cfg.MaxBodyBytes, answers: answers}
	upstream := cfg.Upstream
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			pr.Out.Header.Set("Forwarded", forwarded(pr.In))
			if _, covered := pr.In.Context().Value(routeKey{}).(*route); covered {
				// The transport asks for gzip itself and decodes it, so
				// that what is stored and replayed is the body as it is,
				// not an encoding the replay's headers do not name.
				pr.Out.Header.Del("Accept-Encoding")
			}
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorHandler:  f.failed,
		ErrorLog:      slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	return f
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.maxBody > 0 && r.ContentLength > f.maxBody {
		// A passed-through body streams upstream: one declared too large
		// is refused before any of it goes.
		f.answers.write(w, r, fmt.Errorf("%w: the body is %d bytes; the limit is %d", idempotency.ErrBodyTooLarge, r.ContentLength, f.maxBody))
		return
	}
	// Its key headers go in a form the transport never resends, and
	// failed learns whether it reached the upstream.
	f.proxy.ServeHTTP(w, forward.Prepare(r))
}

// failed answers a request the upstream did not answer. One that never
// reached it (forward.Reached) cannot have run: 502, and the key is freed.
// One that did may have run: the outcome is unknown.
func (f *forwarder) failed(w http.ResponseWriter, r *http.Request, err error) {
	if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
		// A streamed body ran past the limit: the upstream got a
		// truncated body, which it cannot have read as a request.
		f.answers.write(w, r, fmt.Errorf("%w: the body exceeds the limit of %d bytes", idempotency.ErrBodyTooLarge, tooLarge.Limit))
		return
	}
	reached := forward.Reached(r, err)
	if reached && idempotency.MarkUnknown(r, fmt.Errorf("the upstream did not answer: %w", err)) {
		f.log.WarnContext(r.Context(), "gateway: the upstream took a request and did not answer; its outcome is unknown", "err", err, "path", r.URL.Path)
		return
	}
	if reached {
		// A request passed through, not covered: it may have run.
		f.log.WarnContext(r.Context(), "gateway: the upstream took a request and did not answer", "err", err, "path", r.URL.Path)
		f.answers.kind(w, r, UpstreamFailed, "the upstream took the request and did not answer: it may have run")
		return
	}
	if r.Context().Err() != nil {
		// The client went away before the upstream answered.
		f.answers.write(w, r, context.Canceled)
		return
	}
	f.log.WarnContext(r.Context(), "gateway: the upstream could not be reached", "err", err, "path", r.URL.Path)
	f.answers.write(w, r, errUnreachable)
}

// forwarded is the RFC 7239 Forwarded element for r.
func forwarded(r *http.Request) string {
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if strings.Contains(host, ":") {
		host = `"[` + host + `]"`
	}
	return fmt.Sprintf("for=%s;host=%q;proto=%s", host, r.Host, proto)
}

// errUnreachable is the answer when the upstream could not be reached.
var errUnreachable = errors.New("the upstream could not be reached; nothing was sent to it, so retrying with the same Idempotency-Key is safe")

// Unreachable is the problem of a request the gateway could not send.
var Unreachable = problem.Kind{
	Slug: "upstream-unreachable", Status: http.StatusBadGateway, Title: "The upstream could not be reached",
	When:        "The request never reached the upstream: connecting failed (refused, a TLS error, a timeout), it failed before its headers were written, or HTTP/2 refused its stream. Nothing ran: retry with the same key.",
	KeyConsumed: "no",
}

// UpstreamFailed is the problem of a request passed through, not covered
// by the protocol, that the upstream took and did not answer.
var UpstreamFailed = problem.Kind{
	Slug: "upstream-failed", Status: http.StatusBadGateway, Title: "The upstream did not answer",
	When:        "A request outside the covered routes was sent to the upstream, and no answer came: it may have run.",
	KeyConsumed: "no",
}
