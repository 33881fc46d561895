package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/auth"
)

// scaleResult compares the modes on an empty key table and on one holding
// Keys keys, each round interleaving the baseline (which never touches the
// key table) with the modes, so drift between the two halves cancels out.
type scaleResult struct {
	Keys        int      `json:"keys"`
	FillSeconds float64  `json:"fill_seconds"`
	Empty       []result `json:"empty"`
	Full        []result `json:"full"`
}

// scaleModes are the modes the scale phase compares: those that touch the
// key table, and the baseline they are judged against.
var scaleModes = []string{modeBaseline, modeFirst, modeReplay, modeReplayDB}

func (b *bench) scalePhase(ctx context.Context) (*scaleResult, error) {
	res := &scaleResult{Keys: b.opts.scaleKeys}
	// TRUNCATE leaves the tables' statistics unknown, so the planner
	// assumes a few pages and uses the indexes. Not VACUUM (ANALYZE) here:
	// it would record the tables as empty, the cached generic plans would
	// scan them sequentially while the measurement fills them, and the
	// empty half would be measured slow (it was: a third of the full one).
	if _, err := b.pool.Exec(ctx, "TRUNCATE idempotency_keys, orders CASCADE"); err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return nil, err
	}
	var err error
	if res.Empty, err = b.scaleRounds(ctx); err != nil {
		return nil, err
	}
	began := time.Now()
	if err := b.fillKeys(ctx, "scale", b.opts.scaleKeys, "now() + interval '48 hours'"); err != nil {
		return nil, err
	}
	if err := b.settle(ctx); err != nil {
		return nil, err
	}
	res.FillSeconds = time.Since(began).Seconds()
	b.log.Info("key table filled", "keys", b.opts.scaleKeys, "seconds", fmt.Sprintf("%.0f", res.FillSeconds))
	if res.Full, err = b.scaleRounds(ctx); err != nil {
		return nil, err
	}
	return res, nil
}

// scaleWarmup is how long first requests run, unmeasured, before each half
// of the scale phase. settle ends in a CHECKPOINT, after which the first
// change to every index page writes the whole page to the WAL: with the
// keys' primary key at 10 million random entries, nearly every insert of
// the next seconds would, which is no steady state (in one, a page is
// written whole once per checkpoint, every few minutes). The same warm-up
// before the empty half keeps the halves alike.
const scaleWarmup = 30 * time.Second

func (b *bench) scaleRounds(ctx context.Context) ([]result, error) {
	if _, err := firstRequests(ctx, b.client, b.targets[modeFirst], b.creds.APIKey, targetClients, scaleWarmup, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var modes []string
	for _, m := range scaleModes {
		if _, ok := b.targets[m]; ok {
			modes = append(modes, m)
		}
	}
	var all []result
	for round := range b.opts.rounds {
		rs, err := b.measureModes(ctx, modes, targetClients, round)
		if err != nil {
			return nil, err
		}
		all = append(all, rs...)
	}
	return all, nil
}

// settle vacuums and checkpoints, so that neither autovacuum nor a
// checkpoint falls into one half of a comparison only.
func (b *bench) settle(ctx context.Context) error {
	for _, sql := range []string{"VACUUM (ANALYZE) idempotency_keys", "VACUUM (ANALYZE) orders", "CHECKPOINT"} {
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// fillKeys inserts n completed keys expiring at expires (an SQL
// expression), in statements of a million. Half belong to the benchmark's
// account, so its own keys sit among them in the primary key; the other
// half to accounts of their own. The keys are hex digests, in no order.
func (b *bench) fillKeys(ctx context.Context, prefix string, n int, expires string) error {
	const chunk = 1_000_000
	sql := `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status,
	                              response_status, response_headers, response_body, created_at, completed_at, expires_at)
	SELECT CASE WHEN i % 2 = 0 THEN $1::bytea ELSE uuid_send(gen_random_uuid()) END,
	       upper(md5($2 || i::text)), sha256(($2 || i::text)::bytea), 'POST', '/orders', 'completed',
	       201, '{"Content-Type": ["application/json"]}', convert_to(repeat('x', 170), 'UTF8'), now(), now(), ` + expires + `
	FROM generate_series($3::bigint, $4::bigint) AS i`
	for from := 1; from <= n; from += chunk {
		to := min(from+chunk-1, n)
		if _, err := b.pool.Exec(ctx, sql, []byte(auth.Scope(b.creds.AccountID)), prefix, from, to); err != nil {
			return fmt.Errorf("fill keys %d-%d: %w", from, to, err)
		}
		b.log.Info("filling the key table", "prefix", prefix, "rows", to)
	}
	return nil
}

// cleanupResult is first-request latency at targetClients without cleanup
// and while cleanup deletes Expired keys.
type cleanupResult struct {
	Expired        int     `json:"expired"`
	Deleted        int64   `json:"deleted"`
	CleanupSeconds float64 `json:"cleanup_seconds"`
	Batch          int     `json:"batch"`
	Left           int64   `json:"left"`
	Without        result  `json:"without_cleanup"`
	With           result  `json:"with_cleanup"`
}

// cleanupBatch is serve's default ONCEKEY_CLEANUP_BATCH.
const cleanupBatch = 1000

func (b *bench) cleanupPhase(ctx context.Context) (*cleanupResult, error) {
	res := &cleanupResult{Expired: b.opts.expiredKeys, Batch: cleanupBatch}
	if err := b.fillKeys(ctx, "expired", b.opts.expiredKeys, "now() - interval '1 hour' - make_interval(secs => i / 1000.0)"); err != nil {
		return nil, err
	}
	if err := b.settle(ctx); err != nil {
		return nil, err
	}
	var err error
	if res.Without, err = firstRequests(ctx, b.client, b.targets[modeFirst], b.creds.APIKey, targetClients, 3*b.opts.duration, nil); err != nil {
		return nil, err
	}
	b.log.Info("measured", "phase", "cleanup", "cleanup", false, "rps", fmt.Sprintf("%.0f", res.Without.RPS), "p99_ms", fmt.Sprintf("%.2f", res.Without.P99Ms))

	done := make(chan struct{})
	var purgeErr error
	began := time.Now()
	go func() {
		defer close(done)
		res.Deleted, purgeErr = b.store.PurgeExpired(ctx, cleanupBatch)
		res.CleanupSeconds = time.Since(began).Seconds()
	}()
	if res.With, err = firstRequests(ctx, b.client, b.targets[modeFirst], b.creds.APIKey, targetClients, 3*b.opts.duration, done); err != nil {
		<-done
		return nil, err
	}
	if purgeErr != nil && !errors.Is(purgeErr, idempotency.ErrCleanupBusy) {
		return nil, fmt.Errorf("cleanup: %w", purgeErr)
	}
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE expires_at <= now()").Scan(&res.Left); err != nil {
		return nil, err
	}
	b.log.Info("measured", "phase", "cleanup", "cleanup", true, "rps", fmt.Sprintf("%.0f", res.With.RPS), "p99_ms", fmt.Sprintf("%.2f", res.With.P99Ms),
		"deleted", res.Deleted, "seconds", fmt.Sprintf("%.1f", res.CleanupSeconds))
	return res, nil
}

// soakResult is a separate server process's resident memory through a
// long run of first requests at targetClients.
type soakResult struct {
	Seconds  float64     `json:"seconds"`
	Requests int         `json:"requests"`
	RPS      float64     `json:"rps"`
	Samples  []rssSample `json:"rss"`
	Load     result      `json:"load"`
}

type rssSample struct {
	Seconds float64 `json:"seconds"`
	MiB     float64 `json:"mib"`
}

// soakPhase builds `oncekey serve`, runs it as a process of its own on the
// benchmark's database (as deployed: record and API-key caches on, cleanup
// running), drives first requests (every one a new key) at targetClients
// for opts.soak, and samples its RSS every few seconds.
func (b *bench) soakPhase(ctx context.Context) (*soakResult, error) {
	dir, err := os.MkdirTemp("", "oncekey-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "oncekey")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/oncekey")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("build oncekey: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	srv := exec.CommandContext(ctx, bin, "serve")
	srv.Env = append(withoutEnv(os.Environ(), "REDIS_URL", "DATABASE_URL", "ONCEKEY_ADDR", "ONCEKEY_PPROF_ADDR"),
		"DATABASE_URL="+b.dbURL, "ONCEKEY_ADDR="+addr)
	logFile, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		return nil, err
	}
	defer func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		_ = srv.Wait()
	}()
	target := "http://" + addr
	if err := waitHealthy(ctx, b.client, target); err != nil {
		return nil, err
	}

	res := &soakResult{}
	done := make(chan struct{})
	var load result
	var loadErr error
	began := time.Now()
	go func() {
		defer close(done)
		stop := make(chan struct{})
		time.AfterFunc(b.opts.soak, func() { close(stop) })
		load, loadErr = firstRequests(ctx, b.client, target, b.creds.APIKey, targetClients, b.opts.soak, stop)
	}()
	ticker := time.NewTicker(5 * time.Second)
	defer ticker.Stop()
	for sampling := true; sampling; {
		select {
		case <-done:
			sampling = false
		case <-ticker.C:
			mib, err := rssMiB(srv.Process.Pid)
			if err != nil {
				<-done
				return nil, err
			}
			res.Samples = append(res.Samples, rssSample{Seconds: time.Since(began).Seconds(), MiB: mib})
		}
	}
	if loadErr != nil {
		return nil, loadErr
	}
	res.Load, res.Seconds, res.Requests, res.RPS = load, time.Since(began).Seconds(), load.Requests, load.RPS
	b.log.Info("measured", "phase", "memory", "seconds", fmt.Sprintf("%.0f", res.Seconds), "requests", res.Requests,
		"rss_first_mib", res.Samples[0].MiB, "rss_last_mib", res.Samples[len(res.Samples)-1].MiB)
	return res, nil
}

func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		keep := true
		for _, n := range names {
			if name == n {
				keep = false
			}
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}

func waitHealthy(ctx context.Context, client *http.Client, target string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target+"/healthz", nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("oncekey serve at %s did not become healthy", target)
}

// rssMiB reads a process's resident set size from /proc.
func rssMiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}
