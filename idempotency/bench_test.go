package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/recordcache"
)

// BenchmarkFingerprint measures Request.Fingerprint as the engine computes
// it for POST /orders: canonicalisation plus SHA-256 over the parts. B/s
// makes the small and the large body comparable.
func BenchmarkFingerprint(b *testing.B) {
	cases := []struct {
		name string
		body []byte
	}{
		{"small", []byte(`{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`)},
		{"16KiB", benchOrderBody(100)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := (idempotency.Request{Method: http.MethodPost, Route: "/orders", Path: "/orders", Body: c.body}).Fingerprint(); err != nil {
					b.Fatalf("Fingerprint: %v", err)
				}
			}
		})
	}
}

// BenchmarkParseKey measures ParseKey on a typical key (a UUID) and on the
// longest one allowed, since the check walks every byte.
func BenchmarkParseKey(b *testing.B) {
	cases := []struct {
		name string
		key  string
	}{
		{"uuid", "0190f7a4-6f0e-7c8a-9b1d-2f4e6a8c0b1d"},
		{"max", strings.Repeat("k", 255)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := http.Header{}
			h.Set(idempotency.HeaderKey, c.key)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := idempotency.ParseKey(h.Values(idempotency.HeaderKey)); err != nil {
					b.Fatalf("ParseKey: %v", err)
				}
			}
		})
	}
}

// benchOrderBody is an order of n items, about 166 bytes each, so that 100
// items make a body of about 16 KiB (the same shape as canonjson's
// benchmark uses).
func benchOrderBody(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"items":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"sku":"SKU-%04d","qty":%d,"price":%d,"name":"Item %d","note":"%s"}`,
			i, i%9+1, 100+i*7, i, strings.Repeat("gift wrap ", 10))
	}
	sb.WriteString(`],"amount":1200,"currency":"RUB"}`)
	return []byte(sb.String())
}

// benchOrder is the body of BenchmarkEngine's requests: a small order,
// as a client of POST /orders sends it.
const benchOrder = `{"customer":"cus_42","items":[{"sku":"SKU-1","qty":2},{"sku":"SKU-7","qty":1}],"amount":1200,"currency":"RUB"}`

// benchCreated and benchLocation are what BenchmarkEngine's operation
// answers.
const (
	benchCreated  = `{"id":"ord_0190f7a4","status":"created","amount":1200,"currency":"RUB"}`
	benchLocation = "/orders/ord_0190f7a4"
)

// benchResident is how many completed keys a store holds while
// BenchmarkEngine measures: the garbage collector walks what a store
// keeps at every cycle, so an empty store would hide what keeping records
// costs. A service that takes a few requests a second keeps about this
// many for the default TTL of 48 hours.
const benchResident = 100_000

// benchTTL is how long the records of BenchmarkEngine's first requests are
// kept, and benchPurgeEvery how often (in requests) the expired ones are
// purged, as a service's cleanup does: the store then stays near
// benchResident keys however long the benchmark runs, rather than growing
// a map whose rehashing would be most of what is measured.
const (
	benchTTL        = 100 * time.Millisecond
	benchPurgeEvery = 4096
)

// BenchmarkEngine measures the engine's own cost in process, with no
// database: a trivial operation (it reads the order and answers 201 with
// a Location and a small JSON body) served bare, and through
// Operation.Handler on memstore, alone and with recordcache in front
// ("cached/"). "first" claims a new key each time, "replay" answers a key
// that holds a record; the store keeps benchResident other records all
// along. Each request, bare or not, is built the same way with httptest
// (key included), so what separates the sub-benchmarks is what the engine
// adds: compare "first" and "replay" with "bare".
func BenchmarkEngine(b *testing.B) {
	operation := func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", benchLocation)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, benchCreated)
	}
	request := func(key string) *http.Request {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(benchOrder))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer ok_bench")
		req.Header.Set(idempotency.HeaderKey, key)
		return req
	}
	// serve checks only the status in the loop, so that a broken handler
	// cannot benchmark fast; check checks the whole answer, once, before.
	serve := func(b *testing.B, h http.Handler, key string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request(key))
		if rec.Code != http.StatusCreated {
			b.Fatalf("key %q: status %d, want 201: %s", key, rec.Code, rec.Body)
		}
	}
	check := func(b *testing.B, h http.Handler, key, replayed string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request(key))
		if rec.Code != http.StatusCreated || rec.Body.String() != benchCreated ||
			rec.Header().Get("Location") != benchLocation || rec.Header().Get(idempotency.HeaderReplayed) != replayed {
			b.Fatalf("key %q: %d, Location %q, replayed %q; want 201, %q, replayed %q: %s",
				key, rec.Code, rec.Header().Get("Location"), rec.Header().Get(idempotency.HeaderReplayed), benchLocation, replayed, rec.Body)
		}
	}
	// engine returns the operation under the protocol on a fresh memstore
	// holding benchResident records (keys "resident-0", ...), with a
	// record cache in front when cached, and the memstore.
	engine := func(b *testing.B, cached bool, ttl time.Duration) (http.Handler, *memstore.Store) {
		keys := memstore.New()
		var store idempotency.Store[*memstore.Tx] = keys
		if cached {
			cache, err := recordcache.New(recordcache.DefaultSize, nil)
			if err != nil {
				b.Fatal(err)
			}
			store = recordcache.Wrap(cache, store)
		}
		// The resident records are what the operation stores, committed
		// straight to the store: the protocol around each would only make
		// the set-up longer.
		fp, err := idempotency.Request{Method: http.MethodPost, Route: "/orders", Path: "/orders", Body: []byte(benchOrder)}.Fingerprint()
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		for i := range benchResident {
			lease, _, err := store.Claim(ctx, idempotency.ClaimRequest{
				Scope: "acct_bench", Key: "resident-" + strconv.Itoa(i), Fingerprint: fp,
				Method: http.MethodPost, Route: "/orders", TTL: 48 * time.Hour, Wait: time.Second,
			})
			if err != nil || lease == nil {
				b.Fatalf("claim resident %d: %v", i, err)
			}
			err = lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{
				"Content-Type": {"application/json"}, "Location": {benchLocation},
			}, Body: []byte(benchCreated)})
			if err != nil {
				b.Fatalf("commit resident %d: %v", i, err)
			}
		}
		e := idempotency.New(idempotency.Config{
			Scope:  func(*http.Request) (string, error) { return "acct_bench", nil },
			Logger: slog.New(slog.DiscardHandler),
		})
		h := idempotency.NewOperation(e, store, idempotency.OperationConfig{TTL: ttl}).Handler(http.HandlerFunc(operation))
		check(b, h, "check", "")
		check(b, h, "check", "true")
		check(b, h, "resident-0", "true")
		return h, keys
	}
	// loop runs one request per iteration, and reports besides the time
	// the CPU time the process spent per request: on more than one core,
	// the garbage collector's background work runs beside the loop, and
	// the time alone would not show it. A request returns the CPU time it
	// spent on anything but itself (a purge), which is not counted.
	loop := func(b *testing.B, request func(i int) (untimed int64)) {
		b.ReportAllocs()
		start, ok := processCPU()
		var untimed int64
		i := 0
		for b.Loop() {
			untimed += request(i)
			i++
		}
		if end, ok2 := processCPU(); ok && ok2 {
			b.ReportMetric(float64(end-start-untimed)/float64(b.N), "cpu-ns/op")
		}
	}
	first := func(cached bool) func(b *testing.B) {
		return func(b *testing.B) {
			h, keys := engine(b, cached, benchTTL)
			var next benchKeys
			loop(b, func(i int) int64 {
				serve(b, h, next.key())
				if (i+1)%benchPurgeEvery != 0 {
					return 0
				}
				b.StopTimer()
				defer b.StartTimer()
				start, _ := processCPU()
				if _, err := keys.PurgeExpired(context.Background(), 0); err != nil {
					b.Fatal(err)
				}
				end, _ := processCPU()
				return end - start
			})
		}
	}
	replay := func(cached bool) func(b *testing.B) {
		return func(b *testing.B) {
			h, _ := engine(b, cached, 48*time.Hour)
			loop(b, func(int) int64 {
				serve(b, h, "resident-0")
				return 0
			})
		}
	}

	b.Run("bare", func(b *testing.B) {
		h := http.HandlerFunc(operation)
		check(b, h, "bare", "")
		var next benchKeys
		loop(b, func(int) int64 {
			serve(b, h, next.key())
			return 0
		})
	})
	b.Run("first", first(false))
	b.Run("replay", replay(false))
	b.Run("cached/first", first(true))
	b.Run("cached/replay", replay(true))
}

// benchKeys hands out distinct keys ("first-00000000", ...) cut from
// strings built a thousand at a time, so that a request allocates nothing
// for its key that a client's request would not hold already.
type benchKeys struct {
	chunk string
	n     int
}

// key returns the next key.
func (k *benchKeys) key() string {
	const width, batch = len("first-00000000"), 1024
	j := k.n % batch
	if j == 0 {
		var sb strings.Builder
		sb.Grow(width * batch)
		for n := k.n; n < k.n+batch; n++ {
			fmt.Fprintf(&sb, "first-%08d", n)
		}
		k.chunk = sb.String()
	}
	k.n++
	return k.chunk[j*width : (j+1)*width]
}
