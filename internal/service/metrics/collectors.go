package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/payments"
)

// statsCacheTTL bounds how often scrapes reach the database: several
// Prometheus servers scraping every few seconds cost one query per TTL.
const statsCacheTTL = 10 * time.Second

// cached is a reading taken at scrape time at most once per
// statsCacheTTL, so that scrapes do not each cost a query.
type cached[T any] struct {
	read func(context.Context) (T, error)

	mu sync.Mutex
	at time.Time
	v  T
	ok bool
}

// get returns the reading, taking a new one when the last is older than
// statsCacheTTL; false when that failed.
func (c *cached[T]) get() (T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < statsCacheTTL {
		return c.v, c.ok
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := c.read(ctx)
	c.at, c.v, c.ok = time.Now(), v, err == nil
	return c.v, c.ok
}

// storeCollector exports the keys table's state and whether the database
// answers, read from the store at scrape time (cached briefly).
type storeCollector struct {
	stats cached[idempotency.Stats]

	keys, tableBytes, piecesBytes, oldestProcessing, cleanupLag, up *prometheus.Desc
}

// StatsSource counts a key store's keys: every idempotency.Store does.
type StatsSource interface {
	KeyStats(ctx context.Context) (idempotency.Stats, error)
}

// RegisterStore exports source's key statistics and database health.
func (m *Metrics) RegisterStore(source StatsSource) {
	m.Registry.MustRegister(&storeCollector{
		stats:            cached[idempotency.Stats]{read: source.KeyStats},
		keys:             prometheus.NewDesc("oncekey_idempotency_keys", "Idempotency keys by status (completed is PostgreSQL's estimate on large tables); a gateway's keys also as held (running upstream now) and unknown (written upstream and never answered: each waits for an operator).", []string{"status"}, nil),
		tableBytes:       prometheus.NewDesc("oncekey_idempotency_keys_table_bytes", "Storage used by the idempotency keys table, indexes included.", nil, nil),
		piecesBytes:      prometheus.NewDesc("oncekey_idempotency_pieces_table_bytes", "Storage used by the pieces of answers stored apart from their keys (over 256 KiB, and event streams): table, TOAST and index size (in memory, the pieces' lengths).", nil, nil),
		oldestProcessing: prometheus.NewDesc("oncekey_idempotency_oldest_processing_age_seconds", "Age of the oldest key still processing (0: none).", nil, nil),
		cleanupLag:       prometheus.NewDesc("oncekey_cleanup_lag_seconds", "Age of the oldest expired key not yet deleted (0: none): how far cleanup is behind.", nil, nil),
		up:               prometheus.NewDesc("oncekey_db_up", "1 when the store answered the last metrics probe, else 0.", nil, nil),
	})
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.keys, c.tableBytes, c.piecesBytes, c.oldestProcessing, c.cleanupLag, c.up} {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	st, healthy := c.stats.get()
	up := 0.0
	if healthy {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
	if !healthy {
		return // no stale numbers presented as current
	}
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Processing), "processing")
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Completed), "completed")
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Held), "held")
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Unknown), "unknown")
	ch <- prometheus.MustNewConstMetric(c.tableBytes, prometheus.GaugeValue, float64(st.TableBytes))
	ch <- prometheus.MustNewConstMetric(c.piecesBytes, prometheus.GaugeValue, float64(st.PiecesBytes))
	ch <- prometheus.MustNewConstMetric(c.oldestProcessing, prometheus.GaugeValue, st.OldestProcessingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.cleanupLag, prometheus.GaugeValue, st.CleanupLag.Seconds())
}

// readyCollector exports whether the backend is ready for writes (what
// /readyz says), read at scrape time (cached briefly).
type readyCollector struct {
	ready cached[struct{}]
	desc  *prometheus.Desc
}

// RegisterReadiness exports ready's verdict (store.Backend.Ready): 0 while
// the database answers but cannot serve writes (read-only, or no pool
// connection to be had), which oncekey_db_up alone does not show.
func (m *Metrics) RegisterReadiness(ready func(context.Context) error) {
	m.Registry.MustRegister(&readyCollector{
		ready: cached[struct{}]{read: func(ctx context.Context) (struct{}, error) { return struct{}{}, ready(ctx) }},
		desc:  prometheus.NewDesc("oncekey_db_ready", "1 when the database could serve writes at the last metrics probe (what /readyz says), else 0: read-only, or no pool connection to be had.", nil, nil),
	})
}

func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	v := 0.0
	if _, ok := c.ready.get(); ok {
		v = 1
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v)
}

// LagSource reports how far a replica's replay is behind
// (postgres.Replica).
type LagSource interface {
	Lag(ctx context.Context) (time.Duration, error)
}

// replicaCollector exports a replica's lag, read at scrape time (cached
// briefly).
type replicaCollector struct {
	lag     cached[time.Duration]
	lagDesc *prometheus.Desc
	up      *prometheus.Desc
}

// RegisterReplica exports source's replay lag and whether it answers.
func (m *Metrics) RegisterReplica(source LagSource) {
	m.Registry.MustRegister(&replicaCollector{
		lag:     cached[time.Duration]{read: source.Lag},
		lagDesc: prometheus.NewDesc("oncekey_replica_lag_seconds", "How far the replica's replay is behind what it received from the primary (0: caught up): reads that may lag are this stale.", nil, nil),
		up:      prometheus.NewDesc("oncekey_replica_up", "1 when the replica answered the last metrics probe, else 0.", nil, nil),
	})
}

func (c *replicaCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.lagDesc; ch <- c.up }

func (c *replicaCollector) Collect(ch chan<- prometheus.Metric) {
	lag, ok := c.lag.get()
	if !ok {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.lagDesc, prometheus.GaugeValue, lag.Seconds())
}

// PendingSource reports the payments and refunds still pending.
type PendingSource interface {
	PendingStats(ctx context.Context) (payments.PendingStats, error)
}

// pendingCollector exports how many payments and refunds are pending and
// for how long, read at scrape time (cached briefly).
type pendingCollector struct {
	stats         cached[payments.PendingStats]
	pending, aged *prometheus.Desc
}

// RegisterPending exports source's pending payments and refunds.
func (m *Metrics) RegisterPending(source PendingSource) {
	m.Registry.MustRegister(&pendingCollector{
		stats:   cached[payments.PendingStats]{read: source.PendingStats},
		pending: prometheus.NewDesc("oncekey_payments_pending", "Payments and refunds still pending, by kind (payment, refund).", []string{"kind"}, nil),
		aged:    prometheus.NewDesc("oncekey_payments_oldest_pending_age_seconds", "Age of the oldest payment or refund still pending, by kind (0: none): a payment pending for long is stuck (`oncekey payments stuck`).", []string{"kind"}, nil),
	})
}

func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.pending; ch <- c.aged }

func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.stats.get()
	if !ok {
		return // oncekey_db_up says why
	}
	for kind, p := range map[string]payments.Pending{"payment": st.Payments, "refund": st.Refunds} {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(p.Count), kind)
		ch <- prometheus.MustNewConstMetric(c.aged, prometheus.GaugeValue, p.OldestAge.Seconds(), kind)
	}
}

// poolCollector exports pgxpool's statistics.
type poolCollector struct {
	pool  *pgxpool.Pool
	descs map[string]*prometheus.Desc
}

// RegisterPool exports pool's connection statistics.
func (m *Metrics) RegisterPool(pool *pgxpool.Pool) {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	m.Registry.MustRegister(&poolCollector{pool: pool, descs: map[string]*prometheus.Desc{
		"acquired":        d("oncekey_db_pool_acquired_conns", "Connections in use."),
		"idle":            d("oncekey_db_pool_idle_conns", "Idle connections."),
		"total":           d("oncekey_db_pool_total_conns", "Open connections."),
		"max":             d("oncekey_db_pool_max_conns", "The pool's size limit."),
		"acquires":        d("oncekey_db_pool_acquires_total", "Successful connection acquisitions."),
		"empty":           d("oncekey_db_pool_empty_acquires_total", "Acquisitions that had to wait for a connection."),
		"canceled":        d("oncekey_db_pool_canceled_acquires_total", "Acquisitions abandoned because their context ended."),
		"acquireDuration": d("oncekey_db_pool_acquire_duration_seconds_total", "Total time spent acquiring connections."),
	}})
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	gauge := func(name string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v)
	}
	counter := func(name string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, v)
	}
	gauge("acquired", float64(s.AcquiredConns()))
	gauge("idle", float64(s.IdleConns()))
	gauge("total", float64(s.TotalConns()))
	gauge("max", float64(s.MaxConns()))
	counter("acquires", float64(s.AcquireCount()))
	counter("empty", float64(s.EmptyAcquireCount()))
	counter("canceled", float64(s.CanceledAcquireCount()))
	counter("acquireDuration", s.AcquireDuration().Seconds())
}
