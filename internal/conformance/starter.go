package conformance

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// WriteOverrides writes a starter overrides file for the operations whose
// requests results could not make (the errors' NeedsOverride): an entry
// each, with what the tool sent, a blank ("") for every path parameter it
// could not find a resource for, and a comment saying where each value
// came from. Filled in and given to --overrides, it makes those checks
// run. It returns how many entries it wrote.
func WriteOverrides(w io.Writer, cfg Config, results []Result) (int, error) {
	s, err := offlineSession(cfg)
	if err != nil {
		return 0, err
	}
	reasons := map[string]string{}
	for _, r := range results {
		if r.Status == Error && r.NeedsOverride != "" && reasons[r.NeedsOverride] == "" {
			reasons[r.NeedsOverride] = r.Reason
		}
	}
	var b strings.Builder
	b.WriteString(`# A starter overrides file, written by oncekey conformance --write-overrides
# for the operations whose requests could not be made. Fill in each blank
# ("") with a value the API takes: an id of a resource that exists, or a
# "{{create:METHOD /path .field}}" template that makes one for every
# request. Then run again with --overrides and this file. Every value of an
# entry is sent as it is written here; see docs/conformance.md. It holds
# only these operations: entries of an overrides file the run was given
# for others are not repeated, so copy them in.
`)
	names := slices.Sorted(maps.Keys(reasons))
	if len(names) == 0 {
		b.WriteString("# Every request could be made: nothing to fill in.\noperations: {}\n")
	} else {
		b.WriteString("operations:\n")
	}
	for _, name := range names {
		t := s.byRoute[name]
		if t == nil {
			continue
		}
		fmt.Fprintf(&b, "\n  # %.400s\n  %s:\n", oneLine(reasons[name]), yamlFlow(name))
		writeEntry(&b, t)
	}
	_, err = io.WriteString(w, b.String())
	return len(names), err
}

// writeEntry writes t's override: what it was given, else what the tool
// sent, with blanks where it had nothing better than the spec's example or
// schema for a path parameter.
func writeEntry(b *strings.Builder, t *target) {
	comments, details := map[string]string{}, map[string]string{}
	for _, o := range t.origins {
		comments[o.where], details[o.where] = string(o.source)+": "+o.detail, o.detail
	}
	if len(t.params) > 0 {
		b.WriteString("    path:\n")
	}
	for _, p := range t.params {
		where := "path " + p.Name
		v, given := t.override.Path[p.Name]
		switch {
		case given:
			fmt.Fprintf(b, "      %s: %s  # %s\n", yamlFlow(p.Name), yamlFlow(v), oneLine(comments[where]))
		case t.chains[where] != nil:
			// Left to inference, which keeps the parameters of one path
			// naming one resource and reads a Location no template can.
			fmt.Fprintf(b, "      # %s: the tool makes it (%s); give it here to override\n", yamlFlow(p.Name), oneLine(comments[where]))
		default:
			fmt.Fprintf(b, "      %s: \"\"  # fill in: %s named nothing that works\n", yamlFlow(p.Name), oneLine(details[where]))
		}
	}
	query := map[string]any{}
	for _, p := range t.query {
		where := "query " + p.Name
		if v, ok := t.override.Query[p.Name]; ok {
			query[p.Name] = v
		} else if c := t.chains[where]; c != nil {
			if tmpl := template(c); tmpl != "" {
				query[p.Name] = tmpl
			}
		} else if p.Required {
			query[p.Name] = specValue(p)
		}
	}
	maps.Copy(query, t.override.Query)
	if len(query) > 0 {
		b.WriteString("    query:\n")
		for _, name := range slices.Sorted(maps.Keys(query)) {
			fmt.Fprintf(b, "      %s: %s  # %s\n", yamlFlow(name), yamlFlow(query[name]), oneLine(cmp.Or(comments["query "+name], "override")))
		}
	}
	if t.media != "" {
		body := staticBody(t, func(_ string, c *chain) any { return template(c) })
		fmt.Fprintf(b, "    body: %s  # %s; every field is sent as written\n", yamlFlow(normalise(body)), oneLine(comments["body"]))
	}
	if len(t.override.Header) > 0 {
		fmt.Fprintf(b, "    header: %s\n", yamlFlow(t.override.Header))
	}
	if sl := t.override.Slow; sl != nil {
		fmt.Fprintf(b, "    slow: {header: %s, after: %s}\n", yamlFlow(sl.Header), cmp.Or(sl.After, 100*time.Millisecond).String())
	}
	if len(t.override.Skip) > 0 {
		fmt.Fprintf(b, "    skip: %s\n", yamlFlow(t.override.Skip))
	}
}

// template is c as an overrides file writes it, or "" where no template
// says it (a value read from a path, a header or a Location).
func template(c *chain) string {
	if c.pathOf || c.header != "" || c.template != "" {
		return ""
	}
	return "{{create:" + c.op.method + " " + c.op.path + " ." + cmp.Or(c.field, "id") + "}}"
}

// yamlFlow is v in YAML's flow style, which JSON is.
func yamlFlow(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return `""`
	}
	return strings.TrimSuffix(b.String(), "\n")
}
