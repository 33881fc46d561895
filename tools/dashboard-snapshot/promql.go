package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gonum.org/v1/plot/plotter"
)

// scrape is one read of GET /metrics.
type scrape struct {
	at   time.Duration // since the run began
	fams map[string]*dto.MetricFamily
}

// scrapeEvery reads baseURL/metrics now and then every interval until ctx
// ends, with the keys gauge replaced by keys()'s uncached one. A failed
// scrape is reported and skipped, as Prometheus would.
func scrapeEvery(ctx context.Context, client *http.Client, baseURL string, origin time.Time, interval time.Duration,
	keys func() (*dto.MetricFamily, error), log io.Writer) []scrape {
	var out []scrape
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		fams, err := scrapeOnce(ctx, client, baseURL)
		if err == nil {
			var fresh *dto.MetricFamily
			if fresh, err = keys(); err == nil {
				fams[fresh.GetName()] = fresh
			}
		}
		switch {
		case err == nil:
			out = append(out, scrape{at: time.Since(origin), fams: fams})
		case ctx.Err() == nil:
			fmt.Fprintln(log, "scrape failed:", err)
		}
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

func scrapeOnce(ctx context.Context, client *http.Client, baseURL string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// window is how many scrapes back a rate reaches: 4, which is what
// Grafana's $__rate_interval comes to at a 1s scrape interval.
const window = 4

// selector picks series of one family by label values and names the
// result series after one label (sum by (label)); "" sums them all.
type selector struct {
	family string
	match  map[string]string
	by     string
}

func (s selector) groups(sc scrape, add func(group string, m *dto.Metric)) {
	for _, m := range sc.fams[s.family].GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for name, value := range s.match {
			ok = ok && labels[name] == value
		}
		if ok {
			add(labels[s.by], m)
		}
	}
}

// sum is sum by (s.by) of a counter or gauge at one scrape.
func (s selector) sum(sc scrape) map[string]float64 {
	out := map[string]float64{}
	s.groups(sc, func(g string, m *dto.Metric) {
		out[g] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	})
	return out
}

// bucket is one cumulative histogram bucket.
type bucket struct {
	upper, count float64
}

// buckets is sum by (le, s.by) of a histogram at one scrape, +Inf included.
func (s selector) buckets(sc scrape) map[string][]bucket {
	out := map[string][]bucket{}
	s.groups(sc, func(g string, m *dto.Metric) {
		h := m.GetHistogram()
		bs := out[g]
		if bs == nil {
			for _, b := range h.GetBucket() {
				bs = append(bs, bucket{upper: b.GetUpperBound()})
			}
			bs = append(bs, bucket{upper: math.Inf(1)})
		}
		for i, b := range h.GetBucket() {
			bs[i].count += float64(b.GetCumulativeCount())
		}
		bs[len(bs)-1].count += float64(h.GetSampleCount())
		out[g] = bs
	})
	return out
}

// rate is sum by (s.by) (rate(family[window])) at every scrape.
func (s selector) rate(ss []scrape) map[string]plotter.XYs {
	return overTime(ss, func(cur, prev scrape, dt float64) map[string]float64 {
		now, before := s.sum(cur), s.sum(prev)
		out := map[string]float64{}
		for g, v := range now {
			out[g] = (v - before[g]) / dt
		}
		return out
	})
}

// quantile is histogram_quantile(q, sum by (le, s.by) (rate(family_bucket[window])))
// at every scrape.
func (s selector) quantile(ss []scrape, q float64) map[string]plotter.XYs {
	return overTime(ss, func(cur, prev scrape, _ float64) map[string]float64 {
		now, before := s.buckets(cur), s.buckets(prev)
		out := map[string]float64{}
		for g, bs := range now {
			delta := slices.Clone(bs)
			for i := range delta {
				if i < len(before[g]) {
					delta[i].count -= before[g][i].count
				}
			}
			out[g] = histogramQuantile(q, delta)
		}
		return out
	})
}

// gauge is sum by (s.by) (family) at every scrape.
func (s selector) gauge(ss []scrape) map[string]plotter.XYs {
	return overTime(ss, func(cur, _ scrape, _ float64) map[string]float64 { return s.sum(cur) })
}

// overTime evaluates f at every scrape but the first, against the scrape
// window steps earlier (or the first), and returns one series per group,
// NaN where a group has no value.
func overTime(ss []scrape, f func(cur, prev scrape, dt float64) map[string]float64) map[string]plotter.XYs {
	out := map[string]plotter.XYs{}
	for i := 1; i < len(ss); i++ {
		prev := ss[max(0, i-window)]
		vals := f(ss[i], prev, (ss[i].at - prev.at).Seconds())
		for g := range vals {
			if _, seen := out[g]; !seen {
				out[g] = make(plotter.XYs, 0, len(ss)-1)
				for j := 1; j < i; j++ {
					out[g] = append(out[g], plotter.XY{X: ss[j].at.Seconds(), Y: math.NaN()})
				}
			}
		}
		for g := range out {
			v, ok := vals[g]
			if !ok {
				v = math.NaN()
			}
			out[g] = append(out[g], plotter.XY{X: ss[i].at.Seconds(), Y: v})
		}
	}
	return out
}

// histogramQuantile is Prometheus's histogram_quantile on cumulative
// buckets ending with +Inf: linear interpolation inside the bucket that
// holds the rank, the lowest bucket starting at 0, and the highest finite
// bound when the rank falls in +Inf. NaN without observations.
func histogramQuantile(q float64, bs []bucket) float64 {
	if len(bs) < 2 || bs[len(bs)-1].count <= 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	b := 0
	for b < len(bs)-1 && bs[b].count < rank {
		b++
	}
	switch {
	case b == len(bs)-1:
		return bs[len(bs)-2].upper
	case b == 0 && bs[0].upper <= 0:
		return bs[0].upper
	}
	start, end, count := 0.0, bs[b].upper, bs[b].count
	if b > 0 {
		start = bs[b-1].upper
		count -= bs[b-1].count
		rank -= bs[b-1].count
	}
	return start + (end-start)*(rank/count)
}
