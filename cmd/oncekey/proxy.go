package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/idempotency/redisstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
	"github.com/oncekey/oncekey/internal/service/httpserver"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/wire/problem"
)

// proxyCmd is `oncekey proxy`: the protocol in front of any HTTP API.
type proxyCmd struct {
	Upstream            string        `name:"upstream" envvar:"ONCEKEY_UPSTREAM" required:"" placeholder:"URL" help:"The API behind the gateway, e.g. http://127.0.0.1:3000."`
	Spec                string        `name:"spec" envvar:"ONCEKEY_SPEC" placeholder:"FILE" help:"The upstream's OpenAPI document: the operations that declare the Idempotency-Key header (or x-idempotency) are covered, and their bodies validated."`
	Routes              string        `name:"routes" envvar:"ONCEKEY_ROUTES" placeholder:"FILE" help:"Without a document, a YAML file of the covered routes (method, path, ttl, wait); see docs/gateway.md."`
	ScopeHeader         string        `name:"scope-header" envvar:"ONCEKEY_SCOPE_HEADER" placeholder:"NAME" help:"Scope keys by this header, which an authentication layer in front sets (and strips from clients), e.g. X-Account-Id."`
	ScopeHeaderFrom     []string      `name:"scope-header-from" envvar:"ONCEKEY_SCOPE_HEADER_FROM" sep:"," placeholder:"CIDR" help:"With --scope-header: trust the header only from these peers (the front proxy's addresses, e.g. 10.0.0.0/8,127.0.0.1/32); a request from elsewhere that carries it is refused (401). Unset: from any peer."`
	ScopeJWKS           string        `name:"scope-jwks" envvar:"ONCEKEY_SCOPE_JWKS" placeholder:"FILE" help:"Scope keys by the issuer and a claim of the bearer JWT, read once its signature verifies against this JWKS file (read again on SIGHUP and every --scope-jwks-refresh); survives token refreshes."`
	ScopeClaim          string        `name:"scope-claim" envvar:"ONCEKEY_SCOPE_CLAIM" default:"sub" help:"The JWT claim that names the caller, with --scope-jwks."`
	ScopeIssuer         string        `name:"scope-issuer" envvar:"ONCEKEY_SCOPE_ISSUER" placeholder:"ISS" help:"With --scope-jwks: the token's iss must be this (e.g. https://idp.example.com/); unset: any issuer whose key is in the JWKS."`
	ScopeAudience       string        `name:"scope-audience" envvar:"ONCEKEY_SCOPE_AUDIENCE" placeholder:"AUD" help:"With --scope-jwks: the token's aud must hold this (e.g. payments-api); unset: any audience."`
	ScopeLeeway         time.Duration `name:"scope-leeway" envvar:"ONCEKEY_SCOPE_LEEWAY" default:"1m" help:"With --scope-jwks: the clock skew allowed on the token's exp, nbf and iat."`
	ScopeJWKSRefresh    time.Duration `name:"scope-jwks-refresh" envvar:"ONCEKEY_SCOPE_JWKS_REFRESH" default:"30s" help:"With --scope-jwks: how often the JWKS file is read again (SIGHUP reads it at once): the longest a removed key keeps verifying."`
	ScopeAuthorization  bool          `name:"scope-authorization" envvar:"ONCEKEY_SCOPE_AUTHORIZATION" help:"Scope keys by the whole Authorization value (its HMAC under --scope-secret): needs nothing of the caller's, but a refreshed token is a new scope."`
	ScopeSecret         string        `name:"scope-secret" envvar:"ONCEKEY_SCOPE_SECRET" placeholder:"SECRET" help:"With --scope-authorization: the HMAC key of the scopes, the same on every replica, 32 characters or more; best given in the environment. A new secret starts new scopes (see --scope-secret-previous)."`
	ScopeSecretPrevious string        `name:"scope-secret-previous" envvar:"ONCEKEY_SCOPE_SECRET_PREVIOUS" placeholder:"SECRET" help:"With --scope-authorization: the secret before a rotation, whose scopes' keys are still found (replayed, waited for) until they expire."`
	Profile             string        `name:"profile" envvar:"ONCEKEY_PROFILE" enum:"ietf,oncekey" default:"ietf" help:"The answers to a duplicate in flight and a reused key. ietf: 409 with Retry-After, and 422 (what SDKs expect); oncekey: 202 with Retry-After, and 409 (only for clients generated from a document that declares the 202; with --spec, only operations that declare a 202 get it). A routes file can set it per route."`
	ErrorTemplate       string        `name:"error-template" envvar:"ONCEKEY_ERROR_TEMPLATE" placeholder:"FILE" help:"A JSON document in the upstream's error shape, whose strings may hold {type}, {title}, {detail}, {code} and {status}: every answer the gateway writes itself takes it instead of problem+json. See docs/gateway.md."`
	KeyHeader           string        `name:"key-header" envvar:"ONCEKEY_KEY_HEADER" placeholder:"NAME" help:"The header that carries the key (default Idempotency-Key), e.g. X-Idempotency-Key or PayPal-Request-Id. With --spec, an operation's own key header parameter wins."`
	KeyBodyField        string        `name:"key-body-field" envvar:"ONCEKEY_KEY_BODY_FIELD" placeholder:"POINTER" help:"Read the key from this member of the JSON body instead of a header: a JSON pointer such as /idempotency_key."`
	Namespace           string        `name:"namespace" envvar:"ONCEKEY_NAMESPACE" placeholder:"NAME" help:"The namespace of this gateway's keys, apart from those of gateways in front of other upstreams on the same database; replicas of one gateway share it. Default: the upstream's origin (scheme://host:port)."`
	redisFlags
	protocolFlags
	serverFlags
	recordCacheFlag
	DatabaseURL     string        `name:"database-url" envvar:"DATABASE_URL" placeholder:"URL" help:"PostgreSQL URL for the keys; empty: in memory, lost on exit, one process only."`
	Addr            string        `name:"addr" envvar:"ONCEKEY_ADDR" default:"127.0.0.1:8080" help:"Listen address of the gateway."`
	MetricsAddr     string        `name:"metrics-addr" envvar:"ONCEKEY_METRICS_ADDR" placeholder:"HOST:PORT" help:"Serve /metrics, /healthz and /readyz on this internal address (never on the gateway's, whose paths are the upstream's); without it the gateway has no readiness endpoint."`
	MaxBodyBytes    int64         `name:"max-body-bytes" envvar:"ONCEKEY_MAX_BODY_BYTES" default:"1048576" help:"Larger request bodies get 413, on every route."`
	UpstreamTimeout time.Duration `name:"upstream-timeout" envvar:"ONCEKEY_UPSTREAM_TIMEOUT" default:"30s" help:"How long the upstream may take to answer a request written to it; past it, the request's outcome is unknown."`
	MaxStoredBytes  int64         `name:"max-stored-bytes" envvar:"ONCEKEY_MAX_STORED_BYTES" default:"67108864" help:"Responses up to this size are stored and replayed (over 256 KiB in pieces, as they pass); larger ones pass through once and are not stored: their key's retries get a problem saying so."`
	// scope is the rule the scope flags name, and jwks its JWKS (nil
	// without --scope-jwks), set by gatewayConfig.
	scope     keyscope.Rule
	jwks      *keyscope.JWKS
	OnUnknown string `name:"on-unknown" envvar:"ONCEKEY_ON_UNKNOWN" enum:"report,retry" default:"report" help:"report: a request whose outcome is unknown answers 409 outcome-unknown until an operator settles it; retry: run it again under its key (only for upstreams that deduplicate the forwarded Idempotency-Key)."`
}

func (p *proxyCmd) Run(e env) error {
	// SIGHUP asks for a reload (of the JWKS), and never ends the gateway.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	cfg, err := p.gatewayConfig()
	if err != nil {
		return err
	}
	if p.jwks != nil {
		go p.jwks.Watch(e.ctx, p.ScopeJWKSRefresh, hup, e.log)
	} else {
		go func() {
			for {
				select {
				case <-e.ctx.Done():
					return
				case <-hup:
					e.log.Info("SIGHUP: nothing to reload (only --scope-jwks is read again)")
				}
			}
		}()
	}
	m := metrics.New()
	cfg.Logger, cfg.Observer, cfg.ObserveHTTP = e.log, m, m.ObserveHTTP
	names := make([]string, 0, len(cfg.Routes))
	for _, r := range cfg.Routes {
		names = append(names, idempotency.OperationName(r.Method, r.Path))
	}
	m.Operations(names...)
	byProfile := map[frontdoor.Profile][]string{}
	for _, r := range cfg.Routes {
		p := cmp.Or(r.Profile, cfg.Profile)
		byProfile[p] = append(byProfile[p], idempotency.OperationName(r.Method, r.Path))
	}
	for _, p := range []frontdoor.Profile{frontdoor.IETF, frontdoor.Oncekey} {
		if len(byProfile[p]) > 0 {
			e.log.Info("gateway profile", "profile", string(p), "routes", strings.Join(byProfile[p], ", "))
		}
	}
	// What a route keeps of its answers is a privacy decision: said once,
	// where an auditor reading the log finds it.
	for _, r := range cfg.Routes {
		switch name := idempotency.OperationName(r.Method, r.Path); {
		case r.MaxStored < 0:
			e.log.Info("gateway route stores no responses", "route", name)
		case r.MaxStored > 0:
			e.log.Info("gateway route stores its own size of responses", "route", name, "max_stored_bytes", r.MaxStored)
		}
	}
	m.HeldOperations(names...)

	ctx := e.ctx
	handler, keys, closeKeys, err := p.open(ctx, cfg, m, e.log)
	if err != nil {
		return err
	}
	defer closeKeys()
	m.RegisterStore(keys)

	if p.MetricsAddr != "" {
		stop, err := serveInternal(p.MetricsAddr, gatewayInternal(m, keys), "metrics, /healthz and /readyz", e.log)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		defer stop()
	}
	ln, err := net.Listen("tcp", p.Addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	cleanupCtx, stopCleanup := context.WithCancel(ctx)
	defer stopCleanup()
	go idempotency.Cleanup{Purge: keys.PurgeExpired, Interval: p.CleanupInterval, Batch: p.CleanupBatch, Logger: e.log, Observe: m.CleanupRun}.Run(cleanupCtx)
	e.log.Info("gateway listening", "addr", ln.Addr().String(), "upstream", redacted(cfg.Upstream), "namespace", cfg.Namespace, "routes", strings.Join(names, ", "))
	defer func() {
		// Served: what its answers left unsettled is tried once more
		// before the store closes, and logged if it still fails.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.ShutdownTimeout)
		defer cancel()
		_ = handler.Shutdown(sctx)
	}()
	return httpserver.Serve(ctx, ln, httpserver.Config{
		Handler:         handler,
		MaxBodyBytes:    p.MaxBodyBytes,
		ShutdownTimeout: p.ShutdownTimeout,
		MaxConns:        p.MaxConns,
		MaxInFlight:     p.MaxInFlight,
		WriteTimeout:    p.WriteTimeout,
		MinWriteRate:    p.MinWriteRate,
		// Passed-through bodies go upstream as they come; the engine reads
		// a covered request's body itself, once its slot is taken.
		StreamBodies: true,
		Logger:       e.log,
	})
}

// keyStore is what the gateway's key store is besides a store: purged,
// and counted for the metrics.
type keyStore interface {
	PurgeExpired(ctx context.Context, batch int) (int64, error)
	metrics.StatsSource
}

// readyTimeout bounds /readyz's probe of the key table: a load balancer
// must hear no within its own probe's timeout.
const readyTimeout = time.Second

// keyTable is the gateway's key store on PostgreSQL, with the probe that
// says whether it can serve claims (/readyz).
type keyTable struct {
	*pgstore.Store
	pool *pgxpool.Pool
}

// Ready reports whether the key table answers within readyTimeout and
// takes writes. It reads the table itself, not just the server: a table
// locked by a migration or an operator's LOCK TABLE blocks every claim,
// and so blocks the probe too.
func (k keyTable) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var readOnly bool
	err := k.pool.QueryRow(ctx, "SELECT current_setting('transaction_read_only') = 'on' FROM (SELECT EXISTS (SELECT FROM "+
		pgx.Identifier{pgstore.DefaultTable}.Sanitize()+")) AS probe").Scan(&readOnly)
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("the key table did not answer within %s", readyTimeout)
	case err != nil:
		return fmt.Errorf("the key table does not answer: %w", err)
	case readOnly:
		return errors.New("PostgreSQL is read-only (a standby, or default_transaction_read_only is on): claims would fail")
	}
	return nil
}

// gatewayInternal is the gateway's internal address: /metrics, /healthz
// (the process is up) and /readyz (its key store answers, as keys says if
// it can; memory always does). The gateway's own address has none of
// them: its paths are the upstream's.
func gatewayInternal(m *metrics.Metrics, keys keyStore) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	ok := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	}
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if probe, ok := keys.(interface{ Ready(context.Context) error }); ok {
			if err := probe.Ready(r.Context()); err != nil {
				w.Header().Set("Retry-After", "1")
				problem.Write(w, problem.Unavailable, "not ready: "+err.Error())
				return
			}
		}
		ok(w, r)
	})
	return mux
}

// open returns the gateway on the keys' store the flags name: memory, or
// PostgreSQL with Redis in front if given.
func (p *proxyCmd) open(ctx context.Context, cfg gateway.Config, m *metrics.Metrics, log *slog.Logger) (h *gateway.Gateway, keys keyStore, closeAll func(), err error) {
	if p.DatabaseURL == "" {
		log.Info("gateway keys: in memory (lost on exit; one process only)")
		store := memstore.New()
		h, err := gateway.New(cfg, store)
		return h, store, func() {}, err
	}
	// The key table alone: the database is the application's (see
	// openKeyTable).
	pool, pg, err := openKeyTable(ctx, p.DatabaseURL, pgstore.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	closers := []func(){pool.Close}
	closeAll = func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	m.RegisterPool(pool)
	// Deferred: a held operation writes nothing but its key, which the
	// deferred store claims and holds in one round trip (and merges
	// concurrent claims into one commit).
	deferred, err := pg.ClaimAtCommit()
	if err != nil {
		return nil, nil, nil, err
	}
	store := deferred
	if p.RedisURL != "" {
		rdb, err := redisstore.NewClient(p.RedisURL)
		if err != nil {
			return nil, nil, nil, err
		}
		closers = append(closers, func() { _ = rdb.Close() })
		fast := redisstore.New(rdb, redisstore.Config{Prefix: "oncekey-gateway:", Observer: m, Secret: []byte(p.RedisSecret), Logger: log})
		store = redisstore.Wrap(fast, store)
		log.Info("gateway keys: PostgreSQL, with Redis in front")
	} else {
		log.Info("gateway keys: PostgreSQL")
	}
	if p.RecordCacheSize > 0 {
		cache, err := recordcache.New(p.RecordCacheSize, m)
		if err != nil {
			return nil, nil, nil, err
		}
		store = recordcache.Wrap(cache, store)
	}
	// Keys stored before namespaces carry the caller's scope alone: they
	// are looked up there until none remains.
	legacy := gateway.NewLegacyScopes(store, gateway.PostgresLegacyKeys(pool, pgstore.DefaultTable))
	if err := legacy.Check(ctx); err != nil {
		return nil, nil, nil, err
	}
	if legacy.Active() {
		log.Info("gateway keys: keys stored before namespaces remain; each claim looks its key up under the bare scope too, until they expire")
	}
	checks := []func(context.Context) error{legacy.Check}
	var held idempotency.Store[*pgstore.Batch] = legacy
	if cfg.PreviousScopes != nil {
		// Keys stored under an earlier scope rule (before the secret or
		// the issuer, or under a rotated secret) are looked up under
		// their scope too, until they expire.
		previous := gateway.NewPreviousScopes(held, gateway.PostgresPreviousKeys(pool, pgstore.DefaultTable, cfg.Namespace, p.scope.Prefix))
		if err := previous.Check(ctx); err != nil {
			return nil, nil, nil, err
		}
		if previous.Active() {
			log.Info("gateway keys: keys stored under an earlier scope rule remain; each claim looks its key up under its previous scopes too, until they expire")
		}
		checks, held = append(checks, previous.Check), previous
	}
	if h, err = gateway.New(cfg, held); err != nil {
		return nil, nil, nil, err
	}
	check := func(ctx context.Context) error {
		var errs []error
		for _, c := range checks {
			errs = append(errs, c(ctx))
		}
		return errors.Join(errs...)
	}
	return h, purgeThenCheck{keyTable{pg, pool}, check, log}, closeAll, nil
}

// purgeThenCheck is a key store whose cleanup runs ask, each time, whether
// keys stored before namespaces remain (gateway.LegacyScopes).
type purgeThenCheck struct {
	keyStore
	check func(context.Context) error
	log   *slog.Logger
}

func (p purgeThenCheck) PurgeExpired(ctx context.Context, batch int) (int64, error) {
	n, err := p.keyStore.PurgeExpired(ctx, batch)
	if cerr := p.check(ctx); cerr != nil && ctx.Err() == nil {
		p.log.WarnContext(ctx, "gateway keys: could not look for keys stored before namespaces or under an earlier scope rule; still looking them up", "err", cerr)
	}
	return n, err
}

// Ready is the key table's readiness probe (keyTable.Ready), which the
// embedded interface does not promote.
func (p purgeThenCheck) Ready(ctx context.Context) error {
	if probe, ok := p.keyStore.(interface{ Ready(context.Context) error }); ok {
		return probe.Ready(ctx)
	}
	return nil
}

// gatewayConfig checks the flags, reporting every problem at once, and
// reads the routes and the scope source they name.
func (p *proxyCmd) gatewayConfig() (gateway.Config, error) {
	var problems flagProblems
	bad := problems.bad
	upstream, err := url.Parse(p.Upstream)
	if err != nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
		bad("--upstream (ONCEKEY_UPSTREAM) %q: want an absolute http or https URL, such as http://127.0.0.1:3000", redactedURL(p.Upstream))
	}
	p.protocolFlags.check(&problems)
	problems.positive("upstream-timeout", "ONCEKEY_UPSTREAM_TIMEOUT", p.UpstreamTimeout)
	problems.positive("shutdown-timeout", "ONCEKEY_SHUTDOWN_TIMEOUT", p.ShutdownTimeout)
	problems.positive("cleanup-interval", "ONCEKEY_CLEANUP_INTERVAL", p.CleanupInterval)
	problems.within("max-body-bytes", "ONCEKEY_MAX_BODY_BYTES", p.MaxBodyBytes, 1, 1<<30, "")
	problems.within("max-stored-bytes", "ONCEKEY_MAX_STORED_BYTES", p.MaxStoredBytes, 1, math.MaxInt64, "")
	problems.within("cleanup-batch", "ONCEKEY_CLEANUP_BATCH", int64(p.CleanupBatch), 1, 100_000, "")
	problems.within("record-cache-size", "ONCEKEY_RECORD_CACHE_SIZE", int64(p.RecordCacheSize), 0, 10_000_000, "")
	var routes []gateway.Route
	switch {
	case p.Spec != "" && p.Routes != "":
		bad("--spec (ONCEKEY_SPEC) and --routes (ONCEKEY_ROUTES) are both given: the routes come from one of them")
	case p.Spec != "":
		doc, err := openapi3.NewLoader().LoadFromFile(p.Spec)
		if err == nil {
			err = doc.Validate(context.Background())
		}
		if err == nil {
			routes, err = gateway.SpecRoutes(doc)
		}
		if err != nil {
			bad("--spec (ONCEKEY_SPEC) %s: %v", p.Spec, err)
		}
	case p.Routes != "":
		routes, err = gateway.ReadRoutesFile(p.Routes)
		if err != nil {
			bad("--routes (ONCEKEY_ROUTES) %s: %v", p.Routes, err)
		}
	default:
		bad("give --spec (ONCEKEY_SPEC), the upstream's OpenAPI document, or --routes (ONCEKEY_ROUTES), a file of the routes to cover")
	}
	p.scope, p.jwks, err = p.scopeRule()
	if err != nil {
		bad("%v", err)
	}
	var template *frontdoor.Template
	if p.ErrorTemplate != "" {
		if template, err = gateway.ReadErrorTemplate(p.ErrorTemplate); err != nil {
			bad("--error-template (ONCEKEY_ERROR_TEMPLATE): %v", err)
		}
	}
	key := frontdoor.KeyPlace{Header: p.KeyHeader, BodyField: p.KeyBodyField}
	if err := key.Check(); err != nil {
		bad("--key-header (ONCEKEY_KEY_HEADER) and --key-body-field (ONCEKEY_KEY_BODY_FIELD): %v", err)
	}
	if p.RedisURL != "" && p.DatabaseURL == "" {
		bad("--redis-url (REDIS_URL) needs --database-url (DATABASE_URL): Redis is a fast path in front of PostgreSQL, which keeps the keys")
	}
	p.redisFlags.check(&problems)
	namespace := p.Namespace
	if namespace == "" && upstream != nil {
		namespace = gateway.DefaultNamespace(upstream)
	}
	if err := gateway.CheckNamespace(namespace); err != nil && p.Namespace != "" {
		bad("--namespace (ONCEKEY_NAMESPACE): %v", err)
	}
	p.serverFlags.check(&problems)
	if err := problems.err(); err != nil {
		return gateway.Config{}, err
	}
	return gateway.Config{
		Upstream: upstream, Routes: routes, Scope: p.scope.Source, PreviousScopes: p.scope.Previous, Guard: p.scope.Guard, Namespace: namespace,
		TTL: p.TTL, Wait: p.Wait, RepeatWindow: p.repeatWindow(), RefuseRepeats: p.RefuseRepeats, MaxBodyBytes: p.MaxBodyBytes,
		Profile: frontdoor.Profile(p.Profile), ErrorTemplate: template, Key: key,
		UpstreamTimeout: p.UpstreamTimeout, MaxStored: p.MaxStoredBytes, RetryUnknown: p.OnUnknown == "retry",
	}, nil
}

// scopeRule is the one scope rule the flags name, and its JWKS if it has
// one.
func (p *proxyCmd) scopeRule() (keyscope.Rule, *keyscope.JWKS, error) {
	given := 0
	for _, set := range []bool{p.ScopeHeader != "", p.ScopeJWKS != "", p.ScopeAuthorization} {
		if set {
			given++
		}
	}
	if given != 1 {
		return keyscope.Rule{}, nil, errors.New("give exactly one scope source: --scope-header NAME (ONCEKEY_SCOPE_HEADER), --scope-jwks FILE (ONCEKEY_SCOPE_JWKS) or --scope-authorization (ONCEKEY_SCOPE_AUTHORIZATION); keys of two callers must never meet")
	}
	var errs []error
	if len(p.ScopeHeaderFrom) > 0 && p.ScopeHeader == "" {
		errs = append(errs, errors.New("--scope-header-from (ONCEKEY_SCOPE_HEADER_FROM) is given without --scope-header (ONCEKEY_SCOPE_HEADER)"))
	}
	if (p.ScopeSecret != "" || p.ScopeSecretPrevious != "") && !p.ScopeAuthorization {
		errs = append(errs, errors.New("--scope-secret (ONCEKEY_SCOPE_SECRET) and --scope-secret-previous (ONCEKEY_SCOPE_SECRET_PREVIOUS) are for --scope-authorization (ONCEKEY_SCOPE_AUTHORIZATION)"))
	}
	if (p.ScopeIssuer != "" || p.ScopeAudience != "") && p.ScopeJWKS == "" {
		errs = append(errs, errors.New("--scope-issuer (ONCEKEY_SCOPE_ISSUER) and --scope-audience (ONCEKEY_SCOPE_AUDIENCE) are for --scope-jwks (ONCEKEY_SCOPE_JWKS)"))
	}
	if err := errors.Join(errs...); err != nil {
		return keyscope.Rule{}, nil, err
	}
	switch {
	case p.ScopeHeader != "":
		from := make([]netip.Prefix, 0, len(p.ScopeHeaderFrom))
		for _, cidr := range p.ScopeHeaderFrom {
			prefix, err := netip.ParsePrefix(strings.TrimSpace(cidr))
			if err != nil {
				return keyscope.Rule{}, nil, fmt.Errorf("--scope-header-from (ONCEKEY_SCOPE_HEADER_FROM) %q: want a CIDR such as 10.0.0.0/8 or 127.0.0.1/32", cidr)
			}
			from = append(from, prefix.Masked())
		}
		return keyscope.Rule{Source: keyscope.HeaderFrom(p.ScopeHeader, from), Guard: keyscope.HeaderGuard(p.ScopeHeader, from)}, nil, nil
	case p.ScopeAuthorization:
		if p.ScopeSecret == "" {
			return keyscope.Rule{}, nil, fmt.Errorf("--scope-authorization (ONCEKEY_SCOPE_AUTHORIZATION) needs --scope-secret (ONCEKEY_SCOPE_SECRET), the HMAC key of the scopes: %d characters or more, the same on every replica, such as `openssl rand -hex 32`", keyscope.MinSecret)
		}
		var previous [][]byte
		if p.ScopeSecretPrevious != "" {
			previous = append(previous, []byte(p.ScopeSecretPrevious))
		}
		rule, err := keyscope.Authorization([]byte(p.ScopeSecret), previous...)
		if err != nil {
			return keyscope.Rule{}, nil, fmt.Errorf("--scope-secret (ONCEKEY_SCOPE_SECRET) or --scope-secret-previous (ONCEKEY_SCOPE_SECRET_PREVIOUS): %w", err)
		}
		return rule, nil, nil
	}
	if p.ScopeJWKSRefresh <= 0 {
		return keyscope.Rule{}, nil, errors.New("--scope-jwks-refresh (ONCEKEY_SCOPE_JWKS_REFRESH) must be positive")
	}
	if p.ScopeLeeway < 0 {
		return keyscope.Rule{}, nil, errors.New("--scope-leeway (ONCEKEY_SCOPE_LEEWAY) must not be negative")
	}
	keys, err := keyscope.LoadJWKS(p.ScopeJWKS)
	if err != nil {
		return keyscope.Rule{}, nil, fmt.Errorf("--scope-jwks (ONCEKEY_SCOPE_JWKS): %w", err)
	}
	// keyscope reads a zero leeway as its default: none is the smallest
	// one it takes.
	leeway := p.ScopeLeeway
	if leeway == 0 {
		leeway = -1
	}
	rule, err := keyscope.JWT(keyscope.JWTConfig{Keys: keys, Claim: p.ScopeClaim, Issuer: p.ScopeIssuer, Audience: p.ScopeAudience, Leeway: leeway})
	if err != nil {
		return keyscope.Rule{}, nil, fmt.Errorf("--scope-jwks (ONCEKEY_SCOPE_JWKS) %s: %w", p.ScopeJWKS, err)
	}
	return rule, keys, nil
}

// redactedURL is raw with its userinfo, if any, replaced by "xxxxx", for
// messages: --upstream's userinfo is never printed (not even the user,
// which may be a token).
func redactedURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return redacted(u)
	}
	// Unparsed: whatever stands before an "@" may be a credential.
	if at := strings.LastIndex(raw, "@"); at >= 0 {
		if scheme := strings.Index(raw, "://"); scheme >= 0 && scheme < at {
			return raw[:scheme+3] + "xxxxx" + raw[at:]
		}
		return "xxxxx" + raw[at:]
	}
	return raw
}

// redacted is u with its userinfo, if any, replaced by "xxxxx".
func redacted(u *url.URL) string {
	if u.User == nil {
		return u.String()
	}
	c := *u
	c.User = url.User("xxxxx")
	return c.String()
}
