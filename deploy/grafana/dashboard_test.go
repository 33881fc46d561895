package grafana_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/oncekey/oncekey/deploy/grafana"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/service/httpapi"
	"github.com/oncekey/oncekey/internal/service/metrics"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store"
	"github.com/oncekey/oncekey/internal/service/store/memory"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// dashboard is the part of Grafana's dashboard model the tests read.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      any    `json:"query"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct{ X, Y, W, H int }
	Targets    []struct {
		RefID      string      `json:"refId"`
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	require.NoError(t, json.Unmarshal(grafana.Dashboard, &d), "parse oncekey.json")
	return d
}

// TestDashboardShape checks what Grafana and a reader rely on: panels with
// unique ids and titles, every query on the ${datasource} variable with an
// expression, rates over $__rate_interval, and no recording rules (the
// dashboard must work on any Prometheus, rules loaded or not).
func TestDashboardShape(t *testing.T) {
	t.Parallel()
	d := load(t)
	require.NotEmpty(t, d.Title, "dashboard title")
	require.NotEmpty(t, d.UID, "dashboard uid (stable links and provisioning)")
	require.GreaterOrEqual(t, d.SchemaVersion, 36, "schemaVersion")
	require.NotEmpty(t, d.Panels, "panels")

	var hasDatasourceVar bool
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDatasourceVar = true
		}
	}
	require.True(t, hasDatasourceVar, "a datasource variable named datasource of type prometheus")

	ids, titles := map[int]bool{}, map[string]bool{}
	queries := 0
	for _, p := range d.Panels {
		require.Positive(t, p.ID, "panel %q: id", p.Title)
		require.False(t, ids[p.ID], "panel id %d used twice", p.ID)
		ids[p.ID] = true
		require.NotEmpty(t, strings.TrimSpace(p.Title), "panel %d: title", p.ID)
		require.False(t, titles[p.Title], "panel title %q used twice", p.Title)
		titles[p.Title] = true
		require.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, "panel %q: wider than the 24-column grid", p.Title)

		if p.Type == "row" {
			require.Empty(t, p.Targets, "row %q: rows hold no queries", p.Title)
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q: no queries", p.Title)
		require.NotNil(t, p.Datasource, "panel %q: datasource", p.Title)
		require.Equal(t, "${datasource}", p.Datasource.UID, "panel %q: must use the datasource variable", p.Title)
		refIDs := map[string]bool{}
		for _, tg := range p.Targets {
			require.NotEmpty(t, strings.TrimSpace(tg.Expr), "panel %q target %s: expr", p.Title, tg.RefID)
			require.NotEmpty(t, tg.RefID, "panel %q: target without refId", p.Title)
			require.False(t, refIDs[tg.RefID], "panel %q: refId %s used twice", p.Title, tg.RefID)
			refIDs[tg.RefID] = true
			require.NotNil(t, tg.Datasource, "panel %q target %s: datasource", p.Title, tg.RefID)
			require.Equal(t, "${datasource}", tg.Datasource.UID, "panel %q target %s: datasource", p.Title, tg.RefID)
			for _, r := range rangeSelector.FindAllString(stringLiteral.ReplaceAllString(tg.Expr, `""`), -1) {
				require.Equal(t, "[$__rate_interval]", r, "panel %q target %s: ranges follow the scrape interval", p.Title, tg.RefID)
			}
			q := parseQuery(tg.Expr)
			require.NotEmpty(t, q.metrics, "panel %q target %s: no metric found in %q", p.Title, tg.RefID, tg.Expr)
			for name := range q.metrics {
				require.NotContains(t, name, ":", "panel %q target %s: %s is a recording rule; use raw metrics", p.Title, tg.RefID, name)
			}
			queries++
		}
	}
	require.Greater(t, queries, 10, "queries")
}

// TestDashboardQueriesParse has Prometheus's own parser check every panel
// query, through promtool (Debian package prometheus, which CI installs for
// the alert rule tests): the regexp-based reading below only finds names, it
// does not prove the PromQL valid. Grafana's variables are replaced by
// values of the same kind first.
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is required in CI (apt-get install prometheus)")
		}
		t.Skip("promtool not found (apt-get install prometheus): dashboard queries not parsed")
	}
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for i, q := range dashboardQueries(t) {
		if strings.HasPrefix(q.where, "variable ") {
			continue // label_values() is Grafana's, not PromQL
		}
		expr := grafanaRange.ReplaceAllString(q.expr, "1m")
		expr = grafanaVariable.ReplaceAllString(expr, ".+")
		rules = append(rules, rule{Record: "dashboard:query_" + strconv.Itoa(i), Expr: expr})
	}
	file, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	require.NoError(t, os.WriteFile(path, file, 0o600))
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	require.NoError(t, err, "promtool rejects a dashboard query:\n%s\n%s", out, file)
}

var (
	grafanaRange    = regexp.MustCompile(`\$__(?:rate_)?interval`)
	grafanaVariable = regexp.MustCompile(`\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?`)
)

// TestDashboardMetricsExported starts the service as `oncekey serve` wires
// it, drives each kind of request the dashboard charts, scrapes GET
// /metrics and requires every metric family the dashboard queries to be
// exported, with the labels (and, for equality matchers, the label values)
// the queries use. The pool metrics exist only on PostgreSQL, so the
// in-memory store is excused from them and the PostgreSQL run is not.
func TestDashboardMetricsExported(t *testing.T) {
	t.Parallel()
	queries := dashboardQueries(t)

	for _, be := range []struct {
		name     string
		open     func(t *testing.T, m *metrics.Metrics) store.Backend
		excusing string // families with this prefix may be missing
	}{
		{"memory", func(*testing.T, *metrics.Metrics) store.Backend { return memory.New() }, "oncekey_db_pool_"},
		{"postgres", func(t *testing.T, m *metrics.Metrics) store.Backend {
			pool := testdb.Pool(t)
			m.RegisterPool(pool)
			return postgres.New(pool, nil)
		}, ""},
	} {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			m := metrics.New()
			b := setup(t, be.open(t, m), m)
			b.driveTraffic(t)
			fams := b.scrape(t)

			checked := 0
			for _, q := range queries {
				for name, matchers := range q.metrics {
					fam := family(fams, name)
					if fam == nil && be.excusing != "" && strings.HasPrefix(name, be.excusing) {
						continue
					}
					require.NotNil(t, fam, "%s: %s is not exported (in %q)", q.where, name, q.expr)
					checked++
					labels := labelValues(fam, name)
					for _, mt := range matchers {
						values, ok := labels[mt.label]
						require.True(t, ok, "%s: %s has no label %q (in %q)", q.where, name, mt.label, q.expr)
						if mt.op == "=" && values != nil {
							require.Contains(t, values, mt.value, "%s: no %s series with %s=%q (in %q)", q.where, name, mt.label, mt.value, q.expr)
						}
					}
				}
				for _, l := range q.grouping {
					found := false
					for name := range q.metrics {
						if fam := family(fams, name); fam != nil {
							_, has := labelValues(fam, name)[l]
							found = found || has
						}
					}
					require.True(t, found || len(q.metrics) == 0 || be.excusing != "" && q.onlyExcused(be.excusing),
						"%s: no metric in %q has the grouping label %q", q.where, q.expr, l)
				}
			}
			require.Positive(t, checked)
		})
	}
}

// query is one PromQL expression of the dashboard, taken apart.
type query struct {
	where, expr string
	parsed
}

func (q query) onlyExcused(prefix string) bool {
	for name := range q.metrics {
		if !strings.HasPrefix(name, prefix) {
			return false
		}
	}
	return true
}

// dashboardQueries returns every PromQL expression of the dashboard: the
// panels' targets and the variables' label_values(metric, label) queries.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	d := load(t)
	var qs []query
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, query{where: "panel " + strconv.Quote(p.Title) + " target " + tg.RefID, expr: tg.Expr, parsed: parseQuery(tg.Expr)})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValuesQuery.FindStringSubmatch(v.Definition)
		require.NotNil(t, m, "variable %s: expected label_values(metric, label), got %q", v.Name, v.Definition)
		q := parseQuery(m[1])
		q.grouping = append(q.grouping, m[2])
		qs = append(qs, query{where: "variable " + v.Name, expr: v.Definition, parsed: q})
	}
	return qs
}

// The PromQL the dashboard uses is taken apart with regular expressions
// rather than Prometheus's parser, which would pull the whole Prometheus
// module into go.mod for one test. That is sound for the subset used here
// (selectors, functions, aggregations with by/without, binary operators
// with on/ignoring): string literals are set aside first, so nothing inside
// a label value can be mistaken for structure; TestParseQuery pins the
// rules on the tricky cases.
var (
	stringLiteral    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	placeholder      = regexp.MustCompile(`"#(\d+)"`)
	groupingClause   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	selector         = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}`)
	matcher          = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("#\d+")`)
	rangeSelector    = regexp.MustCompile(`\[[^\]]*\]`)
	identifier       = regexp.MustCompile(`(?:^|[^a-zA-Z0-9_:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	labelValuesQuery = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
)

// keywords are PromQL words that stand where a metric name could. Functions
// and aggregations need no list: they are always followed by "(".
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

// labelMatcher is one label matcher of a selector.
type labelMatcher struct{ label, op, value string }

// parsed is what an expression refers to.
type parsed struct {
	metrics  map[string][]labelMatcher // metric name (as written: _bucket kept) → its matchers
	grouping []string                  // labels in by/without/on/ignoring/group_* clauses
}

func parseQuery(expr string) parsed {
	var literals []string
	s := stringLiteral.ReplaceAllStringFunc(expr, func(lit string) string {
		v, err := strconv.Unquote(lit)
		if err != nil {
			v = lit[1 : len(lit)-1]
		}
		literals = append(literals, v)
		return `"#` + strconv.Itoa(len(literals)-1) + `"`
	})
	p := parsed{metrics: map[string][]labelMatcher{}}

	for _, m := range groupingClause.FindAllStringSubmatch(s, -1) {
		for l := range strings.SplitSeq(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				p.grouping = append(p.grouping, l)
			}
		}
	}
	s = groupingClause.ReplaceAllString(s, " ")

	s = selector.ReplaceAllStringFunc(s, func(sel string) string {
		m := selector.FindStringSubmatch(sel)
		name := m[1]
		var ms []labelMatcher
		for _, mm := range matcher.FindAllStringSubmatch(m[2], -1) {
			i, _ := strconv.Atoi(placeholder.FindStringSubmatch(mm[3])[1])
			if mm[1] == "__name__" && mm[2] == "=" {
				name = literals[i]
				continue
			}
			ms = append(ms, labelMatcher{label: mm[1], op: mm[2], value: literals[i]})
		}
		if name != "" {
			p.metrics[name] = append(p.metrics[name], ms...)
		}
		return " " + name + " "
	})
	s = rangeSelector.ReplaceAllString(s, " ")
	s = placeholder.ReplaceAllString(s, " ")

	for _, m := range identifier.FindAllStringSubmatchIndex(s, -1) {
		name, rest := s[m[2]:m[3]], strings.TrimLeft(s[m[3]:], " \t\n")
		if keywords[strings.ToLower(name)] || strings.HasPrefix(rest, "(") {
			continue
		}
		if _, ok := p.metrics[name]; !ok {
			p.metrics[name] = nil
		}
	}
	return p
}

func TestParseQuery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr     string
		metrics  []string
		grouping []string
	}{
		{
			expr:     `histogram_quantile(0.99, sum by (le, route) (rate(http_seconds_bucket{job=~"$job"}[$__rate_interval])))`,
			metrics:  []string{"http_seconds_bucket"},
			grouping: []string{"le", "route"},
		},
		{
			expr:    "(sum(rate(reqs_total{code=~\"5..\", x=\"a}b) c\"}[5m])) or vector(0))\n/\n(sum(rate(reqs_total[5m])) > 0)",
			metrics: []string{"reqs_total"},
		},
		{
			expr:     `time() - max(last_success) > 0 and on (job) 1e-9 * up offset 5m`,
			metrics:  []string{"last_success", "up"},
			grouping: []string{"job"},
		},
		{
			expr:     `label_replace(a_total, "dst", "$1", "src", "(.*)") + sum without(instance) (b) + {__name__="c"}`,
			metrics:  []string{"a_total", "b", "c"},
			grouping: []string{"instance"},
		},
		{
			expr:    `60 * sum by (result) (rate(runs_total{job=~"$job"}[$__rate_interval])) unless bool nan`,
			metrics: []string{"runs_total"}, grouping: []string{"result"},
		},
	} {
		p := parseQuery(tc.expr)
		var got []string
		for name := range p.metrics {
			got = append(got, name)
		}
		slices.Sort(got)
		require.Equal(t, tc.metrics, got, "metrics in %q", tc.expr)
		require.Equal(t, tc.grouping, p.grouping, "grouping labels in %q", tc.expr)
	}
	p := parseQuery(`sum(rate(reqs_total{job=~"$job", code="5\"00"}[5m]))`)
	require.Equal(t, []labelMatcher{{"job", "=~", "$job"}, {"code", "=", `5"00`}}, p.metrics["reqs_total"])
}

// family resolves a metric name as written in PromQL to its exported
// family: name itself, or a histogram's name_bucket, name_sum and
// name_count series.
func family(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if f := fams[name]; f != nil {
		return f
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && fams[base].GetType() == dto.MetricType_HISTOGRAM {
			return fams[base]
		}
	}
	return nil
}

// labelValues returns the labels a query can use on fam's series, with the
// values the scrape showed. job and instance are attached by Prometheus at
// scrape time (nil: any value); le exists on the _bucket series.
func labelValues(fam *dto.MetricFamily, name string) map[string][]string {
	ls := map[string][]string{"job": nil, "instance": nil}
	if fam.GetType() == dto.MetricType_HISTOGRAM && strings.HasSuffix(name, "_bucket") {
		ls["le"] = nil
	}
	for _, m := range fam.GetMetric() {
		for _, lp := range m.GetLabel() {
			ls[lp.GetName()] = append(ls[lp.GetName()], lp.GetValue())
		}
	}
	return ls
}

// testBundle is the running service and an account on it.
type testBundle struct {
	url    string
	apiKey string
	client *http.Client
}

// setup wires the service like `oncekey serve`: store statistics and HTTP
// metrics on m, served at GET /metrics.
func setup(t *testing.T, backend store.Backend, m *metrics.Metrics) *testBundle {
	t.Helper()
	m.RegisterStore(backend)
	svc := servicetest.Start(t, backend, servicetest.Options{Config: httpapi.Config{Logger: slog.New(slog.DiscardHandler), Metrics: m}})
	return &testBundle{url: svc.URL, apiKey: svc.APIKey, client: &http.Client{Timeout: 30 * time.Second}}
}

const orderBody = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`

// driveTraffic sends one request of each kind the dashboard charts, so the
// series that only appear on first use (histograms, route and outcome
// labels) exist: executed, replayed (a duplicate wait), conflict, rejected,
// and reads on other routes.
func (b *testBundle) driveTraffic(t *testing.T) {
	t.Helper()
	key := "dashboard-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	created := b.do(t, http.StatusCreated, http.MethodPost, "/orders", orderBody, key)
	b.do(t, http.StatusCreated, http.MethodPost, "/orders", orderBody, key)
	b.do(t, http.StatusConflict, http.MethodPost, "/orders", strings.Replace(orderBody, `"qty":2`, `"qty":3`, 1), key)
	b.do(t, http.StatusBadRequest, http.MethodPost, "/orders", orderBody, "")
	var order struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(created, &order), "decode order")
	b.do(t, http.StatusOK, http.MethodGet, "/orders/"+order.ID, "", "")
	b.do(t, http.StatusOK, http.MethodGet, "/orders", "", "")
	b.do(t, http.StatusOK, http.MethodGet, "/healthz", "", "")
}

// do sends one request with the account's API key (and key as the
// Idempotency-Key, when set), requires the status and returns the body.
func (b *testBundle) do(t *testing.T, want int, method, path, body, key string) []byte {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.url+path, r)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.apiKey)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	resp, err := b.client.Do(req)
	require.NoError(t, err, "%s %s", method, path)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "%s %s: read body", method, path)
	require.Equal(t, want, resp.StatusCode, "%s %s: %s", method, path, got)
	return got
}

// scrape fetches GET /metrics in the text format Prometheus reads.
func (b *testBundle) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := b.client.Get(b.url + "/metrics")
	require.NoError(t, err, "GET /metrics")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET /metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err, "parse /metrics")
	return fams
}
