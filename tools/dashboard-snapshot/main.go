// Command dashboard-snapshot draws the main panels of Oncekey's Grafana
// dashboard (deploy/grafana/oncekey.json) into one PNG, docs/img/dashboard.png,
// so that a reader of docs/operations.md or a reviewer of a metrics change can see
// what the dashboard shows without running Prometheus and Grafana.
//
// It starts the real service in-process on the in-memory store, sends it
// about 20 seconds of traffic (steady: first requests, reads, a few
// retries, conflicts and invalid requests; in the middle third, an injected
// storm of retries and of duplicates piled onto deliberately slow
// requests, shaded on the picture), scrapes
// GET /metrics every second, and evaluates each panel's query in Go on the
// scrapes: rates as counter deltas over a 4-scrape window (what Grafana's
// $__rate_interval is at a 1s scrape interval), quantiles with Prometheus's
// histogram_quantile interpolation over bucket deltas. It refuses to draw
// a panel whose title the embedded dashboard does not have, so the picture
// cannot drift from the dashboard unnoticed.
//
//	go -C tools build -o ../bin/dashboard-snapshot ./dashboard-snapshot && bin/dashboard-snapshot -out docs/img/dashboard.png -duration 20s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

func main() {
	out := flag.String("out", "docs/img/dashboard.png", "where to write the PNG")
	duration := flag.Duration("duration", 20*time.Second, "how long to run the synthetic load")
	flag.Parse()
	if err := run(context.Background(), *out, *duration, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard-snapshot:", err)
		os.Exit(1)
	}
}

// scrapeInterval is how often /metrics is read: every second, so a 20s run
// gives each panel about 20 points.
const scrapeInterval = time.Second

func run(ctx context.Context, out string, duration time.Duration, log io.Writer) error {
	if duration < 5*scrapeInterval {
		return errors.New("-duration must be at least 5s: rates need a few scrapes")
	}
	shown, err := dashboardPanels()
	if err != nil {
		return err
	}
	baseURL, apiKey, store, stop, err := startService(ctx)
	if err != nil {
		return err
	}
	defer stop()

	client := &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	}
	// Scraping ends with the load's last full second: requests still running
	// then (a slow first request and its duplicates) would otherwise draw
	// the load winding down.
	origin := time.Now()
	scrapeCtx, stopScraping := context.WithDeadline(ctx, origin.Add(duration+scrapeInterval/2))
	defer stopScraping()
	scrapes := make(chan []scrape, 1)
	go func() {
		scrapes <- scrapeEvery(scrapeCtx, client, baseURL, origin, scrapeInterval, freshKeyStats(store), log)
	}()

	fmt.Fprintf(log, "sending %s of synthetic load to %s\n", duration, baseURL)
	tally := sendLoad(ctx, client, baseURL, apiKey, duration)
	series := <-scrapes
	fmt.Fprint(log, tally)

	if len(series) < 5 {
		return fmt.Errorf("only %d scrapes of /metrics succeeded", len(series))
	}
	if err := render(out, shown, series, duration); err != nil {
		return err
	}
	fmt.Fprintf(log, "%d scrapes, wrote %s\n", len(series), out)
	return nil
}

// startService runs the service like `oncekey serve` does on the in-memory
// store, on a free local port, with an account to send requests as. Order
// creation is slowed down for the "SLOW" item, so that duplicates can find
// their first request still running.
func startService(ctx context.Context) (baseURL, apiKey string, store *memory.Store, stop func(), err error) {
	store = memory.New()
	creds, err := auth.CreateAccount(ctx, store, "dashboard-snapshot", "")
	if err != nil {
		return "", "", nil, nil, err
	}
	m := metrics.New()
	m.RegisterStore(store)
	handler, err := httpapi.New(httpapi.Config{
		Backend: store,
		// The slow writes run inside their claims, as a slow downstream
		// call would.
		DeferredKeys: servicetest.WrapOrders(store.DeferredKeys(), func(w orders.Writer) orders.Writer { return slowWriter{w} }),
		Logger:       slog.New(slog.DiscardHandler),
		Metrics:      m,
	})
	if err != nil {
		return "", "", nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", nil, nil, err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	stop = func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}
	return "http://" + ln.Addr().String(), creds.APIKey, store, stop, nil
}

// freshKeyStats gathers the keys-by-status gauge from a new store collector
// on every call. The service caches key statistics for 10s so that scrapes
// cost the database little; production's 15s scrapes always see fresh
// numbers, but this program's 1s scrapes would draw the cache as steps. The
// numbers come from the same store through the same collector code.
func freshKeyStats(store metrics.StatsSource) func() (*dto.MetricFamily, error) {
	return func() (*dto.MetricFamily, error) {
		m := metrics.New()
		m.RegisterStore(store)
		fams, err := m.Registry.Gather()
		if err != nil {
			return nil, err
		}
		for _, f := range fams {
			if f.GetName() == keysFamily {
				return f, nil
			}
		}
		return nil, fmt.Errorf("the store collector exported no %s", keysFamily)
	}
}

// keysFamily is the gauge of idempotency keys by status.
const keysFamily = "oncekey_idempotency_keys"

// slowSKU marks an order whose creation takes Qty × 100ms: a stand-in for a
// slow payment provider, so duplicates arrive while it still runs.
const slowSKU = "SLOW"

// slowWriter delays creating orders that contain slowSKU. The delay comes
// before the write, so it holds no store lock: only that key's duplicates
// wait, as with a slow downstream call in production.
type slowWriter struct{ orders.Writer }

func (r slowWriter) CreateOrder(ctx context.Context, o orders.Order) error {
	for _, it := range o.Items {
		if it.SKU == slowSKU {
			select {
			case <-time.After(time.Duration(it.Qty) * 100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return r.Writer.CreateOrder(ctx, o)
}
