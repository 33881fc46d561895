package oncekey_test

import (
	"cmp"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const (
	alertsPath  = "deploy/prometheus/README.md"
	alertsBegin = "<!-- alerts: generated from alerts.yml by `make docs/alerts`; do not edit -->"
	alertsEnd   = "<!-- end of alerts -->"
)

// TestAlertList keeps the alert list of deploy/prometheus/README.md true to
// alerts.yml: the list is drawn from the rules (once listed by hand, it
// named 9 of 11), and each alert must have its runbook, a heading of its
// own, in docs/operations.md. `make docs/alerts` redraws the list (go
// test -update).
func TestAlertList(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("deploy/prometheus/alerts.yml")
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `yaml:"alert"`
				For    string            `yaml:"for"`
				Labels map[string]string `yaml:"labels"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(text, &rules), "alerts.yml")

	operations, err := os.ReadFile("docs/operations.md")
	require.NoError(t, err)
	var names []string
	severity := map[string][]string{}
	wait := map[string][]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue // a recording rule
			}
			if !slices.Contains(names, r.Alert) {
				names = append(names, r.Alert)
			}
			require.NotEmpty(t, r.Labels["severity"], "%s has a severity", r.Alert)
			if !slices.Contains(severity[r.Alert], r.Labels["severity"]) {
				severity[r.Alert] = append(severity[r.Alert], r.Labels["severity"])
			}
			if f := cmp.Or(r.For, "at once"); !slices.Contains(wait[r.Alert], f) {
				wait[r.Alert] = append(wait[r.Alert], f)
			}
		}
	}
	require.NotEmpty(t, names, "alerts.yml has alerts")

	var list strings.Builder
	list.WriteString(alertsBegin + "\n\n| Alert | Severity | Fires after |\n| --- | --- | --- |\n")
	for _, name := range names {
		heading := regexp.MustCompile(`(?m)^### ` + name + `$`)
		require.True(t, heading.Match(operations), "docs/operations.md has the runbook of %s (### %s)", name, name)
		fmt.Fprintf(&list, "| [%s](../../docs/operations.md#%s) | %s | %s |\n", name, strings.ToLower(name),
			strings.Join(severity[name], ", "), strings.Join(wait[name], ", "))
	}
	list.WriteString("\n" + alertsEnd)

	doc, err := os.ReadFile(alertsPath)
	require.NoError(t, err)
	begin := strings.Index(string(doc), alertsBegin)
	end := strings.Index(string(doc), alertsEnd)
	require.True(t, begin >= 0 && end > begin, "%s has the markers of its alert list", alertsPath)
	updated := string(doc[:begin]) + list.String() + string(doc[end+len(alertsEnd):])
	if *update {
		require.NoError(t, os.WriteFile(alertsPath, []byte(updated), 0o644))
		return
	}
	require.Equal(t, updated, string(doc), "%s's alert list is stale: run make docs/alerts", alertsPath)
}
