// Package grafana holds Oncekey's Grafana dashboard, oncekey.json, embedded
// so that programs drawing it (tools/dashboard-snapshot) take their panel
// titles from the dashboard itself instead of a copy that can drift.
package grafana

import _ "embed"

// Dashboard is oncekey.json: import it into Grafana or provision it as a
// file. It queries Prometheus through the ${datasource} variable and uses
// raw metrics only, never recording rules, so it works with any scrape
// config.
//
//go:embed oncekey.json
var Dashboard []byte
