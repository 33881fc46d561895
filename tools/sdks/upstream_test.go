package sdks_test

import (
	"crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stripeUpstream is a Stripe-shaped API of one endpoint, POST /v1/charges,
// that does not deduplicate: it runs every request it gets, counts the runs
// under each Idempotency-Key, and keeps the charges it answered, so that a
// test tells its own answers from anything the gateway wrote. A request's
// metadata (which Stripe keeps as the caller sends it) says how its key's
// first run behaves:
//
//   - metadata[first_delay_ms]: the first run answers after that long;
//   - metadata[first_fault]=reset: the first run reads the request, then
//     resets the connection without answering;
//   - metadata[first_fault]=500: the first run answers 500 api_error.
type stripeUpstream struct {
	url string

	mu      sync.Mutex
	runs    map[string]int      // by Idempotency-Key
	charges map[string][]string // the charges answered, by Idempotency-Key
	started map[string]int      // runs begun, by metadata[case]
}

func startUpstream(t *testing.T) *stripeUpstream {
	t.Helper()
	up := &stripeUpstream{runs: map[string]int{}, charges: map[string][]string{}, started: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(up.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	up.url = "http://" + ln.Addr().String()
	return up
}

func (up *stripeUpstream) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
		stripeError(w, http.StatusNotFound, "invalid_request_error", "Unrecognized request URL ("+r.Method+": "+r.URL.Path+").")
		return
	}
	if err := r.ParseForm(); err != nil {
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "Invalid request body: "+err.Error())
		return
	}
	amount, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
	if err != nil || amount <= 0 {
		stripeError(w, http.StatusBadRequest, "invalid_request_error", "Invalid positive integer: amount")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	up.mu.Lock()
	up.runs[key]++
	first := up.runs[key] == 1
	up.started[r.PostForm.Get("metadata[case]")]++
	up.mu.Unlock()

	if first {
		if ms, err := strconv.Atoi(r.PostForm.Get("metadata[first_delay_ms]")); err == nil {
			// pacing: a first attempt slow on purpose, for the SDK's
			// timeout and retry to meet; nothing is waited for.
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		switch r.PostForm.Get("metadata[first_fault]") {
		case "reset":
			resetConnection(w)
			return
		case "500":
			stripeError(w, http.StatusInternalServerError, "api_error", "An unknown error occurred")
			return
		}
	}

	metadata := map[string]string{}
	for name, values := range r.PostForm {
		if field, ok := strings.CutPrefix(name, "metadata["); ok && strings.HasSuffix(field, "]") {
			metadata[strings.TrimSuffix(field, "]")] = values[0]
		}
	}
	charge, err := json.Marshal(map[string]any{
		"id":              "ch_" + rand.Text(),
		"object":          "charge",
		"amount":          amount,
		"amount_captured": amount,
		"amount_refunded": 0,
		"captured":        true,
		"created":         time.Now().Unix(),
		"currency":        r.PostForm.Get("currency"),
		"livemode":        false,
		"metadata":        metadata,
		"paid":            true,
		"refunded":        false,
		"status":          "succeeded",
	})
	if err != nil {
		stripeError(w, http.StatusInternalServerError, "api_error", err.Error())
		return
	}
	up.mu.Lock()
	up.charges[key] = append(up.charges[key], string(charge))
	up.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_"+rand.Text())
	w.Header().Set("Idempotency-Key", key)
	_, _ = w.Write(charge)
}

// stripeError answers as Stripe's API does when a request fails: an object
// with an error member.
func stripeError(w http.ResponseWriter, status int, typ, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_"+rand.Text())
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": typ, "message": message}})
}

// resetConnection closes the request's connection with a TCP reset, after
// the request was read and nothing was answered.
func resetConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}

// runsOf is how many times each key ran.
func (up *stripeUpstream) runsOf(keys []string) map[string]int {
	up.mu.Lock()
	defer up.mu.Unlock()
	runs := make(map[string]int, len(keys))
	for _, k := range keys {
		runs[k] = up.runs[k]
	}
	return runs
}

// answered are the charges the upstream answered under key.
func (up *stripeUpstream) answered(key string) []string {
	up.mu.Lock()
	defer up.mu.Unlock()
	return append([]string(nil), up.charges[key]...)
}

// startedIn is how many runs of a case have begun.
func (up *stripeUpstream) startedIn(name string) int {
	up.mu.Lock()
	defer up.mu.Unlock()
	return up.started[name]
}
