package metrics_test

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// exported is every oncekey_* family the service exports on PostgreSQL
// (metrics.New with RegisterStore, RegisterPending, RegisterReadiness and
// RegisterPool, as `oncekey serve` wires it without a replica), once it has
// served traffic.
var exported = []string{
	"oncekey_cleanup_deleted_keys_total",
	"oncekey_cleanup_lag_seconds",
	"oncekey_cleanup_last_success_timestamp_seconds",
	"oncekey_cleanup_run_deleted_keys",
	"oncekey_cleanup_run_duration_seconds",
	"oncekey_cleanup_runs_total",
	"oncekey_db_pool_acquire_duration_seconds_total",
	"oncekey_db_pool_acquired_conns",
	"oncekey_db_pool_acquires_total",
	"oncekey_db_pool_canceled_acquires_total",
	"oncekey_db_pool_empty_acquires_total",
	"oncekey_db_pool_idle_conns",
	"oncekey_db_pool_max_conns",
	"oncekey_db_pool_total_conns",
	"oncekey_db_ready",
	"oncekey_db_up",
	"oncekey_http_request_duration_seconds",
	"oncekey_http_requests_total",
	"oncekey_idempotency_duplicate_wait_seconds",
	"oncekey_idempotency_keys",
	"oncekey_idempotency_keys_table_bytes",
	"oncekey_idempotency_oldest_processing_age_seconds",
	"oncekey_idempotency_pieces_table_bytes",
	"oncekey_idempotency_repeated_requests_total",
	"oncekey_idempotency_requests_total",
	"oncekey_payment_tasks_abandoned_total",
	"oncekey_payments_oldest_pending_age_seconds",
	"oncekey_payments_pending",
	"oncekey_record_cache_requests_total",
	"oncekey_redis_breaker_open",
	"oncekey_redis_breaker_trips_total",
	"oncekey_redis_fallbacks_total",
	"oncekey_redis_requests_total",
	"oncekey_replica_breaker_open",
	"oncekey_replica_breaker_trips_total",
	"oncekey_replica_reads_total",
}

// TestLabelCardinality sends traffic full of unbounded values — keys,
// accounts, order ids, unknown paths, made-up methods — and proves that
// none of them becomes a label value: every series of every oncekey_*
// family is from a small fixed set.
func TestLabelCardinality(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			store := be.open(t)
			m := metrics.New()
			m.RegisterStore(store)
			b := setup(t, store, options{cfg: httpapi.Config{Metrics: m}})

			// Values that must never appear in a label.
			var secrets []string
			accounts := []*testBundle{b}
			for range 2 {
				other := *b
				other.account, other.apiKey = newAccount(t, store)
				accounts = append(accounts, &other)
			}
			for _, a := range accounts {
				secrets = append(secrets, a.account.String(), a.apiKey)
			}

			const n = 50
			for i := range n {
				a := accounts[i%len(accounts)]
				key := "card-" + uuid.NewString()
				secrets = append(secrets, key)
				id := a.createOrder(t, key, seedBody)
				secrets = append(secrets, id)
				a.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, key)      // replayed
				a.do(t, http.StatusConflict, http.MethodPost, "/orders", orderBody(7), idempotency.HeaderKey, key) // conflict
				a.do(t, http.StatusOK, http.MethodGet, "/orders/"+id, "")
				accounts[(i+1)%len(accounts)].do(t, http.StatusNotFound, http.MethodGet, "/orders/"+id, "") // another account's order
				a.do(t, http.StatusNotFound, http.MethodGet, "/orders/"+id+"/"+key, "")                     // unknown path
				a.do(t, http.StatusNotFound, http.MethodGet, "/"+key, "")
			}
			// Unknown methods: a client can send any token as a method.
			for i := range 20 {
				method := fmt.Sprintf("CARD%d", i)
				secrets = append(secrets, method)
				r, err := b.exchange(b.request(t, method, "/orders", ""))
				require.NoError(t, err, "%s /orders", method)
				require.GreaterOrEqual(t, r.Status, 400, "%s /orders is refused: %s", method, r)
			}

			f := scrape(t, b.url)
			var names []string
			for name, fam := range f {
				if !strings.HasPrefix(name, "oncekey_") {
					continue
				}
				names = append(names, name)
				for _, series := range fam.GetMetric() {
					for _, l := range series.GetLabel() {
						for _, s := range secrets {
							require.NotContains(t, l.GetValue(), s, "%s{%s=%q} carries a request-specific value", name, l.GetName(), l.GetValue())
						}
					}
				}
			}

			// Every label value is from its small fixed set.
			allowed := map[string]func(string) bool{
				"route": func(v string) bool {
					return slices.Contains([]string{"/orders", "/orders/{id}", "unmatched"}, v)
				},
				"method": func(v string) bool {
					return slices.Contains([]string{"GET", "POST", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "other"}, v)
				},
				"code": func(v string) bool {
					return len(v) == 3 && v[0] >= '1' && v[0] <= '5'
				},
				"operation": func(v string) bool { return slices.Contains(idempotentOperations, v) },
				"outcome": func(v string) bool {
					return slices.ContainsFunc(allOutcomes, func(o idempotency.Outcome) bool { return string(o) == v })
				},
				"result": func(v string) bool { // cleanup runs; Redis look-ups
					return slices.Contains([]string{"ok", "error", "skipped", "hit", "miss", "rejected", "bypassed"}, v)
				},
				"status":  func(v string) bool { return slices.Contains([]string{"processing", "completed", "held", "unknown"}, v) },
				"kind":    func(v string) bool { return slices.Contains([]string{"charge", "refund", "payment"}, v) },
				"refused": func(v string) bool { return v == "true" || v == "false" }, // requests repeated under new keys
				"where": func(v string) bool {
					return slices.Contains([]string{"replica", "strong", "missing", "failed", "skipped"}, v)
				},
			}
			for _, name := range names {
				for _, series := range f[name].GetMetric() {
					for _, l := range series.GetLabel() {
						ok, known := allowed[l.GetName()]
						require.True(t, known, "%s has an unexpected label %q", name, l.GetName())
						require.True(t, ok(l.GetValue()), "%s{%s=%q}: a label value outside its fixed set; all series: %s",
							name, l.GetName(), l.GetValue(), f.series(name))
					}
				}
			}
			var other float64
			for _, series := range f["oncekey_http_requests_total"].GetMetric() {
				for _, l := range series.GetLabel() {
					if l.GetName() == "method" && l.GetValue() == "other" {
						other += series.GetCounter().GetValue()
					}
				}
			}
			require.Equal(t, 20.0, other, "made-up methods are counted under method=\"other\": %s", f.series("oncekey_http_requests_total"))
			require.LessOrEqual(t, len(f["oncekey_http_requests_total"].GetMetric()), 12,
				"request series stay few however many keys, accounts and orders: %s", f.series("oncekey_http_requests_total"))
		})
	}
}

// TestExportedFamilies proves the whole set of families a PostgreSQL
// deployment exports, so a metric added without a test here fails, and
// that the Go runtime and process collectors are registered.
func TestExportedFamilies(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	store := postgres.New(pool, nil)
	m := metrics.New()
	m.RegisterStore(store)
	m.RegisterPending(store)
	m.RegisterReadiness(store.Ready)
	m.RegisterPool(pool)
	b := setup(t, store, options{cfg: httpapi.Config{Metrics: m}})
	key := uuid.NewString()
	b.createOrder(t, key, seedBody)
	b.do(t, http.StatusCreated, http.MethodPost, "/orders", seedBody, idempotency.HeaderKey, key) // a duplicate wait

	f := scrape(t, b.url)
	var got []string
	for name := range f {
		if strings.HasPrefix(name, "oncekey_") {
			got = append(got, name)
		}
	}
	sort.Strings(got)
	require.Equal(t, exported, got, "the oncekey_* families of a served PostgreSQL deployment")
	// Without Redis in front of the store, its series exist at zero.
	for _, r := range []string{"hit", "miss", "error", "rejected"} {
		require.Zero(t, f.value(t, "oncekey_redis_requests_total", "result", r), "Redis look-ups with result %s without Redis", r)
	}
	require.Zero(t, f.value(t, "oncekey_redis_fallbacks_total"), "Redis fallbacks without Redis")

	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "go_gc_duration_seconds", "go_info",
		"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds"} {
		require.NotNil(t, f[name], "%s is exported by the runtime and process collectors", name)
	}
	require.Greater(t, f.value(t, "go_goroutines"), 0.0, "goroutines are running")
	require.Greater(t, f.value(t, "process_resident_memory_bytes"), 0.0, "the process uses memory")
}
