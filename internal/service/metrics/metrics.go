// Package metrics defines every Prometheus metric Oncekey exports and the
// small adapters that feed them. Label values are always from small fixed
// sets — route patterns, methods, status codes, outcomes — never a key, an
// account or an order id, so cardinality stays bounded however much traffic
// the service sees.
package metrics

import (
	"errors"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oncekey/oncekey/idempotency"
)

// Metrics holds the service's collectors on their own registry (no global
// state, so tests and several servers in one process do not collide).
type Metrics struct {
	Registry *prometheus.Registry

	httpRequests *prometheus.CounterVec
	httpDuration *prometheus.HistogramVec
	// http holds each HTTP series' counter and histogram once
	// ObserveHTTP has met it (see httpSeriesOf).
	http   atomic.Pointer[map[httpSeries]httpObservers]
	httpMu sync.Mutex // serialises adding to http

	idemRequests *prometheus.CounterVec
	idemWait     *prometheus.HistogramVec
	repeated     *prometheus.CounterVec

	settleFailures *prometheus.CounterVec
	settlesPending prometheus.Gauge
	settlesDropped *prometheus.CounterVec
	settlesOnce    sync.Once

	redisRequests  *prometheus.CounterVec
	redisFallbacks prometheus.Counter
	redisBreaker   prometheus.Gauge
	redisTrips     prometheus.Counter
	recordCache    *prometheus.CounterVec

	replicaReads   *prometheus.CounterVec
	replicaBreaker prometheus.Gauge
	replicaTrips   prometheus.Counter

	tasksAbandoned *prometheus.CounterVec

	cleanupRuns        *prometheus.CounterVec
	cleanupDeleted     prometheus.Counter
	cleanupRunDeleted  prometheus.Histogram
	cleanupRunDuration prometheus.Histogram
	cleanupLastSuccess prometheus.Gauge
}

// New registers every metric, with the Go runtime and process collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := factory{reg}
	m := &Metrics{Registry: reg}

	m.httpRequests = f.counterVec("oncekey_http_requests_total",
		"HTTP requests by route pattern, method and status code.", "route", "method", "code")
	m.httpDuration = f.histogramVec("oncekey_http_request_duration_seconds",
		"HTTP request latency by route pattern, method and status code.",
		[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, "route", "method", "code")

	m.idemRequests = f.counterVec("oncekey_idempotency_requests_total",
		"Requests to idempotent operations by what the protocol did: executed, replayed, conflict (409), in_flight (202), rejected (4xx before the operation), error (5xx), and for the gateway's held operations outcome_unknown (409: it may have run upstream, and no answer came) and not_stored (409: it ran, and its response was too large to store).",
		"operation", "outcome")
	m.idemWait = f.histogramVec("oncekey_idempotency_duplicate_wait_seconds",
		"Time duplicates spent claiming their key, which includes waiting for an in-flight first request, by outcome. The 1.05 bucket catches waits that ran out the default 1s budget.",
		[]float64{.001, .005, .01, .025, .05, .1, .25, .5, .75, 1, 1.05, 1.5, 2, 5}, "operation", "outcome")
	m.repeated = f.counterVec("oncekey_idempotency_repeated_requests_total",
		"Requests that repeat, under another Idempotency-Key, a request of the same scope, operation and fingerprint made on this process within the repeat window (ONCEKEY_REPEAT_WINDOW, default 5m): most likely a client that makes a new key per attempt, whose every retry runs the operation again. refused=true: the operation refused it (409 repeated-request); false: it ran.",
		"operation", "refused")

	// A gateway's families, registered by HeldOperations: the service
	// has no held operation.
	m.settleFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oncekey_idempotency_settle_failures_total",
		Help: "Failed attempts to store the outcome of a gateway's held operation (its settle or release): each is kept in memory and retried with backoff until stored."},
		[]string{"operation"})
	m.settlesPending = prometheus.NewGauge(prometheus.GaugeOpts{Name: "oncekey_idempotency_settles_pending",
		Help: "Outcomes of a gateway's held operations that the store has not taken yet, kept in memory and retried: this process replays them, other replicas find their keys held, then unknown past the lease, until stored."})
	m.settlesDropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oncekey_idempotency_settles_dropped_total",
		Help: "Outcomes of a gateway's held operations given up before the store took them, by reason: bound (more were kept in memory than allowed), shutdown (the last attempt at exit failed too), expired (the key's TTL ended). Each such key is of unknown outcome once its lease ends."},
		[]string{"operation", "reason"})

	m.redisRequests = f.counterVec("oncekey_redis_requests_total",
		"Redis fast-path look-ups by result: hit, miss, error, rejected (a cached record whose HMAC did not verify: forged, or sealed under another ONCEKEY_REDIS_SECRET), skipped while the breaker leaves Redis alone, or bypassed (not looked up: replays were rare, so the claim went straight to PostgreSQL; all 0 when REDIS_URL is not set).", "result")
	m.recordCache = f.counterVec("oncekey_record_cache_requests_total",
		"Look-ups in the in-process cache of completed idempotency records by result: hit (a replay answered without a round trip) or miss.", "result")
	m.redisFallbacks = f.counter("oncekey_redis_fallbacks_total",
		"Requests the Redis fast path could not serve because Redis failed (or was left alone), answered from PostgreSQL instead.")
	m.redisBreaker = f.gauge("oncekey_redis_breaker_open",
		"1 while Redis is left alone after failing (requests go to PostgreSQL directly and a probe checks Redis in the background), else 0.")
	m.redisTrips = f.counter("oncekey_redis_breaker_trips_total",
		"Times the Redis breaker opened: Redis failed several commands in a row.")

	m.replicaReads = f.counterVec("oncekey_replica_reads_total",
		"Reads that may come from the replica (DATABASE_REPLICA_URL) by where they went: replica (it answered), or around it to the primary: strong (Consistency: strong), missing (the replica had no such row yet), failed (it failed or timed out), skipped (its breaker was open).", "where")
	m.replicaBreaker = f.gauge("oncekey_replica_breaker_open",
		"1 while the replica is left alone after failing (reads go to the primary and a probe checks the replica in the background), else 0.")
	m.replicaTrips = f.counter("oncekey_replica_breaker_trips_total",
		"Times the replica's breaker opened: several reads in a row failed or timed out.")

	m.tasksAbandoned = f.counterVec("oncekey_payment_tasks_abandoned_total",
		"Charge and refund tasks given up because the primary did not hold their payment or refund through every attempt: a payment left pending, which `oncekey payments stuck` lists.", "kind")

	m.cleanupRuns = f.counterVec("oncekey_cleanup_runs_total",
		"Cleanup runs by result: ok, error, or skipped (another replica held the cleanup lock).", "result")
	m.cleanupDeleted = f.counter("oncekey_cleanup_deleted_keys_total", "Expired idempotency keys deleted by cleanup.")
	m.cleanupRunDeleted = f.histogram("oncekey_cleanup_run_deleted_keys", "Expired keys deleted per cleanup run.",
		prometheus.ExponentialBuckets(1, 10, 8))
	m.cleanupRunDuration = f.histogram("oncekey_cleanup_run_duration_seconds", "Duration of cleanup runs.",
		prometheus.ExponentialBuckets(.001, 4, 10))
	m.cleanupLastSuccess = f.gauge("oncekey_cleanup_last_success_timestamp_seconds",
		"Unix time of the last successful cleanup run in this process (0: none yet).")

	for _, r := range []string{"ok", "error", "skipped"} {
		m.cleanupRuns.WithLabelValues(r)
	}
	for _, r := range []string{"hit", "miss", "error", "rejected", "skipped", "bypassed"} {
		m.redisRequests.WithLabelValues(r)
	}
	for _, r := range []string{"hit", "miss"} {
		m.recordCache.WithLabelValues(r)
	}
	for _, k := range []string{"charge", "refund"} {
		m.tasksAbandoned.WithLabelValues(k)
	}
	// The names postgres.Replica reports (internal/service/metrics imports no store).
	for _, w := range []string{"replica", "strong", "missing", "failed", "skipped"} {
		m.replicaReads.WithLabelValues(w)
	}
	return m
}

// Handler serves the registry in the Prometheus text format (GET /metrics).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// ObserveHTTP records one finished request. route is the matched pattern,
// or "" when nothing matched.
func (m *Metrics) ObserveHTTP(route, method string, status int, d time.Duration) {
	if route == "" {
		route = "unmatched"
	}
	o := m.httpSeriesOf(httpSeries{route: route, method: methodLabel(method), status: status})
	o.requests.Inc()
	o.duration.Observe(d.Seconds())
}

// httpSeries is the labels of an HTTP request's series.
type httpSeries struct {
	route, method string
	status        int
}

// httpObservers are the counter and histogram of one httpSeries.
type httpObservers struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// httpSeriesOf returns the counter and histogram of s, looked up in the
// vectors (formatting the status code, hashing the labels twice) only the
// first time: the labels are bounded (route patterns, methodLabel, status
// codes), and so is the map, copied on each new series so that a request
// reads it without a lock.
func (m *Metrics) httpSeriesOf(s httpSeries) httpObservers {
	if known := m.http.Load(); known != nil {
		if o, ok := (*known)[s]; ok {
			return o
		}
	}
	m.httpMu.Lock()
	defer m.httpMu.Unlock()
	next := map[httpSeries]httpObservers{}
	if known := m.http.Load(); known != nil {
		if o, ok := (*known)[s]; ok {
			return o
		}
		maps.Copy(next, *known)
	}
	code := strconv.Itoa(s.status)
	o := httpObservers{
		requests: m.httpRequests.WithLabelValues(s.route, s.method, code),
		duration: m.httpDuration.WithLabelValues(s.route, s.method, code),
	}
	next[s] = o
	m.http.Store(&next)
	return o
}

// methodLabel bounds the method label: any token is a valid HTTP method, so
// a client sending made-up methods would otherwise create a series for each.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method
	}
	return "other"
}

// Operations makes every outcome series of each idempotent operation exist
// from the start at zero, so rates and alerts see a zero, not an absent
// series.
func (m *Metrics) Operations(names ...string) {
	for _, name := range names {
		for _, o := range outcomes {
			m.idemRequests.WithLabelValues(name, string(o))
		}
		m.repeated.WithLabelValues(name, "false")
		m.repeated.WithLabelValues(name, "true")
	}
}

// outcomes are the idempotency outcomes an operation's request can have.
var outcomes = []idempotency.Outcome{idempotency.OutcomeExecuted, idempotency.OutcomeReplayed,
	idempotency.OutcomeConflict, idempotency.OutcomeInFlight, idempotency.OutcomeRejected, idempotency.OutcomeError,
	idempotency.OutcomeUnknown, idempotency.OutcomeNotStored}

// Outcome implements idempotency.Observer.
func (m *Metrics) Outcome(operation string, o idempotency.Outcome) {
	m.idemRequests.WithLabelValues(operation, string(o)).Inc()
}

// Repeated implements idempotency.Observer.
func (m *Metrics) Repeated(operation string, refused bool) {
	m.repeated.WithLabelValues(operation, strconv.FormatBool(refused)).Inc()
}

// SettleFailed implements idempotency.Observer.
func (m *Metrics) SettleFailed(operation string) { m.settleFailures.WithLabelValues(operation).Inc() }

// SettlesPending implements idempotency.Observer.
func (m *Metrics) SettlesPending(delta int) { m.settlesPending.Add(float64(delta)) }

// SettleDropped implements idempotency.Observer.
func (m *Metrics) SettleDropped(operation, reason string) {
	m.settlesDropped.WithLabelValues(operation, reason).Inc()
}

// HeldOperations exports the families of a gateway's held operations'
// settles (once), and makes the series of each of names exist from the
// start at zero, as Operations does for the outcomes.
func (m *Metrics) HeldOperations(names ...string) {
	m.settlesOnce.Do(func() { m.Registry.MustRegister(m.settleFailures, m.settlesPending, m.settlesDropped) })
	for _, name := range names {
		m.settleFailures.WithLabelValues(name)
		for _, reason := range []string{"bound", "shutdown", "expired"} { // idempotency.Observer.SettleDropped's
			m.settlesDropped.WithLabelValues(name, reason)
		}
	}
}

// Metrics counts held operations' settles too.
var _ idempotency.Observer = (*Metrics)(nil)

// DuplicateWait implements idempotency.Observer.
func (m *Metrics) DuplicateWait(operation string, o idempotency.Outcome, d time.Duration) {
	m.idemWait.WithLabelValues(operation, string(o)).Observe(d.Seconds())
}

// Redis implements redisstore.Observer.
func (m *Metrics) Redis(result string) { m.redisRequests.WithLabelValues(result).Inc() }

// RecordCache implements recordcache.Observer.
func (m *Metrics) RecordCache(result string) { m.recordCache.WithLabelValues(result).Inc() }

// Fallback implements redisstore.Observer.
func (m *Metrics) Fallback() { m.redisFallbacks.Inc() }

// Breaker implements redisstore.Observer.
func (m *Metrics) Breaker(open bool) { breakerChanged(m.redisBreaker, m.redisTrips, open) }

// breakerChanged records that a breaker opened (a trip) or closed.
func breakerChanged(state prometheus.Gauge, trips prometheus.Counter, open bool) {
	if open {
		state.Set(1)
		trips.Inc()
		return
	}
	state.Set(0)
}

// ReplicaRead implements postgres.ReplicaObserver.
func (m *Metrics) ReplicaRead(where string) { m.replicaReads.WithLabelValues(where).Inc() }

// ReplicaBreaker implements postgres.ReplicaObserver.
func (m *Metrics) ReplicaBreaker(open bool) { breakerChanged(m.replicaBreaker, m.replicaTrips, open) }

// TaskAbandoned implements payments.Observer.
func (m *Metrics) TaskAbandoned(kind string) { m.tasksAbandoned.WithLabelValues(kind).Inc() }

// CleanupRun is idempotency.Cleanup's Observe: it counts a run by its
// result ("ok", "skipped" when another replica held the cleanup lock,
// "error").
func (m *Metrics) CleanupRun(deleted int64, d time.Duration, err error) {
	result := "ok"
	switch {
	case errors.Is(err, idempotency.ErrCleanupBusy):
		result = "skipped"
	case err != nil:
		result = "error"
	}
	m.cleanupRuns.WithLabelValues(result).Inc()
	// Each batch commits on its own, so a run that fails part-way has
	// still deleted the keys of its earlier batches.
	m.cleanupDeleted.Add(float64(deleted))
	if err != nil {
		return
	}
	m.cleanupRunDeleted.Observe(float64(deleted))
	m.cleanupRunDuration.Observe(d.Seconds())
	m.cleanupLastSuccess.SetToCurrentTime()
}

// factory registers what it creates.
type factory struct{ reg prometheus.Registerer }

func (f factory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	f.reg.MustRegister(h)
	return h
}

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
	f.reg.MustRegister(h)
	return h
}

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}
