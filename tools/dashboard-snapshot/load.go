package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
)

// The kinds of request the load sends, each aimed at one protocol outcome.
const (
	kindFirst     = "first request"           // executed (201)
	kindRetry     = "retry, same request"     // replayed
	kindConflict  = "same key, other request" // conflict (409)
	kindInvalid   = "invalid request"         // rejected (400)
	kindSlowFirst = "slow first request"      // executed, 0.3–1.8s
	kindDuplicate = "duplicate while it runs" // waits, then replayed or in_flight (202)
	kindRead      = "read (GET /orders…)"     // other routes for the latency panel
)

// How hard the load pushes: about 90 requests a second in all.
const (
	workers        = 8
	pauseBetween   = 30 * time.Millisecond // per worker, plus up to as much again at random
	rememberedKeys = 1000                  // keys kept for retries and conflicts
)

// weight is how often a worker picks a kind of request.
type weight struct {
	kind string
	n    int
}

// steady is ordinary traffic: mostly first requests and reads, a few
// retries, the odd invalid request or reused key. Nothing in it is slow.
var steady = []weight{
	{kindFirst, 58}, {kindRetry, 10}, {kindConflict, 1}, {kindInvalid, 5}, {kindRead, 26},
}

// burst is the middle third of the run, the storm the picture marks: a
// client whose timeouts are too short retries everything, reuses keys for
// edited requests and piles duplicates onto requests that the service
// makes slow (0.3–1.8s) on purpose. The latency and duplicate-wait peaks
// come from it alone.
var burst = []weight{
	{kindFirst, 30}, {kindRetry, 40}, {kindConflict, 8}, {kindInvalid, 6}, {kindSlowFirst, 8}, {kindRead, 8},
}

func pick(rng *rand.Rand, ws []weight) string {
	total := 0
	for _, w := range ws {
		total += w.n
	}
	n := rng.IntN(total)
	for _, w := range ws {
		if n < w.n {
			return w.kind
		}
		n -= w.n
	}
	return ws[len(ws)-1].kind
}

// sent is a request that created an order, kept to be retried or reused.
type sent struct {
	key, body, orderID string
}

// loader sends the synthetic load and counts what came back.
type loader struct {
	client          *http.Client
	baseURL, apiKey string

	mu     sync.Mutex
	done   []sent
	counts map[string]map[int]int // kind → status → count
	errs   int
}

// sendLoad runs workers until duration has passed, switching to the burst
// mix in the middle third, and returns what they sent and got.
func sendLoad(ctx context.Context, client *http.Client, baseURL, apiKey string, duration time.Duration) *loader {
	l := &loader{client: client, baseURL: baseURL, apiKey: apiKey, counts: map[string]map[int]int{}}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 0x0ce4e7))
			for elapsed := time.Since(start); elapsed < duration && ctx.Err() == nil; elapsed = time.Since(start) {
				mix := steady
				if elapsed >= duration/3 && elapsed < 2*duration/3 {
					mix = burst
				}
				l.send(rng, pick(rng, mix))
				time.Sleep(pauseBetween + rand.N(pauseBetween))
			}
		})
	}
	wg.Wait()
	return l
}

func (l *loader) send(rng *rand.Rand, kind string) {
	switch kind {
	case kindFirst:
		key, body := uuid.NewString(), orderBody(rng, fmt.Sprintf("SKU-%d", rng.IntN(50)), 1+rng.IntN(5))
		if id := l.post(kind, key, body); id != "" {
			l.remember(sent{key, body, id})
		}
	case kindRetry, kindConflict:
		prev, ok := l.recall(rng)
		if !ok {
			l.send(rng, kindFirst)
			return
		}
		body := prev.body
		if kind == kindConflict {
			body = orderBody(rng, "SKU-EDITED", 1+rng.IntN(5))
		}
		l.post(kind, prev.key, body)
	case kindInvalid:
		switch rng.IntN(3) {
		case 0: // no Idempotency-Key on an unsafe operation
			l.post(kind, "", orderBody(rng, "SKU-1", 1))
		case 1: // malformed JSON
			l.post(kind, uuid.NewString(), `{"items":[{"sku":"SKU-1","qty":1}],"amount":`)
		default: // against the contract: qty must be at least 1
			l.post(kind, uuid.NewString(), orderBody(rng, "SKU-1", 0))
		}
	case kindSlowFirst:
		// The first request takes 0.3–1.8s; two duplicates follow 150ms
		// later and wait for it up to IDEMPOTENCY_WAIT (1s): those whose
		// first request ends in time are replayed, the others get 202.
		key, body := uuid.NewString(), orderBody(rng, slowSKU, 3+rng.IntN(16))
		var wg sync.WaitGroup
		wg.Go(func() {
			if id := l.post(kindSlowFirst, key, body); id != "" {
				l.remember(sent{key, body, id})
			}
		})
		time.Sleep(150 * time.Millisecond)
		for range 2 {
			wg.Go(func() { l.post(kindDuplicate, key, body) })
		}
		wg.Wait()
	case kindRead:
		if prev, ok := l.recall(rng); ok && rng.IntN(2) == 0 {
			l.get(kind, "/orders/"+prev.orderID)
			return
		}
		l.get(kind, "/orders?limit=20")
	}
}

func orderBody(rng *rand.Rand, sku string, qty int) string {
	return fmt.Sprintf(`{"items":[{"sku":%q,"qty":%d}],"amount":%d,"currency":"RUB"}`, sku, qty, 100*(1+rng.IntN(100)))
}

// post sends POST /orders and returns the created order's id on a 201.
func (l *loader) post(kind, key, body string) string {
	req, err := http.NewRequest(http.MethodPost, l.baseURL+"/orders", strings.NewReader(body))
	if err != nil {
		panic(err) // the URL is ours
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	status, respBody := l.do(kind, req)
	if status != http.StatusCreated {
		return ""
	}
	var o struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(respBody, &o)
	return o.ID
}

func (l *loader) get(kind, path string) {
	req, err := http.NewRequest(http.MethodGet, l.baseURL+path, nil)
	if err != nil {
		panic(err)
	}
	l.do(kind, req)
}

func (l *loader) do(kind string, req *http.Request) (int, []byte) {
	req.Header.Set("Authorization", "Bearer "+l.apiKey)
	resp, err := l.client.Do(req)
	if err != nil {
		l.mu.Lock()
		l.errs++
		l.mu.Unlock()
		return 0, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts[kind] == nil {
		l.counts[kind] = map[int]int{}
	}
	l.counts[kind][resp.StatusCode]++
	return resp.StatusCode, body
}

func (l *loader) remember(s sent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.done) == rememberedKeys {
		l.done = slices.Delete(l.done, 0, 1)
	}
	l.done = append(l.done, s)
}

func (l *loader) recall(rng *rand.Rand) (sent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.done) == 0 {
		return sent{}, false
	}
	return l.done[rng.IntN(len(l.done))], true
}

// String is the tally: one line per kind of request, statuses with counts.
func (l *loader) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, kind := range slices.Sorted(maps.Keys(l.counts)) {
		fmt.Fprintf(&b, "  %-26s", kind)
		for _, status := range slices.Sorted(maps.Keys(l.counts[kind])) {
			fmt.Fprintf(&b, " %d×%d", l.counts[kind][status], status)
		}
		b.WriteString("\n")
	}
	if l.errs > 0 {
		fmt.Fprintf(&b, "  %d requests failed without an answer\n", l.errs)
	}
	return b.String()
}
