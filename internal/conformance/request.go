package conformance

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/getkin/kin-openapi/openapi3"
)

// Overrides are what a spec cannot say about the requests to make: bodies
// and path or query parameters that must name resources that exist,
// headers, a way to slow a request down, and checks that do not apply to an
// operation.
// They are read from a small YAML file:
//
//	operations:
//	  POST /payments:                  # or the operationId
//	    body: {order_id: "{{create:POST /orders .id}}", amount: 1200}
//	  DELETE /orders/{id}:
//	    path: {id: "{{create:POST /orders .id}}"}
//	    slow: {header: {X-Delay: 500ms}}
//	    skip: {canonical-json: "the body is empty"}
//	  POST /exports:
//	    fail: {header: {X-Fail: "1"}}  # a 5xx, for error-not-stored
//	    large: {query: {rows: 50000}}  # a large answer, for large-answer
//
// A string "{{create:METHOD /path .field}}" is replaced, for every request
// made of the operation, by the field of the answer to a new request to
// that operation (made from its own overrides, under a key of its own).
type Overrides struct {
	Operations map[string]Override `yaml:"operations"`
}

// Override is what Overrides say about one operation.
type Override struct {
	// Path gives path parameters by name.
	Path map[string]any `yaml:"path"`
	// Query gives query parameters by name (the required ones the spec
	// declares are sent anyway, from their examples or schemas).
	Query map[string]any `yaml:"query"`
	// Body replaces the body built from the spec.
	Body any `yaml:"body"`
	// Header is added to every request of the operation.
	Header map[string]string `yaml:"header"`
	// Slow makes a first request slow enough for a duplicate to arrive
	// while it runs.
	Slow *Slow `yaml:"slow"`
	// Fail makes a first request fail with a 5xx, so that error-not-stored
	// can show the failure is not stored: a black box cannot be made to
	// fail otherwise. Without it, error-not-stored is skipped.
	Fail *Trigger `yaml:"fail"`
	// Large makes the operation answer large (at least LargeAnswerBytes),
	// so that large-answer can show a large answer replays whole. Without
	// it, large-answer is skipped.
	Large *Trigger `yaml:"large"`
	// Skip names checks that do not apply, each with the reason shown.
	Skip map[string]string `yaml:"skip"`
}

// Trigger is what to add to a request to make the API answer otherwise
// (fail, answer large): a test-only header or query parameter of the API.
type Trigger struct {
	// Header is added to the request.
	Header map[string]string `yaml:"header"`
	// Query is added to the request's query parameters: unlike a header,
	// it is part of the request a key's fingerprint covers.
	Query map[string]any `yaml:"query"`
}

// Slow is how to slow one request down.
type Slow struct {
	// Header is added to the first request only.
	Header map[string]string `yaml:"header"`
	// After is how long after the first request its duplicate is sent
	// (default 100ms).
	After time.Duration `yaml:"after"`
}

// ReadOverrides reads an overrides file; unknown fields are errors, so that
// a misspelt setting does not silently do nothing.
func ReadOverrides(path string) (Overrides, error) {
	var o Overrides
	b, err := os.ReadFile(path)
	if err != nil {
		return o, err
	}
	return ParseOverrides(b)
}

// ParseOverrides parses the YAML of an overrides file.
func ParseOverrides(b []byte) (Overrides, error) {
	var o Overrides
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&o); err != nil && !errors.Is(err, io.EOF) {
		return o, fmt.Errorf("overrides: %w", err)
	}
	return o, nil
}

// request is one HTTP request of an operation, ready to send with a key.
type request struct {
	target      *target
	method      string
	path        string // with its parameters filled in
	query       string // encoded, without "?"
	contentType string
	body        []byte // nil: none
	value       any    // the body, decoded
	header      http.Header
}

// withBody returns a copy of q with body v, encoded as its media type
// says.
func (q request) withBody(v any) (request, error) {
	if q.contentType == formMedia {
		form := url.Values{}
		flatten(form, "", v)
		q.body, q.value = []byte(form.Encode()), v
		return q, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return q, err
	}
	q.body, q.value = b, v
	return q, nil
}

// formMedia is the one body type besides JSON the checks can build.
const formMedia = "application/x-www-form-urlencoded"

// jsonish reports whether media is JSON or a JSON-based type.
func jsonish(media string) bool {
	return media == "application/json" || strings.HasSuffix(media, "+json")
}

// flatten adds v to form as a form-encoded API reads nested values:
// a[b]=1, a[0]=x.
func flatten(form url.Values, name string, v any) {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			key := k
			if name != "" {
				key = name + "[" + k + "]"
			}
			flatten(form, key, x[k])
		}
	case []any:
		for i, item := range x {
			flatten(form, fmt.Sprintf("%s[%d]", name, i), item)
		}
	case nil:
		form.Add(name, "")
	default:
		form.Add(name, text(x))
	}
}

// text is a value as it goes into a path, a query or a form: integers in
// full, never in exponent form.
func text(v any) string {
	if f, ok := v.(float64); ok && f == math.Trunc(f) && math.Abs(f) < 1e21 {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}

var templateRe = regexp.MustCompile(`\{\{create:([A-Z]+) (\S+) \.([^}\s]+)\}\}`)

// build makes a request of t: the body and path parameters from the
// overrides where they give them, from the spec's examples or schemas where
// not, with every create template resolved by a new request. A request
// that cannot be built is a setup error.
func (s *session) build(ctx context.Context, t *target) (request, error) {
	q, err := s.buildDepth(ctx, t, 0)
	return q, setup(t, err)
}

func (s *session) buildDepth(ctx context.Context, t *target, depth int) (request, error) {
	if depth > 5 {
		return request{}, fmt.Errorf("%s: the operations that make what it needs (inferred, or named by {{create:…}} templates) nest more than 5 deep: a cycle? give one of them in the overrides", t.name)
	}
	if t.unsupported != "" {
		return request{}, skipped(t.unsupported)
	}
	q := request{target: t, method: t.method, contentType: t.media, header: http.Header{}}
	for name, value := range t.override.Header {
		q.header.Set(name, value)
	}
	made := makes{}
	path := t.path
	for _, p := range t.params {
		v, err := s.value(ctx, t, "path", p, t.override.Path, made, depth)
		if err != nil {
			return q, fmt.Errorf("%s path parameter %s: %w", t.name, p.Name, err)
		}
		path = strings.ReplaceAll(path, "{"+p.Name+"}", url.PathEscape(text(v)))
	}
	q.path = path
	query := url.Values{}
	for _, p := range t.query {
		if _, given := t.override.Query[p.Name]; !given && !p.Required {
			continue
		}
		v, err := s.value(ctx, t, "query", p, t.override.Query, made, depth)
		if err != nil {
			return q, fmt.Errorf("%s query parameter %s: %w", t.name, p.Name, err)
		}
		query.Set(p.Name, text(v))
	}
	for name, v := range t.override.Query {
		if !query.Has(name) {
			v, err := s.resolve(ctx, v, depth)
			if err != nil {
				return q, fmt.Errorf("%s query parameter %s: %w", t.name, name, err)
			}
			query.Set(name, text(v))
		}
	}
	q.query = query.Encode()
	if t.media == "" {
		return q, nil
	}
	var chainErr error
	v := staticBody(t, func(field string, c *chain) any {
		if chainErr != nil {
			return nil // the build has failed: make nothing more
		}
		value, err := s.chained(ctx, c, made, depth)
		if err != nil {
			chainErr = fmt.Errorf("%s body field %s: %w", t.name, field, err)
		}
		return value
	})
	if chainErr != nil {
		return q, chainErr
	}
	v, err := s.resolve(ctx, v, depth)
	if err != nil {
		return q, fmt.Errorf("%s body: %w", t.name, err)
	}
	return q.withBody(withoutKeyField(t, normalise(v)))
}

// value is the value of t's parameter p (in "path" or "query"): from the
// operation that makes what it names, where inference found one, else as
// param says.
func (s *session) value(ctx context.Context, t *target, in string, p *openapi3.Parameter, given map[string]any, made makes, depth int) (any, error) {
	if c := t.chains[in+" "+p.Name]; c != nil {
		return s.chained(ctx, c, made, depth)
	}
	return s.param(ctx, p, given, depth)
}

// makes are the resources one request's build made, by the operation that
// made them: every value it takes from one operation names one resource.
type makes map[*target]made

// made is a resource a request made: the request, its first answer and,
// for a long operation, the answer once it was no longer pending.
type made struct {
	q            request
	first, final answer
}

// chained is the value c takes from a new resource, made once per build.
func (s *session) chained(ctx context.Context, c *chain, m makes, depth int) (any, error) {
	got, ok := m[c.op]
	if !ok {
		var err error
		if got, err = s.make(ctx, c.op, depth); err != nil {
			return nil, err
		}
		m[c.op] = got
	}
	switch {
	case c.pathOf:
		v, err := url.PathUnescape(pathValue(got.q, c.op, c.param))
		if err != nil || v == "" {
			return nil, fmt.Errorf("%s: no %s in its path %s", c.op.name, c.param, got.q.path)
		}
		return v, nil
	case c.header != "":
		if v := got.first.header.Get(c.header); v != "" {
			return v, nil
		}
		return nil, fmt.Errorf("%s answered without %s: %s", c.op.name, c.header, got.first)
	case c.template != "":
		if loc := got.first.header.Get("Location"); loc != "" {
			if v, ok := c.fromLocationPath(s.location(got.q, loc)); ok {
				return v, nil
			}
		}
	}
	field := cmp.Or(c.field, "id")
	doc, err := decodeJSON(got.final.body)
	if err != nil {
		return nil, fmt.Errorf("%s answered no JSON: %s", c.op.name, got.final)
	}
	v, ok := lookup(doc, field)
	if !ok {
		return nil, fmt.Errorf("%s: the answer has no %s: %s", c.op.name, field, got.final)
	}
	return v, nil
}

// param is the value of parameter p: as given, else its example, else the
// least value its schema accepts, with create templates resolved.
func (s *session) param(ctx context.Context, p *openapi3.Parameter, given map[string]any, depth int) (any, error) {
	v, ok := given[p.Name]
	if !ok {
		v = specValue(p)
	}
	return s.resolve(ctx, v, depth)
}

// resolve replaces every create template in v.
func (s *session) resolve(ctx context.Context, v any, depth int) (any, error) {
	switch x := v.(type) {
	case string:
		m := templateRe.FindStringSubmatchIndex(x)
		if m == nil {
			return x, nil
		}
		var errs []error
		whole := m[0] == 0 && m[1] == len(x)
		var value any
		out := templateRe.ReplaceAllStringFunc(x, func(t string) string {
			sub := templateRe.FindStringSubmatch(t)
			got, err := s.create(ctx, sub[1], sub[2], sub[3], depth)
			errs = append(errs, err)
			value = got
			return text(got)
		})
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		if whole {
			return value, nil
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, item := range x {
			r, err := s.resolve(ctx, item, depth)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			r, err := s.resolve(ctx, item, depth)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

// pendingStatuses are the values of a resource's "status" that say a long
// operation has not finished.
var pendingStatuses = []string{"pending", "processing", "queued", "in_progress", "running"}

// create sends a new request of the operation method path and returns
// field of its answer (see make).
func (s *session) create(ctx context.Context, method, path, field string, depth int) (any, error) {
	t := s.byRoute[method+" "+path]
	if t == nil {
		return nil, fmt.Errorf("{{create:%s %s}}: the spec has no such operation", method, path)
	}
	v, err := s.chained(ctx, &chain{op: t, field: field}, makes{}, depth)
	if err != nil {
		return nil, fmt.Errorf("{{create:%s %s}}: %w", method, path, err)
	}
	return v, nil
}

// make sends a new request of t, built from its own overrides and
// inference, under a key of its own. An answer 202 with a Location is a
// long operation: make reads the Location until the resource is no longer
// pending, so that what it made can be used (a payment that can be
// refunded).
func (s *session) make(ctx context.Context, t *target, depth int) (made, error) {
	q, err := s.buildDepth(ctx, t, depth+1)
	var skip skipped
	if errors.As(err, &skip) { // not a skip of the request that needs it
		return made{}, makerRefused{fmt.Errorf("%s, which makes a resource the request needs, cannot be sent: %v", t.name, err), "give the value in " + overridesFile, nil}
	}
	if err != nil {
		return made{}, err
	}
	a, err := s.send(ctx, q, s.newKey(), s.auth)
	if err != nil {
		return made{}, err
	}
	if a.status < 200 || a.status > 299 {
		var r setupError
		if errors.As(s.usable(q, a), &r) {
			return made{}, makerRefused{fmt.Errorf("%s, which makes a resource the request needs: %w", t.name, r.cause), r.need, r.op}
		}
		return made{}, fmt.Errorf("%s answered %s", t.name, a)
	}
	m := made{q: q, first: a, final: a}
	if loc := a.header.Get("Location"); a.status == http.StatusAccepted && loc != "" {
		if m.final, err = s.settle(ctx, s.location(q, loc)); err != nil {
			return made{}, fmt.Errorf("%s: %w", t.name, err)
		}
	}
	return m, nil
}

// settle reads location until it is no longer pending (at most 30s).
func (s *session) settle(ctx context.Context, location string) (answer, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := s.get(ctx, location)
		if err != nil {
			return a, err
		}
		var doc struct {
			Status string `json:"status"`
		}
		_ = json.Unmarshal(a.body, &doc)
		if a.status != http.StatusAccepted && !slices.Contains(pendingStatuses, doc.Status) {
			return a, nil
		}
		if time.Now().After(deadline) {
			return a, fmt.Errorf("%s is still pending after 30s", location)
		}
		select {
		case <-ctx.Done():
			return a, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// lookup is the value at a dotted path in a JSON document.
func lookup(doc any, path string) (any, bool) {
	for name := range strings.SplitSeq(path, ".") {
		switch x := doc.(type) {
		case map[string]any:
			v, ok := x[name]
			if !ok {
				return nil, false
			}
			doc = v
		case []any:
			i, err := strconv.Atoi(name)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			doc = x[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// normalise turns what YAML or the spec decoded into what decodeJSON
// decodes, so that bodies from both compare alike.
func normalise(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	out, err := decodeJSON(b)
	if err != nil {
		return v
	}
	return out
}

// decodeJSON decodes a JSON document keeping its numbers as written, so
// that an id of 2^60 or 1234567 stays itself.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// target is one operation the checks send requests to.
type target struct {
	name         string // "POST /orders"
	id           string // the operationId, or name
	method, path string
	unsupported  string                // why the checks cannot build its requests, or ""
	params       []*openapi3.Parameter // path parameters
	query        []*openapi3.Parameter // query parameters
	media        string                // the request body's media type; empty: none
	form         bool                  // the operation takes a form body (as media, or besides it)
	schema       *openapi3.SchemaRef   // the request body's schema
	example      any                   // the request body the spec gives or that minimal makes
	exampled     bool                  // example is the spec's
	location     bool                  // an answer that says it worked declares a Location
	answer       *openapi3.Schema      // the JSON body of an answer that says it worked, or nil: undeclared
	chains       map[string]*chain     // values made by other operations, by where they go ("path id")
	origins      []origin              // where each value comes from
	override     Override
	get          string   // the path of a GET of the resource this operation answers with, or ""
	key          keyPlace // where its requests send the key
	optedOut     bool     // x-idempotency: false
}

// jsonMedia is the request media type to send: JSON first, then any +json
// type, then a form, then whatever the operation takes first.
func jsonMedia(content openapi3.Content) string {
	names := slices.Sorted(maps.Keys(content))
	for _, n := range names {
		if n == "application/json" {
			return n
		}
	}
	for _, n := range names {
		if strings.HasSuffix(n, "+json") {
			return n
		}
	}
	if slices.Contains(names, formMedia) {
		return formMedia
	}
	if len(names) > 0 {
		return names[0]
	}
	return ""
}
