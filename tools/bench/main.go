// Command bench is the load benchmark behind `make bench`: it starts the
// service in-process on a fresh PostgreSQL database, drives it with a
// closed-loop client at several concurrencies, and compares, side by side in
// one run, the idempotent POST /orders (first requests and replays, with and
// without Redis) against a baseline: the same service on a key store that
// keeps nothing (servicetest.KeepNothing), doing the same order INSERT on its own with
// no claim and no key row; and against bare, the
// endpoint a user would write by hand (net/http and one pgx INSERT), so
// that what the key costs in PostgreSQL (over the baseline) and what the
// service costs (the baseline over bare) show apart. Several rounds interleave every mode,
// and each target is judged on the median of its per-round ratios, so
// drift over the run (a checkpoint, autovacuum, a busy neighbour) hits the
// baseline and the mode alike. Then it fills the key table with
// millions of keys and measures again, runs cleanup of a million expired
// keys under load, and watches a separate server process's memory through a
// long run. It writes the numbers as Markdown, JSON and a chart, prints the
// ratios against the performance targets, and exits non-zero when one is
// missed.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	var opts options
	flag.DurationVar(&opts.duration, "duration", 2*time.Second, "how long each measurement runs")
	clients := flag.String("clients", "1,8,32,64", "the concurrencies to measure, comma-separated")
	flag.IntVar(&opts.rounds, "rounds", 5, "how many times every mode is measured at every concurrency, interleaved; figures are medians")
	flag.IntVar(&opts.scaleKeys, "scale-keys", 10_000_000, "keys put in the table for the scale phase (0: leave the phase out)")
	flag.IntVar(&opts.expiredKeys, "expired-keys", 1_000_000, "expired keys cleanup deletes under load (0: leave the phase out)")
	flag.DurationVar(&opts.soak, "soak", 5*time.Minute, "how long the memory phase runs a separate server under load (0: leave it out)")
	flag.StringVar(&opts.adminURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "a PostgreSQL server to create the benchmark's own database on")
	flag.StringVar(&opts.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis for the fast-path modes (empty: leave them out)")
	flag.StringVar(&opts.markdown, "out", "docs/benchmarks.md", "the report (its hand-written profile section is kept)")
	flag.StringVar(&opts.json, "json", "docs/benchmarks.json", "the raw numbers")
	flag.StringVar(&opts.chart, "chart", "docs/img/benchmarks.png", "the chart")
	modes := flag.String("modes", "", "measure only these modes, comma-separated (default: all: baseline, bare, first, replay, replay-db, first+redis, replay+redis); a target needs the modes it compares")
	flag.BoolVar(&opts.proxy, "proxy", true, "measure the gateway (oncekey proxy) against a plain reverse proxy in front of the same Go upstream")
	flag.BoolVar(&opts.large, "large", true, "measure the gateway storing and replaying large answers (1 MiB and 10 MiB, in pieces) against a plain reverse proxy, with the memory it takes")
	flag.BoolVar(&opts.costs, "cost", true, "measure each mode's cost per request at one client: round trips, statements, WAL bytes, CPU time, allocations")
	flag.StringVar(&opts.cpuProfile, "cpuprofile", "", "write a CPU profile of the main rounds (server and load generator together) to this file")
	chartOnly := flag.Bool("chart-only", false, "measure nothing: redraw -chart from the numbers in -json (make docs/images does)")
	flag.Parse()
	if *chartOnly {
		if err := chartFromJSON(opts.json, opts.chart); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		return
	}
	if *modes != "" {
		for _, m := range strings.Split(*modes, ",") {
			opts.modes = append(opts.modes, strings.TrimSpace(m))
		}
	}
	for _, c := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: -clients: %q is not a positive number\n", c)
			os.Exit(2)
		}
		opts.clients = append(opts.clients, n)
	}
	if opts.rounds < 1 {
		fmt.Fprintln(os.Stderr, "bench: -rounds must be at least 1")
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	missed, err := run(context.Background(), opts, os.Stdout, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if missed > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d target(s) missed\n", missed)
		os.Exit(1)
	}
}
