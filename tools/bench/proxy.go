package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"

	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
)

// Modes of the proxy phase: a plain httputil.ReverseProxy, its baseline,
// and the gateway (`oncekey proxy` on PostgreSQL, as it wires the store)
// in front of the same Go upstream: one that writes each order to
// PostgreSQL, as a real POST does (+db, what the gateway's targets are
// judged on), and, for the record, one that does nothing.
const (
	modePlainProxy      = "plain-proxy"
	modeFirstGateway    = "first+gateway"
	modeReplayGateway   = "replay+gateway"
	modePlainProxyDB    = "plain-proxy+db"
	modeFirstGatewayDB  = "first+gateway+db"
	modeReplayGatewayDB = "replay+gateway+db"
)

var proxyModes = []string{modePlainProxyDB, modeFirstGatewayDB, modeReplayGatewayDB, modePlainProxy, modeFirstGateway, modeReplayGateway}

// proxyBase is the plain proxy a proxy mode is compared with: the one in
// front of the same upstream.
func proxyBase(mode string) string {
	if strings.HasSuffix(mode, "+db") {
		return modePlainProxyDB
	}
	return modePlainProxy
}

// proxyRounds is the least number of rounds the proxy phase measures: its
// targets are judged on the median of at least three.
const proxyRounds = 3

// proxyResult is the proxy phase: every round's measurements at one client
// and at targetClients, and the costs per request.
type proxyResult struct {
	Results []result `json:"results"`
	Costs   []cost   `json:"costs"`
	// Trips is, for each round, the PostgreSQL round trips per first
	// request through the gateway in front of the writing upstream, at
	// targetClients: what sharing holds and settles saves.
	Trips []float64 `json:"round_trips_at_target_clients"`
}

// startProxies starts the Go upstreams, and the plain proxy and the
// gateway in front of each, and returns what stops them.
func (b *bench) startProxies(ctx context.Context) (func(), error) {
	var stops []func()
	stopAll := func() {
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}
	var err error
	b.targets[modePlainProxy], b.targets[modeFirstGateway], err = b.startGateway(http.HandlerFunc(upstreamOrders), "/orders", &stops)
	if err != nil {
		return stopAll, err
	}
	b.targets[modeReplayGateway] = b.targets[modeFirstGateway]
	writing, err := b.startWriting(ctx, &stops)
	if err != nil {
		return stopAll, err
	}
	b.targets[modePlainProxyDB], b.targets[modeFirstGatewayDB], err = b.startGateway(writing, "/orders", &stops)
	if err != nil {
		return stopAll, err
	}
	b.targets[modeReplayGatewayDB] = b.targets[modeFirstGatewayDB]
	return stopAll, nil
}

// startGateway serves upstream, a plain httputil.ReverseProxy in front of
// it and the gateway in front of it covering POST path, as `oncekey proxy`
// wires PostgreSQL; adds what stops them to stops, and returns the plain
// proxy's URL and the gateway's. The proxy phase and the large-body phase
// share it, so that both measure the gateway as it is wired.
func (b *bench) startGateway(upstream http.Handler, path string, stops *[]func()) (plainURL, gatewayURL string, err error) {
	serve := func(h http.Handler) (string, error) { return listen(h, stops) }
	upstreamURL, err := serve(upstream)
	if err != nil {
		return "", "", err
	}
	to, err := url.Parse(upstreamURL)
	if err != nil {
		return "", "", err
	}
	transport := func() *http.Transport {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 256
		*stops = append(*stops, t.CloseIdleConnections)
		return t
	}
	plain := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(to); pr.SetXForwarded() },
		Transport: transport(),
	}
	if plainURL, err = serve(plain); err != nil {
		return "", "", err
	}
	// As `oncekey proxy` wires PostgreSQL: the deferred store, with the
	// record cache in front.
	pg, err := pgstore.New(b.pool, pgstore.Options{})
	if err != nil {
		return "", "", err
	}
	deferred, err := pg.ClaimAtCommit()
	if err != nil {
		return "", "", err
	}
	cache, err := recordcache.New(recordcache.DefaultSize, nil)
	if err != nil {
		return "", "", err
	}
	scope, err := keyscope.Authorization([]byte("bench scope secret, 32 bytes long"))
	if err != nil {
		return "", "", err
	}
	gw, err := gateway.New(gateway.Config{
		Upstream: to, Routes: []gateway.Route{{Method: http.MethodPost, Path: path}},
		Scope: scope.Source, Transport: transport(), Logger: slog.New(slog.DiscardHandler),
	}, recordcache.Wrap(cache, deferred))
	if err != nil {
		return "", "", err
	}
	if gatewayURL, err = serve(gw); err != nil {
		return "", "", err
	}
	return plainURL, gatewayURL, nil
}

// upstreamOrders is the Go upstream: it reads the order and answers 201
// with it, doing no more, so that it is not what is measured.
func upstreamOrders(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/orders" {
		http.NotFound(w, r)
		return
	}
	order, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := rand.Text()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+id)
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q,"status":"created","order":%s}`, id, order)
}

// proxyPhase measures the gateway against the plain proxy, interleaved
// round by round, at one client and at targetClients, then their costs.
func (b *bench) proxyPhase(ctx context.Context) (*proxyResult, error) {
	stop, err := b.startProxies(ctx)
	defer stop()
	if err != nil {
		return nil, err
	}
	res := &proxyResult{}
	for round := range max(b.opts.rounds, proxyRounds) {
		for _, n := range []int{1, targetClients} {
			for _, mode := range proxyModes {
				trips := b.counters.RoundTrips.Load()
				rs, err := b.measureModes(ctx, []string{mode}, n, round)
				if err != nil {
					return nil, err
				}
				if mode == modeFirstGatewayDB && n == targetClients && rs[0].Requests > 0 {
					// The gateway's pool is the only one counted here: the
					// upstream's and the load generator's are not.
					res.Trips = append(res.Trips, float64(b.counters.RoundTrips.Load()-trips)/float64(rs[0].Requests))
				}
				res.Results = append(res.Results, rs...)
			}
		}
	}
	if b.opts.costs {
		if res.Costs, err = b.costs(ctx, []string{modePlainProxyDB, modeFirstGatewayDB, modeReplayGatewayDB}); err != nil {
			return nil, err
		}
		noop, err := b.costs(ctx, []string{modePlainProxy, modeFirstGateway, modeReplayGateway})
		if err != nil {
			return nil, err
		}
		res.Costs = append(res.Costs, noop...)
	}
	return res, nil
}

// markdown is the report's section on the proxy phase, with the gateway's
// chart, at chart relative to the report.
func (p *proxyResult) markdown(chart string) string {
	var s strings.Builder
	fmt.Fprintf(&s, "\n## The gateway: `oncekey proxy` against a plain reverse proxy\n\nThe same Go upstream behind a plain `httputil.ReverseProxy` (**plain-proxy**, this phase's baseline) and behind the gateway on PostgreSQL, wired as `oncekey proxy` wires it (the deferred store, the record cache in front): **first+gateway** sends a new key each time, **replay+gateway** repeats one key per client. The upstream of the **+db** modes, which the gateway's targets are judged on, does what a real POST does: it decodes the order and writes it with one durable INSERT into a table of its own (the orders table's shape, bare's statement), through a pool of its own, on the same PostgreSQL. The other upstream reads the order and answers 201 with it, doing nothing else: a gateway's cost against a request that costs nothing, for the record. %d rounds or more, interleaved; medians. Added latency is the gateway's p50 (p99) minus the plain proxy's in front of the same upstream, of the same round.\n\n", proxyRounds)
	s.WriteString("| Mode | Clients | Requests/s | Ratio to plain-proxy | p50 ms | p99 ms | Added p50 ms | Added p99 ms |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, n := range []int{1, targetClients} {
		for _, mode := range proxyModes {
			var rps, p50, p99, addP50, addP99 []float64
			base := map[int]result{}
			for _, x := range p.Results {
				if x.Mode == proxyBase(mode) && x.Clients == n {
					base[x.Round] = x
				}
			}
			for _, x := range p.Results {
				if x.Mode != mode || x.Clients != n {
					continue
				}
				rps, p50, p99 = append(rps, x.RPS), append(p50, x.P50Ms), append(p99, x.P99Ms)
				addP50, addP99 = append(addP50, x.P50Ms-base[x.Round].P50Ms), append(addP99, x.P99Ms-base[x.Round].P99Ms)
			}
			if len(rps) == 0 {
				continue
			}
			r, _ := ratioOver(p.Results, proxyBase(mode), mode, n, false)
			fmt.Fprintf(&s, "| %s | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", mode, n, median(rps), r, median(p50), median(p99), median(addP50), median(addP99))
		}
	}
	fmt.Fprintf(&s, "\n![The gateway's throughput, and its throughput over the plain proxy's with the targets, at each client count](%s)\n\n*Two panels against the number of clients: every mode's requests per second, and the gateway's over the plain proxy's in front of the same upstream, with the targets dashed (met where a line runs above its dash). Solid colors are the upstream that INSERTs each order, light ones the upstream that does nothing.*\n", chart)
	if trips, ok := p.roundTrips(); ok {
		fmt.Fprintf(&s, "\nPostgreSQL round trips per first request through the gateway (first+gateway+db) at %d clients, counted on the gateway's pool during the measurement: %.2f (median of the rounds), the hold and the settle each shared with other requests'.\n", targetClients, trips)
	}
	if len(p.Costs) > 0 {
		s.WriteString("\nCost per request, counted as in the section above, at one client; in brackets, the figure over the plain proxy's in front of the same upstream. The WAL of the +db modes includes the upstream's INSERT, so first+gateway+db's minus plain-proxy+db's is the gateway's.\n\n")
		costs := medianCosts(p.Costs)
		for _, base := range []string{modePlainProxyDB, modePlainProxy} {
			group := slices.DeleteFunc(slices.Clone(costs), func(c cost) bool { return proxyBase(c.Mode) != base })
			s.WriteString(costTable(group, base, ""))
			s.WriteString("\n")
		}
	}
	return s.String()
}

// roundTrips is the median of the rounds' PostgreSQL round trips per first
// request through the gateway at targetClients.
func (p *proxyResult) roundTrips() (float64, bool) {
	if p == nil || len(p.Trips) == 0 {
		return 0, false
	}
	return median(p.Trips), true
}
