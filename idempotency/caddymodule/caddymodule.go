// Package caddymodule is the Idempotency-Key protocol as a Caddy HTTP
// handler (http.handlers.idempotency), for the requests Caddy proxies with
// reverse_proxy: a retry, a timeout or a burst of duplicates runs the
// upstream's operation once, and every repeat gets the first answer,
// byte for byte. Three Caddyfile lines add it:
//
//	idempotency {
//		scope {http.request.header.X-Account-Id}
//	}
//	reverse_proxy 127.0.0.1:3000
//
// Every unsafe request the handler sees (its matcher selects them) runs as
// a held operation of the engine: its key is committed before the request
// goes upstream and settled with what came back, so that no crash or lost
// answer runs it twice. A request that never reached the upstream
// (reverse_proxy could not connect, by package forward's rule) is 502 and
// frees its key; one that went upstream and got no answer
// leaves its key's outcome unknown (409 outcome-unknown) until an operator
// settles it. Keys are kept in memory (one Caddy process) or in PostgreSQL,
// with Redis in front if given.
//
// It answers in the terms of the upstream's clients: profile ietf (the
// default) answers a duplicate in flight 409 with Retry-After and a key
// reused with another request 422, never a 2xx the upstream did not send;
// profile oncekey answers 202 and 409, as the oncekey service does.
// error_template gives every answer the handler writes itself the
// upstream's error shape (Stripe's {"error": {...}}, say), and key_header
// or key_body_field read the key where the clients put it
// (X-Idempotency-Key, PayPal-Request-Id, a member of the JSON body). The
// upstream receives every request as sent. See frontdoor. On PostgreSQL a site names its keys:
//
//	idempotency {
//		scope        {http.request.header.X-Account-Id}
//		database_url postgres://keys.internal/oncekey
//		namespace    payments-api
//	}
//
// Sites and gateways (oncekey proxy --namespace) on one database share
// keys only under one namespace: the replicas of one site do, sites in
// front of two upstreams never do. An unsafe request whose path upstreams
// read in different ways (a dot or empty segment, a "", an encoded "/",
// a ";") is refused with 400 ambiguous-path before its key is read.
package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/forward"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the http.handlers.idempotency module. Its fields are its JSON
// configuration; the Caddyfile directive sets the same (see
// UnmarshalCaddyfile).
type Handler struct {
	// Scope names the caller a request's key belongs to, as a Caddy
	// placeholder expression: a header an authentication layer in front
	// sets ({http.request.header.X-Account-Id}), or the user an
	// authentication handler before this one found ({http.auth.user.id}).
	// Every placeholder in it must be known and hold one value (a header
	// sent once): a request for which one is empty, unknown or sent twice
	// is refused (401), never served under a scope that other callers
	// share ("user:" for every anonymous one), and so is one whose scope,
	// with its namespace, is over 255 bytes.
	Scope string `json:"scope,omitempty"`
	// ScopeSecret, if set, stores each scope as an HMAC-SHA256 under it
	// ("hmac:", the secret's id, ":" and the hex MAC, as oncekey proxy
	// --scope-authorization stores it), never as it resolves: a
	// credential used as the scope ({http.request.header.Authorization})
	// is then in neither the key table nor the logs. 32 bytes or more;
	// a placeholder such as {env.IDEMPOTENCY_SCOPE_SECRET} is replaced
	// at provisioning. Keys stored before it was set, or under
	// ScopeSecretPrevious (the secrets it rotated from), are still found
	// until they expire.
	ScopeSecret         string   `json:"scope_secret,omitempty"`
	ScopeSecretPrevious []string `json:"scope_secret_previous,omitempty"`
	// DatabaseURL keeps the keys in PostgreSQL, shared by every Caddy that
	// names it; empty keeps them in memory, one process's and lost on exit.
	DatabaseURL string `json:"database_url,omitempty"`
	// Namespace names this site's keys, apart from those of every other
	// site or gateway on the same database (in front of another upstream);
	// the replicas of one site share it. Required with DatabaseURL, as
	// Caddy does not tell a handler its upstream; optional in memory.
	Namespace string `json:"namespace,omitempty"`
	// RedisURL puts a Redis fast path in front of PostgreSQL; RedisSecret
	// authenticates what is cached there (the same on every Caddy).
	RedisURL    string `json:"redis_url,omitempty"`
	RedisSecret string `json:"redis_secret,omitempty"`
	// TTL is how long a key's answer is replayed (default 48h).
	TTL caddy.Duration `json:"ttl,omitempty"`
	// Wait is how long a duplicate waits for the request still upstream
	// before it gets 202 (default 1s).
	Wait caddy.Duration `json:"wait,omitempty"`
	// Lease bounds a request's time upstream (default 40s): its call is
	// cut before the lease ends, and a key held past it by a Caddy that
	// died is of unknown outcome. Keep reverse_proxy's own timeouts below
	// it.
	Lease caddy.Duration `json:"lease,omitempty"`
	// MaxStoredBytes bounds the answers stored (default 64 MiB; one over
	// 256 KiB, and a stream, is stored in pieces as it passes); larger
	// ones pass through once and are never run again.
	MaxStoredBytes int64 `json:"max_stored_bytes,omitempty"`
	// StoreResponses false stores no answer at all, for a site or route
	// whose answers carry personal data that must not be kept: each
	// passes through once, and its key records only that it ran and was
	// not stored, so that it never runs twice (retries are told so:
	// idempotency.ErrNotStored). Unset or true: answers up to MaxStoredBytes
	// are stored. Not with MaxStoredBytes.
	StoreResponses *bool `json:"store_responses,omitempty"`
	// MaxBodyBytes bounds request bodies (default 1 MiB): larger ones 413.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// OnUnknown is "report" (the default: 409 outcome-unknown until an
	// operator settles the key) or "retry" (run it again under its key:
	// only for upstreams that deduplicate the forwarded key themselves).
	OnUnknown string `json:"on_unknown,omitempty"`
	// ProblemTypeBase prefixes the type URIs of the problem+json answers
	// ("https://example.com/problems/"); empty: about:blank.
	ProblemTypeBase string `json:"problem_type_base,omitempty"`
	// Operation labels the handler's requests in Caddy's metrics
	// (oncekey_idempotency_requests_total{operation}, as `oncekey proxy`
	// labels its routes'): default DefaultOperation.
	Operation string `json:"operation,omitempty"`
	// Profile is the answers to a duplicate in flight and to a key reused
	// with another request: "ietf" (the default: 409 with Retry-After
	// once Wait has passed, and 422; what SDKs written for APIs without a
	// 202 expect) or "oncekey" (202 with Retry-After, and 409: only for
	// clients generated from a document that declares the 202).
	Profile string `json:"profile,omitempty"`
	// ErrorTemplate names a JSON file in the upstream's error shape, whose
	// strings may hold {type}, {title}, {detail}, {code} and {status}:
	// every answer the handler writes itself takes it (application/json)
	// instead of problem+json (see frontdoor.Template). One that does not
	// parse, or names another placeholder, fails provisioning.
	ErrorTemplate string `json:"error_template,omitempty"`
	// KeyHeader is the header that carries the key (default
	// Idempotency-Key), such as X-Idempotency-Key or PayPal-Request-Id;
	// KeyBodyField instead reads it from the JSON body, at a JSON pointer
	// such as /idempotency_key. At most one of them.
	KeyHeader    string `json:"key_header,omitempty"`
	KeyBodyField string `json:"key_body_field,omitempty"`

	serve    http.Handler
	template *frontdoor.Template
	engine   *idempotency.Engine
	log      *slog.Logger
	close    []func()
}

// DefaultOperation is Operation's default.
const DefaultOperation = "idempotency"

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.idempotency",
		New: func() caddy.Module { return new(Handler) },
	}
}

// DefaultLease is Lease's default: Caddy's reverse_proxy has no response
// timeout of its own unless configured, so the lease is what bounds a
// request's time upstream.
const DefaultLease = 40 * time.Second

// Validate checks the configuration before Caddy provisions it.
func (h *Handler) Validate() error {
	if _, err := frontdoor.ParseProfile(h.Profile); err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	macScope := newScopeMAC(nil).of("") // as long as every scope under a secret
	switch {
	case strings.TrimSpace(h.Scope) == "":
		return errors.New("idempotency: scope is required: a placeholder that names the caller, such as {http.request.header.X-Account-Id}; keys of two callers must never meet")
	case checkScope(h.Scope) != nil:
		return fmt.Errorf("idempotency: scope: %w", checkScope(h.Scope))
	case h.OnUnknown != "" && h.OnUnknown != "report" && h.OnUnknown != "retry":
		return fmt.Errorf("idempotency: on_unknown %q: want report or retry", h.OnUnknown)
	case h.keyPlace().Check() != nil:
		return fmt.Errorf("idempotency: key_header and key_body_field: %w", h.keyPlace().Check())
	case h.DatabaseURL != "" && h.Namespace == "":
		return errors.New("idempotency: database_url needs a namespace: name this site's keys (namespace payments-api), the same on each replica of the site and different from every other site or gateway on the database, so that no two upstreams' keys meet")
	case h.Namespace != "" && checkNamespace(h.Namespace) != nil:
		return fmt.Errorf("idempotency: namespace: %w", checkNamespace(h.Namespace))
	case h.RedisURL != "" && h.DatabaseURL == "":
		return errors.New("idempotency: redis_url needs database_url: Redis is a fast path in front of PostgreSQL, which keeps the keys")
	case len(h.ScopeSecretPrevious) > 0 && h.ScopeSecret == "":
		return errors.New("idempotency: scope_secret_previous needs scope_secret: the secret that replaced it")
	case h.ScopeSecret != "" && len(namespacedScope(h.Namespace, macScope)) > idempotency.MaxScopeLength:
		return fmt.Errorf("idempotency: namespace %q is too long for a scope_secret, whose scopes take %d bytes: at most %d", h.Namespace,
			len(macScope), idempotency.MaxScopeLength-len(namespacedScope("", macScope)))
	case h.MaxStoredBytes < 0 || h.MaxBodyBytes < 0 || h.TTL < 0 || h.Wait < 0 || h.Lease < 0:
		return errors.New("idempotency: sizes and durations must not be negative")
	case h.storesNone() && h.MaxStoredBytes > 0:
		return errors.New("idempotency: store_responses off stores no answer, and max_stored_bytes bounds those stored: give one of them")
	}
	return nil
}

// Provision opens the key store and builds the protocol's operation.
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := h.Validate(); err != nil {
		return err
	}
	lease := time.Duration(h.Lease)
	if lease <= 0 {
		lease = DefaultLease
	}
	if h.Operation == "" {
		h.Operation = DefaultOperation
	}
	observer, err := newMetrics(ctx.GetMetricsRegistry(), h.Operation)
	if err != nil {
		return fmt.Errorf("idempotency: metrics: %w", err)
	}
	h.log = ctx.Slogger()
	profile, err := frontdoor.ParseProfile(h.Profile)
	if err != nil {
		return fmt.Errorf("idempotency: %w", err)
	}
	if h.ErrorTemplate != "" {
		raw, err := os.ReadFile(h.ErrorTemplate)
		if err == nil {
			h.template, err = frontdoor.ParseTemplate(raw)
		}
		if err != nil {
			return fmt.Errorf("idempotency: error_template %s: %w", h.ErrorTemplate, err)
		}
	}
	// The front door reads each request's scope itself (serveWith), so
	// the engine needs none.
	rule, err := h.scopeRule()
	if err != nil {
		return err
	}
	scope := scopeOf(rule)
	e := idempotency.New(idempotency.Config{
		WriteError:      frontdoor.Writer(profile, h.template, h.ProblemTypeBase),
		TTL:             time.Duration(h.TTL),
		Wait:            time.Duration(h.Wait),
		MaxBodyBytes:    h.MaxBodyBytes,
		ProblemTypeBase: h.ProblemTypeBase,
		Logger:          h.log,
		Observer:        observer,
	})
	h.engine = e
	forward := http.HandlerFunc(h.forward)
	op := idempotency.OperationConfig{Name: h.Operation, Held: &idempotency.HeldConfig{
		Lease: lease, MaxStored: h.heldLimit(), RetryUnknown: h.OnUnknown == "retry",
	}}
	door := frontDoor{engine: e, key: h.keyPlace(), scope: scope, maxBody: h.MaxBodyBytes, observer: observer, operation: h.Operation}
	if h.DatabaseURL == "" {
		h.serve = serveWith(door, idempotency.NewOperation(e, memstore.New(), op), forward)
		return nil
	}
	store, err := h.openPostgres(ctx, rule)
	if err != nil {
		_ = h.Cleanup()
		return err
	}
	h.serve = serveWith(door, idempotency.NewOperation(e, store, op), forward)
	return nil
}

// storesNone reports whether the handler stores no answer
// (StoreResponses false).
func (h *Handler) storesNone() bool { return h.StoreResponses != nil && !*h.StoreResponses }

// heldStoreNone is the engine's HeldConfig.MaxStored for a handler that
// stores no answer, an empty one neither.
const heldStoreNone = -1

// heldLimit is the engine's HeldConfig.MaxStored for the handler.
func (h *Handler) heldLimit() int64 {
	if h.storesNone() {
		return heldStoreNone
	}
	return h.MaxStoredBytes
}

// scopeRule is the site's scope rule, its secrets' placeholders
// ({env.…}) replaced.
func (h *Handler) scopeRule() (scopeRule, error) {
	rule := scopeRule{template: h.Scope, ns: h.Namespace}
	if h.ScopeSecret == "" {
		return rule, nil
	}
	repl := caddy.NewReplacer()
	secret := func(name, raw string) ([]byte, error) {
		s := repl.ReplaceKnown(raw, "")
		if len(s) < minSecret {
			return nil, fmt.Errorf("idempotency: %s has %d bytes (as replaced); give it %d or more, such as `openssl rand -hex 32`", name, len(s), minSecret)
		}
		return []byte(s), nil
	}
	current, err := secret("scope_secret", h.ScopeSecret)
	if err != nil {
		return rule, err
	}
	m := newScopeMAC(current)
	rule.secret = &m
	for _, raw := range h.ScopeSecretPrevious {
		prev, err := secret("scope_secret_previous", raw)
		if err != nil {
			return rule, err
		}
		rule.previous = append(rule.previous, newScopeMAC(prev))
	}
	return rule, nil
}

// keyPlace is where the handler's requests carry their key.
func (h *Handler) keyPlace() frontdoor.KeyPlace {
	return frontdoor.KeyPlace{Header: h.KeyHeader, BodyField: h.KeyBodyField}
}

// openPostgres opens (and migrates) the key table, with Redis and the
// record cache in front, and the look-up of keys stored before namespaces
// (legacyScopes) around them.
func (h *Handler) openPostgres(ctx context.Context, rule scopeRule) (idempotency.Store[*pgstore.Batch], error) {
	pool, err := pgxpool.New(ctx, h.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("idempotency: database_url: %w", err)
	}
	h.close = append(h.close, pool.Close)
	if err := pgstore.Migrate(ctx, pool, pgstore.Options{}); err != nil {
		return nil, fmt.Errorf("idempotency: migrate the key table: %w", err)
	}
	pg, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		return nil, err
	}
	// The deferred store claims and holds a key in one round trip.
	store, err := pg.ClaimAtCommit()
	if err != nil {
		return nil, err
	}
	if h.RedisURL != "" {
		rdb, err := redisstore.NewClient(h.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("idempotency: redis_url: %w", err)
		}
		h.close = append(h.close, func() { _ = rdb.Close() })
		store = redisstore.Wrap(redisstore.New(rdb, redisstore.Config{Secret: []byte(h.RedisSecret)}), store)
	}
	cache, err := recordcache.New(recordcache.DefaultSize, nil)
	if err != nil {
		return nil, err
	}
	// Keys stored before namespaces carry the caller's scope alone: they
	// are looked up there until none remains.
	legacy := &legacyScopes{next: recordcache.Wrap(cache, store), any: postgresLegacyKeys(pool)}
	if rule.secret != nil {
		// And keys stored before the secret, or under a previous one.
		legacy.prevAny = postgresPreviousKeys(pool, rule.ns, rule.secret.prefix)
	}
	if err := legacy.check(ctx); err != nil {
		return nil, err
	}
	if legacy.active() {
		h.log.Info("idempotency: keys stored before namespaces remain; each claim looks its key up under the bare scope too, until they expire")
	}
	if legacy.previousActive() {
		h.log.Info("idempotency: keys stored before scope_secret, or under scope_secret_previous, remain; each claim looks its key up under those scopes too, until they expire")
	}
	if legacy.active() || legacy.previousActive() {
		h.close = append(h.close, legacy.watch(h.log, legacyCheckEvery))
	}
	return legacy, nil
}

// settleOnCleanup bounds the last attempt, at Cleanup, to store what the
// store did not take at once (see idempotency.Engine.Shutdown).
const settleOnCleanup = 5 * time.Second

// Cleanup stores what the handler's answers left unsettled (a settle the
// store failed is retried until then; here it is tried once more, and
// what is left is logged), then closes what Provision opened.
func (h *Handler) Cleanup() error {
	if h.engine != nil {
		ctx, cancel := context.WithTimeout(context.Background(), settleOnCleanup)
		_ = h.engine.Shutdown(ctx)
		cancel()
		h.engine = nil
	}
	for i := len(h.close) - 1; i >= 0; i-- {
		h.close[i]()
	}
	h.close = nil
	return nil
}

// nextKey carries the rest of Caddy's handler chain to forward.
type nextKey struct{}

// ServeHTTP runs the protocol for an unsafe request, with the rest of the
// chain (reverse_proxy) as the operation, and passes a safe one on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !idempotency.Unsafe(r.Method) {
		return next.ServeHTTP(w, r)
	}
	if h.refuseAmbiguous(w, r) {
		return nil
	}
	h.serve.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nextKey{}, next)))
	return nil
}

// forward runs the rest of the chain, and turns its error into what the
// protocol records, by the rule oncekey proxy follows (forward.Reached): a
// request that never reached the upstream frees the key (502), one that
// did leaves its outcome unknown.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request) {
	next := r.Context().Value(nextKey{}).(caddyhttp.Handler)
	// Its key headers go in a form reverse_proxy's transport never
	// resends, and its context notes how far it got.
	r = forward.Prepare(r)
	// As oncekey proxy does (internal/gateway): reverse_proxy's transport
	// then asks for gzip itself and decodes it, so that what is stored
	// and replayed, to clients that may not have asked for gzip, is the
	// body as it is.
	r.Header.Del("Accept-Encoding")
	err := next.ServeHTTP(w, r)
	if err == nil {
		return
	}
	if !forward.Reached(r, err) {
		h.problem(w, http.StatusBadGateway, "upstream-unreachable", "The upstream could not be reached",
			"the upstream could not be reached; nothing was sent to it, so retrying with the same Idempotency-Key is safe")
		return
	}
	if idempotency.MarkUnknown(r, err) {
		// As oncekey proxy logs it (internal/gateway).
		h.log.WarnContext(r.Context(), "idempotency: the upstream took a request and did not answer; its outcome is unknown", "err", err, "path", r.URL.Path)
		return
	}
	status := http.StatusBadGateway
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		status = he.StatusCode
	}
	w.WriteHeader(status)
}

// problem writes a problem of the handler's own: RFC 9457 problem+json,
// or the error template filled in.
func (h *Handler) problem(w http.ResponseWriter, status int, code, title, detail string) {
	frontdoor.Write(w, h.template, frontdoor.Answer{
		Status: status, Type: frontdoor.TypeURI(h.ProblemTypeBase, code), Code: code, Title: title, Detail: detail,
	})
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
