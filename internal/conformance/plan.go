package conformance

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
)

// Planned is what a run would send to one operation under the protocol,
// and where each value of its requests comes from, so that a user can see
// what the tool inferred before anything is sent (--plan) or while it is
// (--explain).
type Planned struct {
	Operation string `json:"operation"`              // "POST /payments/{id}/refunds"
	ID        string `json:"operation_id,omitempty"` // its operationId
	// Key is where its requests send the key: "header Idempotency-Key",
	// "body field idempotency_key".
	Key string `json:"key"`
	// Request is the first request, as far as it is known before anything
	// is sent: a value made by another operation is shown as ‹where from›.
	Request string  `json:"request"`
	Values  []Value `json:"values"`
	// Needs are the operations each request needs a new resource of,
	// nearest first.
	Needs []string `json:"needs,omitempty"`
	// Unsupported says why no request can be built, if none can.
	Unsupported string `json:"unsupported,omitempty"`
}

// Value is where one value of a request comes from: the overrides, a link,
// a Location, a name match, an example or the schema.
type Value struct {
	Where  string `json:"where"`  // "path id", "query coats", "body", "body order_id"
	Source string `json:"source"` // override, link, Location, name match, example, schema
	Detail string `json:"detail"`
}

// Plan says, for every operation under the protocol that cfg selects,
// what its requests would be and where each value comes from. It sends
// nothing, and needs no URL. Its errors are SetupErrors, as Run's before
// it sends anything.
func Plan(cfg Config) ([]Planned, error) {
	s, err := offlineSession(cfg)
	if err != nil {
		return nil, SetupError{err}
	}
	_, ops, err := s.only()
	if err != nil {
		return nil, SetupError{err}
	}
	var out []Planned
	for _, t := range s.covered {
		if len(ops) > 0 && !ops[t] {
			continue
		}
		p := Planned{Operation: t.name, ID: t.id, Key: t.key.String(), Request: sketch(t), Unsupported: t.unsupported, Needs: needs(t)}
		for _, o := range t.origins {
			p.Values = append(p.Values, Value{Where: o.where, Source: string(o.source), Detail: o.detail})
		}
		out = append(out, p)
	}
	return out, nil
}

// offlineSession is the session of a run that sends nothing (--plan,
// --write-overrides): it needs no URL.
func offlineSession(cfg Config) (*session, error) {
	if cfg.BaseURL == "" {
		cfg.BaseURL = "http://localhost" // never contacted
	}
	return newSession(cfg)
}

// needs lists the operations t's requests make resources with, nearest
// first, each once.
func needs(t *target) []string {
	var out []string
	seen := map[*target]bool{t: true}
	queue := []*target{t}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, where := range slices.Sorted(maps.Keys(next.chains)) {
			op := next.chains[where].op
			if !seen[op] {
				seen[op] = true
				out = append(out, op.name)
				queue = append(queue, op)
			}
		}
	}
	return out
}

// sketch is t's first request as far as it is known without sending
// anything.
func sketch(t *target) string {
	path := t.path
	for _, p := range t.params {
		if c := t.chains["path "+p.Name]; c != nil {
			continue // stays {name}: made per request
		}
		v, ok := t.override.Path[p.Name]
		if !ok {
			v = specValue(p)
		}
		path = strings.ReplaceAll(path, "{"+p.Name+"}", url.PathEscape(text(v)))
	}
	line := t.method + " " + path
	if t.media == "" {
		return line
	}
	body := staticBody(t, func(_ string, c *chain) any { return "‹" + c.op.name + "›" })
	b, err := json.Marshal(normalise(body))
	if err != nil {
		return line
	}
	return fmt.Sprintf("%s %s %.300s", line, t.media, b)
}

// WritePlan writes plans for people (format "text", what the document
// says made Printable) or programs ("json").
func WritePlan(w io.Writer, format string, plans []Planned) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(plans)
	}
	if format != "text" && format != "" {
		return fmt.Errorf("a plan is written as text or json, not %s", format)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i, p := range plans {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "%s (%s)\n", Printable(p.Operation), Printable(p.ID))
		if p.Unsupported != "" {
			fmt.Fprintf(tw, "  unsupported\t\t%s\n", Printable(p.Unsupported))
			continue
		}
		fmt.Fprintf(tw, "  key\t\t%s\n", Printable(p.Key))
		fmt.Fprintf(tw, "  request\t\t%s\n", Printable(p.Request))
		for _, v := range p.Values {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", Printable(v.Where), Printable(v.Source), Printable(v.Detail))
		}
		if len(p.Needs) > 0 {
			fmt.Fprintf(tw, "  needs\t\t%s\n", Printable(strings.Join(p.Needs, ", ")))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\n%d operations under the protocol\n", len(plans))
	return err
}
