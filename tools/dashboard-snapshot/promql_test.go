package main

import (
	"math"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

func TestHistogramQuantileMatchesPrometheus(t *testing.T) {
	t.Parallel()
	inf := math.Inf(1)
	bs := []bucket{{0.1, 10}, {0.2, 20}, {inf, 20}}
	require.InDelta(t, 0.1, histogramQuantile(0.5, bs), 1e-9, "rank on a bucket's upper bound")
	require.InDelta(t, 0.15, histogramQuantile(0.75, bs), 1e-9, "linear inside the bucket")
	require.InDelta(t, 0.05, histogramQuantile(0.25, bs), 1e-9, "the lowest bucket starts at 0")
	require.Equal(t, 1.0, histogramQuantile(0.9, []bucket{{1, 5}, {inf, 10}}), "rank in +Inf: the highest finite bound")
	require.True(t, math.IsNaN(histogramQuantile(0.5, []bucket{{1, 0}, {inf, 0}})), "no observations")
}

func TestRateOverTime(t *testing.T) {
	t.Parallel()
	counter := func(at time.Duration, executed, replayed float64) scrape {
		series := func(outcome string, v float64) *dto.Metric {
			return &dto.Metric{
				Label:   []*dto.LabelPair{{Name: ptr("outcome"), Value: ptr(outcome)}},
				Counter: &dto.Counter{Value: ptr(v)},
			}
		}
		return scrape{at: at, fams: map[string]*dto.MetricFamily{
			"requests_total": {Metric: []*dto.Metric{series("executed", executed), series("replayed", replayed)}},
		}}
	}
	ss := []scrape{
		counter(0, 0, 0),
		counter(time.Second, 10, 0),
		counter(2*time.Second, 30, 5),
		counter(3*time.Second, 60, 5),
		counter(4*time.Second, 100, 5),
		counter(5*time.Second, 100, 45),
	}
	rates := selector{family: "requests_total", by: "outcome"}.rate(ss)
	want := []float64{10, 15, 20, 25, (100 - 10) / 4.0} // the last reaches back 4 scrapes, not to the first
	require.Len(t, rates["executed"], len(want), "one point per scrape after the first")
	for i, w := range want {
		require.InDelta(t, w, rates["executed"][i].Y, 1e-9, "executed rate at scrape %d", i+1)
	}
	require.InDelta(t, 0.0, rates["replayed"][0].Y, 1e-9)
	require.InDelta(t, 45/4.0, rates["replayed"][4].Y, 1e-9)
}

func ptr[T any](v T) *T { return &v }
