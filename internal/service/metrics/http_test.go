package metrics_test

import (
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

func TestHTTPRequestMetrics(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, be.open(t), options{})

			id := b.createOrder(t, uuid.NewString(), seedBody)
			b.do(t, http.StatusOK, http.MethodGet, "/orders/"+id, "")
			b.do(t, http.StatusOK, http.MethodGet, "/orders/"+id, "")
			b.do(t, http.StatusNotFound, http.MethodGet, "/orders/"+uuid.NewString(), "")
			b.do(t, http.StatusUnauthorized, http.MethodPost, "/orders", seedBody,
				idempotency.HeaderKey, uuid.NewString(), "Authorization", "")
			b.do(t, http.StatusNotFound, http.MethodGet, "/no/such/"+id, "")
			b.do(t, http.StatusNotFound, http.MethodGet, "/orders/"+id+"/items", "")
			b.do(t, http.StatusMethodNotAllowed, http.MethodDelete, "/orders", "")
			b.do(t, http.StatusOK, http.MethodGet, "/healthz", "")
			first := scrape(t, b.url)

			want := []struct {
				route, method, code string
				n                   float64
			}{
				{"/orders", "POST", "201", 1},
				{"/orders/{id}", "GET", "200", 2},
				{"/orders/{id}", "GET", "404", 1},
				{"/orders", "POST", "401", 1},
				{"unmatched", "GET", "404", 2},
				{"/healthz", "GET", "200", 1},
			}
			for _, w := range want {
				labels := []string{"route", w.route, "method", w.method, "code", w.code}
				require.Equal(t, w.n, first.value(t, "oncekey_http_requests_total", labels...),
					"requests_total%v; all series: %s", labels, first.series("oncekey_http_requests_total"))
			}
			// The 405 is counted once, under whatever bounded route chi
			// reports for it; its label is checked by the cardinality test.
			var total, n405 float64
			for _, m := range first["oncekey_http_requests_total"].GetMetric() {
				total += m.GetCounter().GetValue()
				for _, l := range m.GetLabel() {
					if l.GetName() == "code" && l.GetValue() == "405" {
						n405 += m.GetCounter().GetValue()
					}
				}
			}
			require.Equal(t, 1.0, n405, "the 405 is counted once: %s", first.series("oncekey_http_requests_total"))
			require.Equal(t, 9.0, total, "every request the test sent is counted once, the scrape itself not yet: %s",
				first.series("oncekey_http_requests_total"))
			_, ok := first.find("oncekey_http_requests_total", "route", "/metrics", "method", "GET", "code", "200")
			require.False(t, ok, "a scrape is counted after it is served, so the first scrape does not see itself")

			second := scrape(t, b.url)
			require.Equal(t, 1.0, second.value(t, "oncekey_http_requests_total", "route", "/metrics", "method", "GET", "code", "200"),
				"the first scrape is counted under route /metrics")

			// The histogram observes exactly the requests the counter counts,
			// series by series.
			require.NotNil(t, second["oncekey_http_request_duration_seconds"], "duration histogram family")
			require.Equal(t, len(second["oncekey_http_requests_total"].GetMetric()), len(second["oncekey_http_request_duration_seconds"].GetMetric()),
				"one duration series per request series")
			for _, m := range second["oncekey_http_requests_total"].GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName(), l.GetValue())
				}
				require.Equal(t, m.GetCounter().GetValue(), second.value(t, "oncekey_http_request_duration_seconds_count", labels...),
					"histogram count equals the counter for %v", labels)
				sum := second.value(t, "oncekey_http_request_duration_seconds_sum", labels...)
				require.Greater(t, sum, 0.0, "requests take some time: duration sum for %v", labels)
				require.Less(t, sum, 30.0, "duration sum for %v is in seconds", labels)
			}
		})
	}
}
