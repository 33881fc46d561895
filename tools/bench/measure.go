package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// body is the seed's order request, the same in every mode.
const body = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`

// result is one measurement: a mode at a concurrency.
type result struct {
	Round    int     `json:"round,omitempty"`
	Mode     string  `json:"mode"`
	Clients  int     `json:"clients"`
	Requests int     `json:"requests"`
	Seconds  float64 `json:"seconds"`
	RPS      float64 `json:"rps"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
}

// measure runs n closed-loop clients against target for d: each sends its
// next request as soon as the last is answered. Every answer must be the
// mode's (201, and for replays Idempotent-Replayed), or the run fails: a
// broken service must not benchmark fast.
func measure(ctx context.Context, client *http.Client, target, apiKey, mode string, n int, d time.Duration) (result, error) {
	return measureProbed(ctx, client, target, apiKey, mode, n, d, nil, nil)
}

// measureProbed is measure with begin called right before the measured
// loop and end right after it, with the number of requests it made.
func measureProbed(ctx context.Context, client *http.Client, target, apiKey, mode string, n int, d time.Duration,
	begin func() error, end func(requests int) error) (result, error) {
	replay := strings.HasPrefix(mode, modeReplay)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = mode + "-" + rand.Text()
		if replay { // the first request, not measured
			if err := send(ctx, client, target, apiKey, keys[i], false); err != nil {
				return result{}, err
			}
		}
	}
	// Warm up first (connections dialled, caches filled), unmeasured.
	if _, _, err := loop(ctx, client, target, apiKey, keys, replay, min(d/3, time.Second)); err != nil {
		return result{}, err
	}
	if begin != nil {
		if err := begin(); err != nil {
			return result{}, err
		}
	}
	latencies, elapsed, err := loop(ctx, client, target, apiKey, keys, replay, d)
	if err != nil {
		return result{}, err
	}
	r, err := summarize(mode, n, latencies, elapsed)
	if err == nil && end != nil {
		err = end(r.Requests)
	}
	return r, err
}

// summarize turns the clients' latencies into a result.
func summarize(mode string, n int, latencies [][]time.Duration, elapsed time.Duration) (result, error) {
	all := slices.Concat(latencies...)
	slices.Sort(all)
	if len(all) == 0 {
		return result{}, fmt.Errorf("no request completed")
	}
	ms := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))]) / float64(time.Millisecond) }
	return result{
		Mode: mode, Clients: n, Requests: len(all), Seconds: elapsed.Seconds(),
		RPS: float64(len(all)) / elapsed.Seconds(), P50Ms: ms(0.50), P99Ms: ms(0.99),
	}, nil
}

// firstRequests runs n closed-loop clients sending first requests to target
// for at least least and, if done is not nil, until done is closed, as one
// result.
func firstRequests(ctx context.Context, client *http.Client, target, apiKey string, n int, least time.Duration, done <-chan struct{}) (result, error) {
	keys := make([]string, n)
	var all [][]time.Duration
	var elapsed time.Duration
	for began := time.Now(); ; {
		latencies, took, err := loop(ctx, client, target, apiKey, keys, false, time.Second)
		if err != nil {
			return result{}, err
		}
		all, elapsed = append(all, latencies...), elapsed+took
		if time.Since(began) >= least && closedOrNil(done) {
			return summarize(modeFirst, n, all, elapsed)
		}
	}
}

// closedOrNil reports whether done is nil or closed.
func closedOrNil(done <-chan struct{}) bool {
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// loop runs one closed-loop client per key for d and returns each client's
// latencies and how long the loop took (the last answers come after d).
func loop(ctx context.Context, client *http.Client, target, apiKey string, keys []string, replay bool, d time.Duration) ([][]time.Duration, time.Duration, error) {
	n := len(keys)
	latencies := make([][]time.Duration, n)
	errs := make([]error, n)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				key := keys[i]
				if !replay {
					key = rand.Text()
				}
				began := time.Now()
				if err := send(ctx, client, target, apiKey, key, replay); err != nil {
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

func send(ctx context.Context, client *http.Client, target, apiKey, key string, wantReplay bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/orders", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("POST /orders answered %d", resp.StatusCode)
	}
	if wantReplay && resp.Header.Get("Idempotent-Replayed") != "true" {
		return fmt.Errorf("a replay was not replayed")
	}
	return nil
}
