package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/procfs"
	"github.com/redis/go-redis/v9"

	"github.com/oncekey/oncekey/internal/service/store/postgres"
)

// costRounds is how many times the cost phase measures every mode; its
// figures are medians.
const costRounds = 3

// cost is what one request of a mode costs, averaged over a closed loop of
// one client: counts that do not depend on the machine (round trips,
// statements, WAL bytes, allocations) and CPU time, which does but is
// compared with the baseline's, measured beside it.
type cost struct {
	Round           int     `json:"round,omitempty"`
	Mode            string  `json:"mode"`
	Requests        int     `json:"requests"`
	RoundTrips      float64 `json:"pg_round_trips"`
	Statements      float64 `json:"pg_statements"`
	RedisRoundTrips float64 `json:"redis_round_trips"`
	WALBytes        float64 `json:"wal_bytes"`
	// PGCPUMicros is the CPU time of every postgres process on this
	// machine (backends, WAL writer, checkpointer); 0 when PostgreSQL runs
	// elsewhere.
	PGCPUMicros float64 `json:"pg_cpu_us"`
	// CPUMicros, Allocs and AllocBytes are the benchmark process's: the
	// service and the load generator together, the same generator in
	// every mode.
	CPUMicros  float64 `json:"process_cpu_us"`
	Allocs     float64 `json:"allocs"`
	AllocBytes float64 `json:"alloc_bytes"`
}

// counters count what the servers send to PostgreSQL (a pgx tracer on the
// benchmark's pool) and to Redis (a go-redis hook).
type counters struct {
	postgres.Counter
	redis atomic.Int64
}

// redisHook counts round trips to Redis: a command, or a pipeline.
type redisHook struct{ c *counters }

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.c.redis.Add(1)
		return next(ctx, cmd)
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.c.redis.Add(1)
		return next(ctx, cmds)
	}
}

// snapshot is every counter at one moment.
type snapshot struct {
	roundTrips, statements, redis int64
	wal                           int64
	pgCPU, cpu                    float64 // seconds
	allocs, allocBytes            uint64
}

// costProbe takes snapshots around a measured loop. wal is a connection
// of its own, outside the counted pool.
type costProbe struct {
	c   *counters
	wal *pgx.Conn
	fs  procfs.FS
	// pgLocal is false when no postgres process is visible here.
	pgLocal bool
	// ownWAL, when pg_walinspect could be created in the benchmark's
	// database, matches the block references of its relations
	// (walBytes); empty, the WAL figure is the whole server's.
	ownWAL string
}

func newCostProbe(ctx context.Context, c *counters, dbURL string) (*costProbe, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("cost phase: connect: %w", err)
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("cost phase: /proc: %w", err)
	}
	p := &costProbe{c: c, wal: conn, fs: fs}
	_, n, err := p.postgresCPU()
	if err != nil {
		conn.Close(ctx)
		return nil, err
	}
	p.pgLocal = n > 0
	// WAL is the whole server's: a test or another database writing while
	// a mode is measured would be counted as the mode's. pg_walinspect
	// reads back each record, so that only the benchmark database's count.
	var oid uint32
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err == nil &&
		conn.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = current_database()").Scan(&oid) == nil {
		p.ownWAL = fmt.Sprintf("rel [0-9]+/%d/", oid)
	}
	return p, nil
}

// ownWALQuery sums the WAL records between two positions that are the
// benchmark database's: those that touch one of its relations, and every
// record of a transaction that did (its commit). Each is counted with the
// padding that aligns it to 8 bytes in the WAL, as a difference of
// positions counts it; page headers (24 bytes in 8 KiB) are left out, and
// so are full-page images: the first change of a page after a checkpoint
// writes the whole page, and checkpoints come when the whole server has
// written enough, whatever the mode measured then (one in a round put
// 4.5 KB on each of a mode's requests).
const ownWALQuery = `WITH r AS MATERIALIZED (
	SELECT xid::text::bigint AS xid, record_length - fpi_length AS record_length, block_ref
	FROM pg_get_wal_records_info('0/0'::pg_lsn + $1::numeric, '0/0'::pg_lsn + $2::numeric)
), ours AS (SELECT DISTINCT xid FROM r WHERE xid <> 0 AND block_ref ~ $3)
SELECT coalesce(sum((record_length + 7) / 8 * 8), 0)::bigint
FROM r WHERE block_ref ~ $3 OR xid IN (SELECT xid FROM ours)`

// walBytes is the WAL written between two snapshots: the benchmark
// database's alone where pg_walinspect reads it (ownWAL), else the whole
// server's.
func (p *costProbe) walBytes(ctx context.Context, before, after snapshot) (int64, error) {
	if p.ownWAL == "" || after.wal <= before.wal {
		// pg_walinspect refuses an empty range.
		return after.wal - before.wal, nil
	}
	// pg_walinspect reads only WAL already flushed; the WAL writer
	// flushes within its delay (200 ms by default).
	deadline := time.Now().Add(10 * time.Second)
	for {
		var flushed bool
		if err := p.wal.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn() >= '0/0'::pg_lsn + $1::numeric", after.wal).Scan(&flushed); err != nil {
			return 0, fmt.Errorf("cost phase: WAL flush position: %w", err)
		}
		if flushed {
			break
		}
		if time.Now().After(deadline) {
			return 0, errors.New("cost phase: the WAL was not flushed within 10s")
		}
		time.Sleep(20 * time.Millisecond) // pacing a poll of the server, not waiting for our own work
	}
	var n int64
	if err := p.wal.QueryRow(ctx, ownWALQuery, before.wal, after.wal, p.ownWAL).Scan(&n); err != nil {
		return 0, fmt.Errorf("cost phase: read the WAL back: %w", err)
	}
	return n, nil
}

func (p *costProbe) close(ctx context.Context) { _ = p.wal.Close(ctx) }

func (p *costProbe) take(ctx context.Context) (snapshot, error) {
	var s snapshot
	if err := p.wal.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&s.wal); err != nil {
		return s, fmt.Errorf("cost phase: WAL position: %w", err)
	}
	var err error
	if s.pgCPU, _, err = p.postgresCPU(); err != nil {
		return s, err
	}
	self, err := p.fs.Self()
	if err == nil {
		var st procfs.ProcStat
		if st, err = self.Stat(); err == nil {
			s.cpu = st.CPUTime()
		}
	}
	if err != nil {
		return s, fmt.Errorf("cost phase: own CPU time: %w", err)
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s.allocs, s.allocBytes = m.Mallocs, m.TotalAlloc
	s.roundTrips, s.statements, s.redis = p.c.RoundTrips.Load(), p.c.Statements.Load(), p.c.redis.Load()
	return s, nil
}

// postgresCPU is the CPU time of every process named postgres, and how
// many there are. A process that ends while being read is left out.
func (p *costProbe) postgresCPU() (float64, int, error) {
	procs, err := p.fs.AllProcs()
	if err != nil {
		return 0, 0, fmt.Errorf("cost phase: list processes: %w", err)
	}
	var seconds float64
	n := 0
	for _, proc := range procs {
		st, err := proc.Stat()
		if err != nil || st.Comm != "postgres" {
			continue
		}
		seconds += st.CPUTime()
		n++
	}
	return seconds, n, nil
}

// costOf turns two snapshots around n requests of mode, and wal, the WAL
// written between them (walBytes), into its cost.
func (p *costProbe) costOf(mode string, n int, before, after snapshot, wal int64) cost {
	per := func(d float64) float64 { return d / float64(n) }
	c := cost{
		Mode: mode, Requests: n,
		RoundTrips:      per(float64(after.roundTrips - before.roundTrips)),
		Statements:      per(float64(after.statements - before.statements)),
		RedisRoundTrips: per(float64(after.redis - before.redis)),
		WALBytes:        per(float64(wal)),
		CPUMicros:       per((after.cpu - before.cpu) * 1e6),
		Allocs:          per(float64(after.allocs - before.allocs)),
		AllocBytes:      per(float64(after.allocBytes - before.allocBytes)),
	}
	if p.pgLocal {
		c.PGCPUMicros = per((after.pgCPU - before.pgCPU) * 1e6)
	}
	return c
}

// costPhase measures every mode's cost per request at one client,
// costRounds times, interleaved with the baseline.
func (b *bench) costPhase(ctx context.Context) ([]cost, error) {
	return b.costs(ctx, b.modes)
}

// costs measures the cost per request of modes, the first of which is
// their baseline, costRounds times, interleaved.
func (b *bench) costs(ctx context.Context, modes []string) ([]cost, error) {
	probe, err := newCostProbe(ctx, b.counters, b.dbURL)
	if err != nil {
		return nil, err
	}
	defer probe.close(ctx)
	var all []cost
	for round := range costRounds {
		for _, mode := range modes {
			var before snapshot
			r, err := measureProbed(ctx, b.client, b.targets[mode], b.creds.APIKey, mode, 1, b.opts.duration,
				func() error {
					var err error
					before, err = probe.take(ctx)
					return err
				},
				func(requests int) error {
					after, err := probe.take(ctx)
					if err != nil {
						return err
					}
					wal, err := probe.walBytes(ctx, before, after)
					if err != nil {
						return err
					}
					c := probe.costOf(mode, requests, before, after, wal)
					c.Round = round + 1
					all = append(all, c)
					b.log.Info("cost", "round", c.Round, "mode", mode, "round_trips", c.RoundTrips, "statements", c.Statements,
						"wal_bytes", fmt.Sprintf("%.0f", c.WALBytes), "server_wal_bytes", fmt.Sprintf("%.0f", float64(after.wal-before.wal)/float64(requests)), "pg_cpu_us", fmt.Sprintf("%.0f", c.PGCPUMicros))
					return nil
				})
			if err != nil {
				return nil, fmt.Errorf("cost of %s: %w", mode, err)
			}
			if r.Requests == 0 {
				return nil, errors.New("cost phase: no request completed")
			}
		}
	}
	return all, nil
}

// medianCosts is each mode's median cost over the rounds, in the order the
// modes were measured.
func medianCosts(all []cost) []cost {
	var out []cost
	for _, first := range all {
		if first.Round != 1 {
			continue
		}
		var rs []cost
		for _, c := range all {
			if c.Mode == first.Mode {
				rs = append(rs, c)
			}
		}
		m := func(f func(cost) float64) float64 {
			xs := make([]float64, len(rs))
			for i, c := range rs {
				xs[i] = f(c)
			}
			return median(xs)
		}
		out = append(out, cost{
			Mode:            first.Mode,
			Requests:        int(m(func(c cost) float64 { return float64(c.Requests) })),
			RoundTrips:      m(func(c cost) float64 { return c.RoundTrips }),
			Statements:      m(func(c cost) float64 { return c.Statements }),
			RedisRoundTrips: m(func(c cost) float64 { return c.RedisRoundTrips }),
			WALBytes:        m(func(c cost) float64 { return c.WALBytes }),
			PGCPUMicros:     m(func(c cost) float64 { return c.PGCPUMicros }),
			CPUMicros:       m(func(c cost) float64 { return c.CPUMicros }),
			Allocs:          m(func(c cost) float64 { return c.Allocs }),
			AllocBytes:      m(func(c cost) float64 { return c.AllocBytes }),
		})
	}
	return out
}

// costMarkdown is the report's section of costs per request.
func costMarkdown(costs []cost) string {
	return fmt.Sprintf("\n## Cost per request\n\nWhat one request costs, whatever the machine: one client in a closed loop for the measurement's duration, %d rounds interleaved, medians. Round trips and statements are counted by a pgx tracer on the servers' pool and on bare's (a pipeline is one round trip), Redis round trips by a go-redis hook, WAL bytes read back with `pg_walinspect` between two `pg_current_wal_insert_lsn()` positions, the benchmark database's records alone, each with its 8-byte alignment and without its full-page images, which follow the server's checkpoints rather than the request (the whole server's difference of positions where the extension cannot be created), PostgreSQL's CPU time from `/proc` (every `postgres` process: backends, WAL writer, checkpointer), and the benchmark process's CPU time and allocations (the service and the load generator, which is the same in every mode) from `/proc` and the Go runtime. In brackets: the figure over the baseline's. The last column is the process CPU time over bare's, the hand-written endpoint's: the load generator's share is the same in both, so it is the whole service's CPU cost (protocol and service) over that floor.\n\n", costRounds) +
		costTable(costs, modeBaseline, modeBare)
}

// costTable is a table of costs per request, each against baseMode's and,
// when cpuMode (if not empty) was measured, with a last column of the
// process CPU time over cpuMode's: the baseline already carries the
// service's CPU time, so it is no floor to judge the service's CPU by.
func costTable(costs []cost, baseMode, cpuMode string) string {
	base, _ := costOf(costs, baseMode)
	cpuBase, cpuCol := costOf(costs, cpuMode)
	cpuCol = cpuCol && cpuBase.CPUMicros > 0
	times := func(x, b float64) string {
		if b == 0 {
			return fmt.Sprintf("%.0f", x)
		}
		return fmt.Sprintf("%.0f (%.2f×)", x, x/b)
	}
	var s strings.Builder
	s.WriteString("| Mode | PostgreSQL round trips | Statements | Redis round trips | WAL bytes | PostgreSQL CPU µs | Process CPU µs | Allocations | Allocated KiB |")
	if cpuCol {
		fmt.Fprintf(&s, " Process CPU ÷ %s |", cpuMode)
	}
	s.WriteString("\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	if cpuCol {
		s.WriteString(" ---: |")
	}
	s.WriteString("\n")
	for _, c := range costs {
		fmt.Fprintf(&s, "| %s | %.2f | %.2f | %.2f | %s | %s | %s | %s | %.1f |", c.Mode, c.RoundTrips, c.Statements, c.RedisRoundTrips,
			times(c.WALBytes, base.WALBytes), times(c.PGCPUMicros, base.PGCPUMicros), times(c.CPUMicros, base.CPUMicros),
			times(c.Allocs, base.Allocs), c.AllocBytes/1024)
		if cpuCol {
			fmt.Fprintf(&s, " %.2f× |", c.CPUMicros/cpuBase.CPUMicros)
		}
		s.WriteString("\n")
	}
	return s.String()
}
