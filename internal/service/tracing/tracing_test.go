package tracing_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/service/tracing"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestRequestSpansCarryOutcomeAndQueries installs a global tracer provider,
// so it is the only test of this binary and does not run in parallel.
func TestRequestSpansCarryOutcomeAndQueries(t *testing.T) {
	exporter := tracetest.NewInMemoryExporter()
	shutdown := tracing.Install(sdktrace.NewSimpleSpanProcessor(exporter))
	t.Cleanup(func() { _ = shutdown(context.Background()) })

	ctx := context.Background()
	pool, err := postgres.Open(ctx, testdb.URL(t), postgres.WithTracing())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := postgres.New(pool, nil)
	svc := servicetest.Start(t, store, servicetest.Options{Config: httpapi.Config{Tracing: true}})

	post := func() {
		req, err := http.NewRequest(http.MethodPost, svc.URL+"/orders", strings.NewReader(`{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+svc.APIKey)
		req.Header.Set("Idempotency-Key", "traced")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	post()
	post()

	var outcomes []string
	queriesPerTrace := map[string]int{}
	serverTraces := map[string]bool{}
	for _, s := range exporter.GetSpans() {
		if s.Name == "POST /orders" {
			serverTraces[s.SpanContext.TraceID().String()] = true
			for _, a := range s.Attributes {
				if a.Key == tracing.AttrOutcome {
					outcomes = append(outcomes, a.Value.AsString())
				}
			}
			continue
		}
		if s.Parent.IsValid() {
			queriesPerTrace[s.SpanContext.TraceID().String()]++
		}
	}
	require.Equal(t, []string{"executed", "replayed"}, outcomes, "each request's span carries its idempotency outcome")
	require.Len(t, serverTraces, 2)
	for traceID := range serverTraces {
		require.Positive(t, queriesPerTrace[traceID], "database queries appear as child spans of request %s", traceID)
	}
}

func TestSetupModes(t *testing.T) {
	t.Parallel()
	off, err := tracing.Setup("", nil)
	require.NoError(t, err)
	require.NoError(t, off(context.Background()))
	_, err = tracing.Setup("jaeger", nil)
	require.Error(t, err, "an unknown mode is refused, not ignored")
}
