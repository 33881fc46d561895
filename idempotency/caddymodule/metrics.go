package caddymodule

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekey/oncekey/idempotency"
)

// metrics counts what the protocol did in Caddy's metrics registry, under
// the names and labels `oncekey proxy` exports (internal/service/metrics), so that
// one dashboard and one set of alerts (deploy/prometheus) serve both.
type metrics struct {
	requests       *prometheus.CounterVec
	wait           *prometheus.HistogramVec
	settleFailures *prometheus.CounterVec
	settlesPending prometheus.Gauge
	settlesDropped *prometheus.CounterVec
	repeated       *prometheus.CounterVec
}

// outcomes are every outcome a held operation's request can have: their
// series exist from the start at zero, so that a rate or an alert sees a
// zero before the first, not an absent series.
var outcomes = []idempotency.Outcome{idempotency.OutcomeExecuted, idempotency.OutcomeReplayed,
	idempotency.OutcomeConflict, idempotency.OutcomeInFlight, idempotency.OutcomeRejected, idempotency.OutcomeError,
	idempotency.OutcomeUnknown, idempotency.OutcomeNotStored}

// newMetrics registers the families in reg, or finds them there when
// another idempotency handler of the same configuration (another site)
// registered them, and makes operation's series.
func newMetrics(reg prometheus.Registerer, operation string) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oncekey_idempotency_requests_total",
			Help: "Requests to idempotent operations by what the protocol did: executed, replayed, conflict (409), in_flight (202), rejected (4xx before the operation), error (5xx), outcome_unknown (409: it may have run upstream, and no answer came) and not_stored (409: it ran, and its response was too large to store)."},
			[]string{"operation", "outcome"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "oncekey_idempotency_duplicate_wait_seconds",
			Help:    "Time duplicates spent claiming their key, which includes waiting for an in-flight first request, by outcome. The 1.05 bucket catches waits that ran out the default 1s budget.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, .75, 1, 1.05, 1.5, 2, 5}},
			[]string{"operation", "outcome"}),
		settleFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oncekey_idempotency_settle_failures_total",
			Help: "Failed attempts to store the outcome of a held operation (its settle or release): each is kept in memory and retried with backoff until stored."},
			[]string{"operation"}),
		settlesPending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "oncekey_idempotency_settles_pending",
			Help: "Outcomes of held operations that the store has not taken yet, kept in memory and retried."}),
		repeated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oncekey_idempotency_repeated_requests_total",
			Help: "Requests that repeat, under another Idempotency-Key, a request of the same scope, operation and fingerprint made on this process within the repeat window (default 5m): most likely a client that makes a new key per attempt, whose every retry runs the operation again. refused=true: the operation refused it (409 repeated-request); false: it ran."},
			[]string{"operation", "refused"}),
		settlesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oncekey_idempotency_settles_dropped_total",
			Help: "Outcomes of held operations given up before the store took them, by reason (bound, shutdown, expired): each such key is of unknown outcome once its lease ends."},
			[]string{"operation", "reason"}),
	}
	var err error
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.wait, err = register(reg, m.wait); err != nil {
		return nil, err
	}
	if m.settleFailures, err = register(reg, m.settleFailures); err != nil {
		return nil, err
	}
	if m.settlesPending, err = register(reg, m.settlesPending); err != nil {
		return nil, err
	}
	if m.settlesDropped, err = register(reg, m.settlesDropped); err != nil {
		return nil, err
	}
	if m.repeated, err = register(reg, m.repeated); err != nil {
		return nil, err
	}
	m.repeated.WithLabelValues(operation, "false")
	m.repeated.WithLabelValues(operation, "true")
	for _, o := range outcomes {
		m.requests.WithLabelValues(operation, string(o))
	}
	m.settleFailures.WithLabelValues(operation)
	for _, reason := range []string{"bound", "shutdown", "expired"} { // idempotency.Observer.SettleDropped's
		m.settlesDropped.WithLabelValues(operation, reason)
	}
	return m, nil
}

// register registers c in reg, or returns the collector of its name
// registered there already.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// Outcome implements idempotency.Observer.
func (m *metrics) Outcome(operation string, o idempotency.Outcome) {
	m.requests.WithLabelValues(operation, string(o)).Inc()
}

// DuplicateWait implements idempotency.Observer.
func (m *metrics) DuplicateWait(operation string, o idempotency.Outcome, d time.Duration) {
	m.wait.WithLabelValues(operation, string(o)).Observe(d.Seconds())
}

// SettleFailed implements idempotency.Observer.
func (m *metrics) SettleFailed(operation string) { m.settleFailures.WithLabelValues(operation).Inc() }

// SettlesPending implements idempotency.Observer.
func (m *metrics) SettlesPending(delta int) { m.settlesPending.Add(float64(delta)) }

// Repeated implements idempotency.Observer.
func (m *metrics) Repeated(operation string, refused bool) {
	m.repeated.WithLabelValues(operation, strconv.FormatBool(refused)).Inc()
}

// SettleDropped implements idempotency.Observer.
func (m *metrics) SettleDropped(operation, reason string) {
	m.settlesDropped.WithLabelValues(operation, reason).Inc()
}

// Interface guard.
var _ idempotency.Observer = (*metrics)(nil)
