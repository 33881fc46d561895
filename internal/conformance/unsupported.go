package conformance

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// unsupported finds, in a document's node tree, the $refs the tool cannot
// follow (to other documents, or to anchors), notes each where it is, and
// puts in its place what fits there: an empty schema for a schema, no
// element at all where one can be left out (a parameter of a list, an
// example, a link), a response without content. It walks the document as
// OpenAPI lays it out, so that a "$ref" key inside an example's value is
// the data it is, not a reference.
type unsupported struct {
	notices []Notice
	// gone holds the pointers ("#/components/parameters/Expand") of what
	// is left out: a $ref within the document to one of them is then
	// unsupported too.
	gone map[string]bool
	// dropped are the nodes left out, and shrink the collections that
	// hold them: they are taken out once every pass is done, so that a
	// pointer says where a node is in the document as it was written.
	dropped map[*yaml.Node]bool
	shrink  []*yaml.Node
	// again: something was left out during this pass, which a $ref met
	// earlier in the pass may name.
	again bool
	// path is the keys (and indexes) from the root to the node visited.
	path []string
	// aliased are the nodes a pass reached through YAML aliases.
	aliased map[*yaml.Node]bool
}

// scan edits root in place and returns what it did, in document order.
func scan(root *yaml.Node) []Notice {
	u := &unsupported{gone: map[string]bool{}, dropped: map[*yaml.Node]bool{}}
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	for pass := 0; pass == 0 || u.again; pass++ {
		u.again, u.aliased = false, map[*yaml.Node]bool{}
		u.entries(root, func(key string, v *yaml.Node) bool {
			switch key {
			case "paths", "webhooks":
				u.entries(v, u.pathItem)
			case "components":
				u.components(v)
			}
			return false
		})
	}
	for _, n := range u.shrink {
		step := 1
		if n.Kind == yaml.MappingNode {
			step = 2 // a key and its value
		}
		kept := n.Content[:0]
		for i := 0; i+step <= len(n.Content); i += step {
			if !u.dropped[n.Content[i+step-1]] {
				kept = append(kept, n.Content[i:i+step]...)
			}
		}
		clear(n.Content[len(kept):])
		n.Content = kept
	}
	return u.notices
}

// why says why a $ref cannot be followed; "": it can.
func (u *unsupported) why(ref string) string {
	switch {
	case !strings.HasPrefix(ref, "#"):
		return fmt.Sprintf("an external $ref to %q (only $refs within the document are followed)", ref)
	case ref != "#" && !strings.HasPrefix(ref, "#/"):
		return fmt.Sprintf("a $ref to the anchor %q (only JSON pointers are followed)", ref)
	}
	for p := ref; len(p) > 1; p = p[:strings.LastIndexByte(p, '/')] {
		if u.gone[p] {
			return fmt.Sprintf("a $ref to %q, which is left out", ref)
		}
	}
	return ""
}

// bad notes n if it is a $ref that cannot be followed, with done: what is
// put in its place.
func (u *unsupported) bad(n *yaml.Node, done string) bool {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], deref(n.Content[i+1])
		if k.Value != "$ref" || v.Kind != yaml.ScalarNode {
			continue
		}
		if what := u.why(v.Value); what != "" {
			u.notices = append(u.notices, Notice{What: what, Pointer: u.pointer(), Line: k.Line, Done: done})
			return true
		}
		return false
	}
	return false
}

// pointer is the JSON pointer of the node visited.
func (u *unsupported) pointer() string {
	var b strings.Builder
	for _, k := range u.path {
		b.WriteByte('/')
		b.WriteString(escapePointer(k))
	}
	return b.String()
}

// leftOut notes that v, the node visited, held by the collection c, is
// left out.
func (u *unsupported) leftOut(c, v *yaml.Node) {
	u.gone["#"+u.pointer()], u.again = true, true
	u.dropped[v] = true
	u.shrink = append(u.shrink, c)
}

// entries visits the entries of the mapping m (but those left out), and
// leaves out those visit says to.
func (u *unsupported) entries(m *yaml.Node, visit func(key string, v *yaml.Node) (drop bool)) {
	if m = u.once(m); m.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if u.dropped[v] {
			continue
		}
		u.path = append(u.path, k.Value)
		if visit(k.Value, v) {
			u.leftOut(m, v)
		}
		u.path = u.path[:len(u.path)-1]
	}
}

// once is n, or, for a YAML alias, the node it names, the first time a
// pass reaches that node through an alias; after that an empty node. An
// alias may name a node that holds it (a cycle), or many aliases one
// node (exponential), and what is left out of a node is left out of it
// wherever it is named.
func (u *unsupported) once(n *yaml.Node) *yaml.Node {
	if n.Kind != yaml.AliasNode {
		return n
	}
	target := deref(n)
	if u.aliased[target] {
		return &yaml.Node{}
	}
	u.aliased[target] = true
	return target
}

// items is entries for the elements of the sequence s.
func (u *unsupported) items(s *yaml.Node, visit func(v *yaml.Node) (drop bool)) {
	if s = u.once(s); s.Kind != yaml.SequenceNode {
		return
	}
	for i, v := range s.Content {
		if u.dropped[v] {
			continue
		}
		u.path = append(u.path, strconv.Itoa(i))
		if visit(v) {
			u.leftOut(s, v)
		}
		u.path = u.path[:len(u.path)-1]
	}
}

// each is entries for a mapping whose values are all of one kind, but for
// its extensions (x-), which are not.
func (u *unsupported) each(visit func(v *yaml.Node) bool) func(string, *yaml.Node) bool {
	return func(key string, v *yaml.Node) bool {
		return !strings.HasPrefix(key, "x-") && visit(v)
	}
}

func (u *unsupported) components(n *yaml.Node) {
	u.entries(n, func(key string, v *yaml.Node) bool {
		switch key {
		case "schemas":
			u.entries(v, u.each(u.schema))
		case "parameters":
			u.entries(v, u.each(u.parameter))
		case "headers":
			u.entries(v, u.each(u.header))
		case "requestBodies":
			u.entries(v, u.each(u.requestBody))
		case "responses":
			u.entries(v, u.each(u.response))
		case "examples":
			u.entries(v, u.each(u.example))
		case "links":
			u.entries(v, u.each(u.link))
		case "callbacks":
			u.entries(v, u.each(u.callback))
		case "pathItems":
			u.entries(v, u.pathItem)
		case "securitySchemes":
			u.entries(v, u.each(u.securityScheme))
		}
		return false
	})
}

// methods are the fields of a path item that are operations.
var methods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace", "query"}

func (u *unsupported) pathItem(key string, n *yaml.Node) bool {
	if strings.HasPrefix(key, "x-") {
		return false
	}
	if u.bad(n, "the path's operations are left out") {
		return true
	}
	u.entries(n, func(key string, v *yaml.Node) bool {
		switch {
		case key == "parameters":
			u.items(v, u.parameter)
		case key == "additionalOperations": // OpenAPI 3.2
			u.entries(v, u.each(u.operation))
		case slices.Contains(methods, key):
			return u.operation(v)
		}
		return false
	})
	return false
}

func (u *unsupported) operation(n *yaml.Node) bool {
	u.entries(n, func(key string, v *yaml.Node) bool {
		switch key {
		case "parameters":
			u.items(v, u.parameter)
		case "requestBody":
			return u.requestBody(v)
		case "responses":
			u.entries(v, u.each(u.response))
		case "callbacks":
			u.entries(v, u.each(u.callback))
		}
		return false
	})
	return false
}

func (u *unsupported) parameter(n *yaml.Node) bool {
	if u.bad(n, "the parameter is left out") {
		return true
	}
	u.described(n)
	return false
}

func (u *unsupported) header(n *yaml.Node) bool {
	if u.bad(n, "the header is left out") {
		return true
	}
	u.described(n)
	return false
}

// described walks what parameters and headers share: a schema or a
// content, and examples.
func (u *unsupported) described(n *yaml.Node) {
	u.entries(n, func(key string, v *yaml.Node) bool {
		switch key {
		case "schema":
			u.schema(v)
		case "content":
			u.entries(v, u.each(u.mediaType))
		case "examples":
			u.entries(v, u.each(u.example))
		}
		return false
	})
}

func (u *unsupported) requestBody(n *yaml.Node) bool {
	if u.bad(n, "the request body is left out") {
		return true
	}
	u.entries(n, func(key string, v *yaml.Node) bool {
		if key == "content" {
			u.entries(v, u.each(u.mediaType))
		}
		return false
	})
	return false
}

func (u *unsupported) response(n *yaml.Node) bool {
	const done = "the response is taken as one without content"
	if u.bad(n, done) {
		*deref(n) = *stub("description", "unsupported: "+u.notices[len(u.notices)-1].What+"; "+done)
		return false
	}
	u.entries(n, func(key string, v *yaml.Node) bool {
		switch key {
		case "headers":
			u.entries(v, u.each(u.header))
		case "content":
			u.entries(v, u.each(u.mediaType))
		case "links":
			u.entries(v, u.each(u.link))
		}
		return false
	})
	return false
}

func (u *unsupported) mediaType(n *yaml.Node) bool {
	u.entries(n, func(key string, v *yaml.Node) bool {
		switch key {
		case "schema", "itemSchema": // itemSchema: OpenAPI 3.2
			u.schema(v)
		case "examples":
			u.entries(v, u.each(u.example))
		case "encoding":
			u.entries(v, u.each(func(e *yaml.Node) bool {
				u.entries(e, func(key string, v *yaml.Node) bool {
					if key == "headers" {
						u.entries(v, u.each(u.header))
					}
					return false
				})
				return false
			}))
		}
		return false
	})
	return false
}

func (u *unsupported) example(n *yaml.Node) bool {
	return u.bad(n, "the example is left out")
}

func (u *unsupported) link(n *yaml.Node) bool {
	return u.bad(n, "the link is left out")
}

func (u *unsupported) callback(n *yaml.Node) bool {
	if u.bad(n, "the callback is left out") {
		return true
	}
	u.entries(n, u.pathItem)
	return false
}

func (u *unsupported) securityScheme(n *yaml.Node) bool {
	const done = "the scheme is taken as HTTP bearer (the tool sends --auth as it is given)"
	if u.bad(n, done) {
		*deref(n) = *stub("type", "http", "scheme", "bearer")
	}
	return false
}

// schemaFields are the keywords whose value is one schema, and
// schemaMaps and schemaLists those whose value is a map or a list of them.
var (
	schemaFields = []string{
		"items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames",
		"unevaluatedProperties", "unevaluatedItems", "contentSchema", "additionalItems",
	}
	schemaMaps  = []string{"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
	schemaLists = []string{"allOf", "anyOf", "oneOf", "prefixItems"}
)

func (u *unsupported) schema(n *yaml.Node) bool {
	if u.bad(n, "the schema is taken as {}, which any value fits") {
		*deref(n) = *stub()
		return false
	}
	u.entries(n, func(key string, v *yaml.Node) bool {
		if want := mistyped(key, v); want != "" {
			u.notices = append(u.notices, Notice{
				What:    fmt.Sprintf("a schema's %s that is not %s (%s)", key, want, valueText(v)),
				Pointer: u.pointer(), Line: v.Line, Done: "it is left out",
			})
			return true
		}
		switch {
		case key == "items" && deref(v).Kind == yaml.SequenceNode:
			// A list of items (a tuple), before JSON Schema 2020-12:
			// kin-openapi reads items as one schema only.
			u.notices = append(u.notices, Notice{
				What:    "a schema's items that are a list (a tuple, before JSON Schema 2020-12)",
				Pointer: u.pointer(), Line: v.Line, Done: "the items are taken as {}, which any value fits",
			})
			*deref(v) = *stub()
		case slices.Contains(schemaFields, key):
			u.schema(v)
		case slices.Contains(schemaMaps, key):
			u.entries(v, u.each(u.schema))
		case slices.Contains(schemaLists, key):
			u.items(v, u.schema)
		case key == "discriminator":
			u.entries(v, func(key string, v *yaml.Node) bool {
				if key == "mapping" {
					u.entries(v, u.discriminatorMapping)
				}
				return false
			})
		}
		return false
	})
	return false
}

// discriminatorMapping is a discriminator's mapping of a value to a schema, by its
// name ("Card") or by a $ref ("#/components/schemas/Card"), as kin-openapi
// tells them apart: a $ref has a slash.
func (u *unsupported) discriminatorMapping(value string, n *yaml.Node) bool {
	n = deref(n)
	if n.Kind != yaml.ScalarNode || !strings.Contains(n.Value, "/") {
		return false
	}
	what := u.why(n.Value)
	if what != "" {
		u.notices = append(u.notices, Notice{What: what, Pointer: u.pointer(), Line: n.Line,
			Done: fmt.Sprintf("the discriminator's mapping of %q is left out", value)})
	}
	return what != ""
}

// deref is the node an alias stands for.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// stub is a node of a mapping of strings, from keys and values.
func stub(kv ...string) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for _, s := range kv {
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s})
	}
	return m
}

// escapePointer escapes one token of a JSON pointer.
func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
