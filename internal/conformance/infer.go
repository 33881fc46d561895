package conformance

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

// source is where a value of a request comes from. Values are looked for
// in this order: the overrides, the document's links, the Location of the
// answer that made a resource, a name that matches a resource, an example,
// the schema. Schemathesis chains operations in the same order.
type source string

const (
	fromOverride source = "override"
	fromLink     source = "link"
	fromLocation source = "Location"
	fromName     source = "name match"
	fromExample  source = "example"
	fromSchema   source = "schema"
)

// chain is a value taken, for every request that needs it, from a new
// request to another operation: from its answer's body or header, from
// the Location it answered with, or from the path it was sent to.
type chain struct {
	op     *target
	source source
	field  string // a dotted path into the answer's JSON body; or
	header string // a header of the answer (a link's $response.header); or
	param  string // with source Location: the parameter of Location's path; or, with pathOf,
	pathOf bool   // a path parameter of the request the operation was sent to
	// template is, with source Location, the path whose parameter param
	// the Location names ("/payments/{id}").
	template string
	what     string // how --explain says it
}

// origin says where one value of an operation's requests comes from, for
// --explain and --plan.
type origin struct {
	where  string // "path id", "query coats", "body", "body order_id"
	source source
	detail string
}

// inference finds, once per run, which operations make the resources
// others name: by links, by the paths their Locations name and by names.
type inference struct {
	byRoute  map[string]*target
	byID     map[string]*target
	creators map[string][]*target // POST operations by the last word of their path ("orders")
	links    map[*target]map[string]*chain
}

func newInference(byRoute map[string]*target) *inference {
	in := &inference{byRoute: byRoute, byID: map[string]*target{}, creators: map[string][]*target{}, links: map[*target]map[string]*chain{}}
	for _, t := range byRoute {
		in.byID[t.id] = t
		if t.method == http.MethodPost && !strings.HasSuffix(t.path, "}") {
			word := lastWord(t.path)
			in.creators[word] = append(in.creators[word], t)
		}
	}
	for _, list := range in.creators {
		slices.SortFunc(list, func(a, b *target) int { return cmpLen(a.path, b.path) })
	}
	return in
}

func cmpLen(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

// lastWord is the last literal segment of a path: "orders" of
// "/v1/orders".
func lastWord(path string) string {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i := len(segs) - 1; i >= 0; i-- {
		if !strings.HasPrefix(segs[i], "{") {
			return strings.ToLower(segs[i])
		}
	}
	return ""
}

// addLinks reads the links of every answer of op that says it worked:
// each names an operation and how to fill its parameters from the answer.
func (in *inference) addLinks(op *target, spec *openapi3.Operation) {
	if spec.Responses == nil {
		return
	}
	for code, resp := range spec.Responses.Map() {
		if !strings.HasPrefix(code, "2") || resp.Value == nil {
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(resp.Value.Links)) {
			link := resp.Value.Links[name]
			if link == nil || link.Value == nil {
				continue
			}
			to := in.linked(link.Value)
			if to == nil || to == op {
				continue
			}
			for _, param := range slices.Sorted(maps.Keys(link.Value.Parameters)) {
				c := linkChain(op, name, link.Value.Parameters[param])
				if c == nil {
					continue
				}
				if in.links[to] == nil {
					in.links[to] = map[string]*chain{}
				}
				param = strings.TrimPrefix(param, "path.")
				if _, seen := in.links[to][param]; !seen { // the first link, in path and name order
					in.links[to][param] = c
				}
			}
		}
	}
}

// linked is the operation a link names, by operationId or operationRef.
func (in *inference) linked(l *openapi3.Link) *target {
	if l.OperationID != "" {
		return in.byID[l.OperationID]
	}
	ref, ok := strings.CutPrefix(l.OperationRef, "#/paths/")
	if !ok {
		return nil
	}
	i := strings.LastIndex(ref, "/")
	if i < 0 {
		return nil
	}
	path := strings.NewReplacer("~1", "/", "~0", "~").Replace(ref[:i])
	return in.byRoute[strings.ToUpper(ref[i+1:])+" "+path]
}

// linkChain reads a link's runtime expression; nil: one the tool does not
// read (only $response.body#/pointer and $response.header.Name).
func linkChain(op *target, name string, expr any) *chain {
	s, ok := expr.(string)
	if !ok {
		return nil
	}
	c := &chain{op: op, source: fromLink}
	switch {
	case strings.HasPrefix(s, "$response.body#/"):
		ptr := strings.TrimPrefix(s, "$response.body#/")
		c.field = strings.NewReplacer("/", ".", "~1", "/", "~0", "~").Replace(ptr)
	case strings.HasPrefix(s, "$response.header."):
		c.header = strings.TrimPrefix(s, "$response.header.")
	default:
		return nil
	}
	c.what = fmt.Sprintf("link %s of %s (%s)", name, op.name, s)
	return c
}

// infer says where every value of t's requests comes from: it sets t's
// chains and origins.
func (in *inference) infer(t *target) {
	t.chains = map[string]*chain{}
	t.origins = nil
	chained := func(where string, c *chain) {
		t.chains[where] = c
		t.origins = append(t.origins, origin{where, c.source, c.what})
	}
	for i, p := range t.params {
		where := "path " + p.Name
		v, given := t.override.Path[p.Name]
		var c *chain
		// A parameter before one the overrides give names a parent the
		// tool cannot know: a new one would not hold the given resource.
		if !given && !in.givenAfter(t, p.Name) {
			c = cmp.Or(in.links[t][p.Name], in.pathChain(t, i), in.byName(t, p.Name))
		}
		switch {
		case given:
			t.origins = append(t.origins, origin{where, fromOverride, overrideDetail(v)})
		case c != nil:
			chained(where, c)
		default:
			t.origins = append(t.origins, paramOrigin(where, p))
		}
	}
	for _, p := range t.query {
		where := "query " + p.Name
		v, given := t.override.Query[p.Name]
		switch c := cmp.Or(in.links[t][p.Name], in.byName(t, p.Name)); {
		case given:
			t.origins = append(t.origins, origin{where, fromOverride, overrideDetail(v)})
		case !p.Required:
		case c != nil:
			chained(where, c)
		default:
			t.origins = append(t.origins, paramOrigin(where, p))
		}
	}
	for name, v := range t.override.Query {
		if !slices.ContainsFunc(t.query, func(p *openapi3.Parameter) bool { return p.Name == name }) {
			t.origins = append(t.origins, origin{"query " + name, fromOverride, overrideDetail(v)})
		}
	}
	if t.media == "" {
		return
	}
	switch {
	case t.override.Body != nil:
		t.origins = append(t.origins, origin{"body", fromOverride, overrideDetail(t.override.Body)})
		return
	case t.exampled:
		t.origins = append(t.origins, origin{"body", fromExample, "the spec's example"})
	default:
		t.origins = append(t.origins, origin{"body", fromSchema, "the least value its schema accepts"})
	}
	body, ok := t.example.(map[string]any)
	if !ok {
		return
	}
	for _, field := range slices.Sorted(maps.Keys(body)) {
		if c := in.byName(t, field); c != nil {
			chained("body "+field, c)
		}
	}
}

func paramOrigin(where string, p *openapi3.Parameter) origin {
	if _, ok := exampleOf(p.Example, p.Examples, p.Schema); ok {
		return origin{where, fromExample, "the spec's example"}
	}
	return origin{where, fromSchema, "the least value its schema accepts"}
}

func overrideDetail(v any) string {
	if s, ok := v.(string); ok && templateRe.MatchString(s) {
		return s
	}
	return "the overrides file"
}

// givenAfter reports whether the overrides give a path parameter of t that
// comes after name in its path.
func (in *inference) givenAfter(t *target, name string) bool {
	at := strings.Index(t.path, "{"+name+"}")
	for given := range t.override.Path {
		if i := strings.Index(t.path, "{"+given+"}"); i > at {
			return true
		}
	}
	return false
}

// pathChain fills t's i-th path parameter from the operation that makes
// what the path up to it names: POST /payments for the {id} of
// /payments/{id}/refunds. The parameters before it come from the path
// that operation was sent to, so that they name the same resources.
func (in *inference) pathChain(t *target, i int) *chain {
	p := t.params[i]
	marker := "{" + p.Name + "}"
	at := strings.Index(t.path, marker)
	if at <= 0 {
		return nil
	}
	prefix := strings.TrimRight(t.path[:at], "/")
	// The deepest parameter with a maker of its own (one whose answer
	// names what it made) fills the ones before it from that maker's
	// path: deepest in the path, whatever order the document declares
	// the parameters in.
	for deeper := len(t.path); ; {
		deeper = strings.LastIndexByte(t.path[:deeper], '{')
		if deeper <= at {
			break
		}
		name, _, _ := strings.Cut(t.path[deeper+1:], "}")
		if _, given := t.override.Path[name]; given || in.links[t][name] != nil {
			break // the deeper one is not made here: neither are the ones before it
		}
		op := in.poster(t.path[:deeper])
		if op != nil && op != t && strings.HasPrefix(op.path, prefix+"/"+marker) && (op.location || op.idField(name, lastWord(t.path[:deeper])) != "") {
			src := fromName
			if op.location {
				src = fromLocation
			}
			return &chain{op: op, source: src, param: p.Name, pathOf: true,
				what: fmt.Sprintf("the path %s was sent to when it made the %s", op.name, name)}
		}
	}
	op := in.poster(prefix)
	if op == nil || op == t {
		return nil
	}
	template := prefix + "/" + marker
	if op.location {
		return &chain{op: op, source: fromLocation, param: p.Name, template: template,
			what: fmt.Sprintf("%s answers with its Location, %s", op.name, template)}
	}
	field := op.idField(p.Name, lastWord(prefix))
	if field == "" {
		return nil
	}
	return &chain{op: op, source: fromName, field: field,
		what: fmt.Sprintf("the %s %s answers with (it makes %s)", field, op.name, template)}
}

// poster is the POST to path, written with a trailing slash or without
// (APIs of Django and FastAPI write "/app/" and "/app/{app_id}/"); nil:
// there is none.
func (in *inference) poster(path string) *target {
	path = strings.TrimRight(path, "/")
	if op := in.byRoute["POST "+path]; op != nil {
		return op
	}
	return in.byRoute["POST "+path+"/"]
}

// byName finds the operation that makes what name names ("order_id",
// "orderId", "order" → POST /orders) and takes its answer's id (see
// idField).
func (in *inference) byName(t *target, name string) *chain {
	base := name
	for _, suffix := range []string{"_id", "Id", "ID", "-id"} {
		if b, ok := strings.CutSuffix(name, suffix); ok && b != "" {
			base = b
			break
		}
	}
	if base == name && !slices.ContainsFunc(t.params, func(p *openapi3.Parameter) bool { return p.Name == name }) {
		return nil // a body or query field names a resource only by its id
	}
	base = strings.ToLower(base)
	for _, word := range plurals(base) {
		for _, op := range in.creators[word] {
			field := op.idField(name, word)
			if op == t || field == "" {
				continue
			}
			return &chain{op: op, source: fromName, field: field,
				what: fmt.Sprintf("the %s %s answers with (%s names what it makes)", field, op.name, name)}
		}
	}
	return nil
}

// plurals are the words a collection of base may be called.
func plurals(base string) []string {
	out := []string{base + "s", base + "es", base}
	if b, ok := strings.CutSuffix(base, "y"); ok {
		out = append(out, b+"ies")
	}
	return out
}

// fromLocationPath is the value of c.param in loc, a URL whose path ends
// as c.template does.
func (c *chain) fromLocationPath(loc string) (string, bool) {
	u, err := url.Parse(loc)
	if err != nil {
		return "", false
	}
	got := strings.Split(strings.Trim(u.EscapedPath(), "/"), "/")
	want := strings.Split(strings.Trim(c.template, "/"), "/")
	if len(got) < len(want) {
		return "", false
	}
	got = got[len(got)-len(want):]
	value := ""
	for i, seg := range want {
		switch {
		case seg == "{"+c.param+"}":
			v, err := url.PathUnescape(got[i])
			if err != nil {
				return "", false
			}
			value = v
		case strings.HasPrefix(seg, "{"):
		case seg != got[i]:
			return "", false
		}
	}
	return value, value != ""
}

// staticBody is t's body as far as it is known before anything is sent:
// the overrides' as given, or the example with each field another
// operation makes as placeholder says it (or, in a request's build, makes
// it).
func staticBody(t *target, placeholder func(field string, c *chain) any) any {
	if t.override.Body != nil {
		return t.override.Body
	}
	m, ok := t.example.(map[string]any)
	if !ok {
		return t.example
	}
	m = maps.Clone(m)
	for name := range m {
		if c := t.chains["body "+name]; c != nil {
			m[name] = placeholder(name, c)
		}
	}
	return m
}
