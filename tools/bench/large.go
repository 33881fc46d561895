package main

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oncekey/oncekey/idempotency"
)

// The large-body phase: the gateway stores an answer over 256 KiB in
// pieces in PostgreSQL as it passes, each committed before the client
// gets it, and replays it a piece at a time from the store (issue #59).
// Its promise is that a replay is no slower than the first request and
// that memory holds a piece per request, not the body: this phase
// measures both, against a plain reverse proxy in front of the same
// upstream.

// largeSizes are the answers' sizes the phase measures: a body of a few
// pieces and one of forty.
var largeSizes = []int64{1 << 20, 10 << 20}

// largeClients are the concurrencies of the phase: a lone client, and
// enough that bodies held whole would show (8 × 10 MiB = 80 MiB).
var largeClients = []int{1, 8}

// largeModes are measured at each size and concurrency, in this order.
var largeModes = []string{modePlainProxy, modeFirstGateway, modeReplayGateway}

// largeRounds is the least number of rounds of the phase; its targets are
// judged on the median of at least three.
const largeRounds = 3

// largeMinRequests is the fewest requests each client makes in a
// measured loop, past its duration if need be: a first request of 10 MiB
// takes the better part of a second on a busy machine, and a median of
// two would say little.
const largeMinRequests = 5

// maxExport bounds the size the upstream generates, so that a mistyped
// query does not fill the disk.
const maxExport = 64 << 20

// largeHeapShare is the most the live heap may grow while a gateway mode
// runs with 10 MiB answers at the phase's largest concurrency, as a share
// of what holding each body whole would take (size × clients): a body
// held whole costs 1, a piece or two per request in flight (256 KiB
// each) about 0.05.
const largeHeapShare = 0.25

// largeResult is one measurement of the phase: a mode at a size and a
// concurrency, with the memory the process took while it ran.
type largeResult struct {
	result
	Size      int64   `json:"size_bytes"`
	MiBPerSec float64 `json:"mib_per_s"`
	// HeapGrowthMiB is the peak of the live heap (as each collection
	// finds it) while the mode ran, over the live heap before it.
	HeapGrowthMiB float64 `json:"live_heap_growth_mib"`
	// RSSGrowthMiB is the peak resident set size of the process while
	// the mode ran, over its RSS before it, once the process was collected
	// and its free memory returned.
	RSSGrowthMiB float64 `json:"rss_growth_mib"`
}

// largePhaseResult is every round's measurements of the phase.
type largePhaseResult struct {
	Results []largeResult `json:"results"`
}

// upstreamExports is the large-body phase's Go upstream: POST
// /exports?size=N answers 200 with N bytes, generated 32 KiB at a time as
// they are written, never held whole. The bytes are a ChaCha8 stream
// seeded by the size, so every answer of a size is the same (a replay can
// be compared with the first) and none compresses: PostgreSQL stores the
// pieces as sent, as it would an already compressed export.
func upstreamExports(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/exports" {
		http.NotFound(w, r)
		return
	}
	size, err := strconv.ParseInt(r.URL.Query().Get("size"), 10, 64)
	if err != nil || size < 0 || size > maxExport {
		http.Error(w, fmt.Sprintf("size: want a number of bytes up to %d", maxExport), http.StatusBadRequest)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	var seed [32]byte
	copy(seed[:], strconv.FormatInt(size, 10))
	gen := rand.NewChaCha8(seed)
	buf := make([]byte, 32<<10)
	for left := size; left > 0; {
		chunk := buf[:min(left, int64(len(buf)))]
		_, _ = gen.Read(chunk)
		if _, err := w.Write(chunk); err != nil {
			return // the client left
		}
		left -= int64(len(chunk))
	}
}

// largePhase measures the plain proxy and the gateway's first requests and
// replays with large answers, interleaved round by round, at every size
// and concurrency.
func (b *bench) largePhase(ctx context.Context) (*largePhaseResult, error) {
	var stops []func()
	defer func() {
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}()
	plain, gw, err := b.startGateway(http.HandlerFunc(upstreamExports), "/exports", &stops)
	if err != nil {
		return nil, err
	}
	targets := map[string]string{modePlainProxy: plain, modeFirstGateway: gw, modeReplayGateway: gw}
	res := &largePhaseResult{}
	for round := range max(b.opts.rounds, largeRounds) {
		for _, size := range largeSizes {
			for _, n := range largeClients {
				for _, mode := range largeModes {
					r, err := measureLarge(ctx, b.client, targets[mode], b.creds.APIKey, mode, size, n, b.opts.duration)
					if err != nil {
						return nil, fmt.Errorf("%s of %s at %d clients: %w", mode, sizeName(size), n, err)
					}
					r.Round = round + 1
					b.log.Info("measured", "phase", "large", "round", r.Round, "mode", mode, "size", sizeName(size), "clients", n,
						"rps", fmt.Sprintf("%.1f", r.RPS), "mib_per_s", fmt.Sprintf("%.0f", r.MiBPerSec), "p99_ms", fmt.Sprintf("%.1f", r.P99Ms),
						"live_heap_growth_mib", fmt.Sprintf("%.1f", r.HeapGrowthMiB), "rss_growth_mib", fmt.Sprintf("%.1f", r.RSSGrowthMiB))
					res.Results = append(res.Results, r)
				}
			}
		}
	}
	return res, nil
}

// measureLarge runs n closed-loop clients against target for d, each
// asking for size bytes and reading every answer whole, while watching
// the process's memory. Replays repeat one key per client, its first
// request sent beforehand and not measured; every answer must be whole
// and replayed exactly when the mode says, or the run fails.
func measureLarge(ctx context.Context, client *http.Client, target, apiKey, mode string, size int64, n int, d time.Duration) (largeResult, error) {
	replay := mode == modeReplayGateway
	keys := make([]string, n)
	for i := range keys {
		keys[i] = mode + "-" + cryptorand.Text()
		if replay {
			if err := sendLarge(ctx, client, target, apiKey, keys[i], size, false); err != nil {
				return largeResult{}, fmt.Errorf("the first request of a replayed key: %w", err)
			}
		}
	}
	watch, err := watchMemory()
	if err != nil {
		return largeResult{}, err
	}
	// Warm up first (connections dialled), unmeasured but watched: memory
	// held then counts as well.
	if _, _, err := loopLarge(ctx, client, target, apiKey, keys, size, replay, min(d/3, time.Second), 1); err != nil {
		watch.stop()
		return largeResult{}, err
	}
	latencies, elapsed, err := loopLarge(ctx, client, target, apiKey, keys, size, replay, d, largeMinRequests)
	heap, rss := watch.stop()
	if err != nil {
		return largeResult{}, err
	}
	r, err := summarize(mode, n, latencies, elapsed)
	if err != nil {
		return largeResult{}, err
	}
	return largeResult{result: r, Size: size, MiBPerSec: r.RPS * float64(size) / (1 << 20), HeapGrowthMiB: heap, RSSGrowthMiB: rss}, nil
}

// loopLarge is loop for large answers: one closed-loop client per key for
// d and for at least least requests, each under a new key unless replay.
func loopLarge(ctx context.Context, client *http.Client, target, apiKey string, keys []string, size int64, replay bool, d time.Duration, least int) ([][]time.Duration, time.Duration, error) {
	latencies := make([][]time.Duration, len(keys))
	errs := make([]error, len(keys))
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			for len(latencies[i]) < least || time.Now().Before(deadline) {
				key := keys[i]
				if !replay {
					key = cryptorand.Text()
				}
				began := time.Now()
				if err := sendLarge(ctx, client, target, apiKey, key, size, replay); err != nil {
					errs[i] = err
					return
				}
				latencies[i] = append(latencies[i], time.Since(began))
			}
		})
	}
	wg.Wait()
	return latencies, time.Since(start), errors.Join(errs...)
}

// sendLarge asks for an export of size bytes under key, reads the answer
// whole and checks it: 200, exactly size bytes, replayed exactly when
// wantReplay.
func sendLarge(ctx context.Context, client *http.Client, target, apiKey, key string, size int64, wantReplay bool) error {
	// No body: a plain httputil.ReverseProxy that starts its answer while
	// its transport still reads the request's body from the server has
	// the server close that body under it, and the transport then drops
	// the upstream's connection mid-answer (golang/go#40747); it did here,
	// about one request in three hundred. The gateway reads a body whole
	// before it forwards it, so only the baseline would be hurt.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/exports?size="+strconv.FormatInt(size, 10), http.NoBody)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	got, err := io.Copy(io.Discard, resp.Body)
	switch {
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("POST /exports answered %d", resp.StatusCode)
	case err != nil:
		return fmt.Errorf("POST /exports: the body broke off after %d of %d bytes: %w", got, size, err)
	case got != size:
		return fmt.Errorf("POST /exports: the body has %d bytes, want %d", got, size)
	case (resp.Header.Get(idempotency.HeaderReplayed) == "true") != wantReplay:
		return fmt.Errorf("POST /exports: replayed %q, want a replay: %t", resp.Header.Get(idempotency.HeaderReplayed), wantReplay)
	}
	return nil
}

// memWatch samples the process's memory while a mode runs: the live heap
// as the last collection found it, and the resident set size.
type memWatch struct {
	baseHeap, baseRSS float64 // MiB
	peakHeap, peakRSS float64
	done, stopped     chan struct{}
	samples           []metrics.Sample
}

// liveHeapMetric is the heap the last collection found live: unlike the
// heap in use, it does not count the garbage the collector lets pile up
// until its next cycle (GOGC), so that it follows what is held.
const liveHeapMetric = "/gc/heap/live:bytes"

// watchMemory collects the process and returns its free memory to the
// system, so that what a mode takes starts from the same floor, then
// samples every few milliseconds until stop.
func watchMemory() (*memWatch, error) {
	runtime.GC()
	debug.FreeOSMemory()
	m := &memWatch{done: make(chan struct{}), stopped: make(chan struct{}),
		samples: []metrics.Sample{{Name: liveHeapMetric}}}
	heap, rss, err := m.sample()
	if err != nil {
		return nil, err
	}
	m.baseHeap, m.baseRSS, m.peakHeap, m.peakRSS = heap, rss, heap, rss
	go func() {
		defer close(m.stopped)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-tick.C:
				if heap, rss, err := m.sample(); err == nil {
					m.peakHeap, m.peakRSS = max(m.peakHeap, heap), max(m.peakRSS, rss)
				}
			}
		}
	}()
	return m, nil
}

func (m *memWatch) sample() (heap, rss float64, err error) {
	metrics.Read(m.samples)
	if m.samples[0].Value.Kind() != metrics.KindUint64 {
		return 0, 0, fmt.Errorf("runtime/metrics: no %s", liveHeapMetric)
	}
	rss, err = rssMiB(os.Getpid())
	return float64(m.samples[0].Value.Uint64()) / (1 << 20), rss, err
}

// stop ends the sampling and returns the peak growth of the live heap and
// of the RSS, in MiB.
func (m *memWatch) stop() (heap, rss float64) {
	close(m.done)
	<-m.stopped
	if heap, rss, err := m.sample(); err == nil {
		m.peakHeap, m.peakRSS = max(m.peakHeap, heap), max(m.peakRSS, rss)
	}
	return m.peakHeap - m.baseHeap, m.peakRSS - m.baseRSS
}

// sizeName is a size as the report names it.
func sizeName(size int64) string {
	if size%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", size>>20)
	}
	return fmt.Sprintf("%d bytes", size)
}

// largeOf is the phase's measurements at one size, as results whose ratios
// ratioOver takes.
func (p *largePhaseResult) largeOf(size int64) []result {
	var rs []result
	for _, x := range p.Results {
		if x.Size == size {
			rs = append(rs, x.result)
		}
	}
	return rs
}

// replayOverFirst is the median over rounds of the gateway's replays'
// throughput over its first requests' of the same round.
func (p *largePhaseResult) replayOverFirst(size int64, clients int) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return ratioOver(p.largeOf(size), modeFirstGateway, modeReplayGateway, clients, false)
}

// heapShare is the largest live-heap growth of a gateway mode over any
// round, at a size and concurrency, over size × clients: what holding
// every body in flight whole would take.
func (p *largePhaseResult) heapShare(size int64, clients int) (float64, bool) {
	if p == nil {
		return 0, false
	}
	var peak float64
	found := false
	for _, x := range p.Results {
		if x.Size == size && x.Clients == clients && (x.Mode == modeFirstGateway || x.Mode == modeReplayGateway) {
			peak, found = max(peak, x.HeapGrowthMiB), true
		}
	}
	return peak / (float64(size) * float64(clients) / (1 << 20)), found
}

// rounds is how many rounds the phase measured.
func (p *largePhaseResult) rounds() int {
	n := 0
	for _, x := range p.Results {
		n = max(n, x.Round)
	}
	return n
}

// markdown is the report's section on the phase.
func (p *largePhaseResult) markdown() string {
	var s strings.Builder
	fmt.Fprintf(&s, "\n## Large answers: stored in pieces as they pass, replayed from the store\n\n"+
		"The Go upstream answers `POST /exports?size=N` with N bytes, generated 32 KiB at a time as they are written (a ChaCha8 stream: nothing PostgreSQL could compress, as an export already compressed), behind a plain `httputil.ReverseProxy` (**plain-proxy**) and behind the gateway on PostgreSQL, wired as `oncekey proxy` wires it (the deferred store, the record cache in front). An answer over 256 KiB is stored by **first+gateway** in pieces of 256 KiB as it passes, each committed before the client gets it; **replay+gateway** repeats one key per client and is answered a piece at a time from PostgreSQL. The load generator reads every body whole and checks its length (and that replays, and only they, say so); each client makes at least %d requests in a measurement, past its duration if need be. %d rounds, interleaved; throughput and latency are medians, ratios medians of the per-round ratios, memory the largest of the rounds.\n\n"+
		"Memory, with the load generator, the upstream and both proxies in this one process: before each mode the process is collected and its free memory returned to the system; then **live heap** is how far the heap the collector finds live rose during the mode, and **RSS** how far the resident set rose (it also holds the garbage the collector lets accumulate between cycles, up to the size of the live heap with GOGC=100). **Held whole** is size × clients, what keeping each body in memory whole would take.\n\n", largeMinRequests, p.rounds())
	s.WriteString("| Size | Clients | Mode | Requests/s | MiB/s | p50 ms | p99 ms | Ratio to plain-proxy | replay ÷ first | Live heap MiB | RSS MiB | Held whole MiB |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, size := range largeSizes {
		all := p.largeOf(size)
		for _, n := range largeClients {
			for _, mode := range largeModes {
				var rps, mibs, p50, p99 []float64
				var heap, rss float64
				for _, x := range p.Results {
					if x.Size != size || x.Mode != mode || x.Clients != n {
						continue
					}
					rps, mibs, p50, p99 = append(rps, x.RPS), append(mibs, x.MiBPerSec), append(p50, x.P50Ms), append(p99, x.P99Ms)
					heap, rss = max(heap, x.HeapGrowthMiB), max(rss, x.RSSGrowthMiB)
				}
				if len(rps) == 0 {
					continue
				}
				overPlain, overFirst := "–", "–"
				if mode != modePlainProxy {
					r, _ := ratioOver(all, modePlainProxy, mode, n, false)
					overPlain = fmt.Sprintf("%.2f", r)
				}
				if mode == modeReplayGateway {
					r, _ := ratioOver(all, modeFirstGateway, mode, n, false)
					overFirst = fmt.Sprintf("%.2f", r)
				}
				fmt.Fprintf(&s, "| %s | %d | %s | %.1f | %.0f | %.1f | %.1f | %s | %s | %.1f | %.1f | %d |\n",
					sizeName(size), n, mode, median(rps), median(mibs), median(p50), median(p99), overPlain, overFirst, heap, rss, int64(n)*size>>20)
			}
		}
	}
	return s.String()
}
