package canonform_test

import (
	"fmt"
	"strconv"
	"strings"
)

// The readers below follow two parsers that build arrays from a form's
// order, closely enough to tell which forms they read alike: Rack's
// Rack::QueryParser#parse_nested_query (normalize_params, Rack 3) and
// PHP's parse_str ($_POST; php_register_variable_ex). Each returns its
// reading as text that keeps every order the parser keeps (a Ruby Hash
// and a PHP array keep their keys' order), so that two forms are read
// alike exactly when their texts are equal. Neither reader decodes: they
// take the form's decoded pairs in order, as both parsers do.

// pair is one decoded field; hasValue tells "a=" from "a".
type pair struct {
	key, value string
	hasValue   bool
}

// pairsOf decodes body's fields in order, as decodeForm does.
func pairsOf(body string) ([]pair, bool) {
	fields, ok := decodeForm(body)
	if !ok {
		return nil, false
	}
	out := make([]pair, len(fields))
	for i, f := range fields {
		out[i] = pair{f.key, f.value.value, f.value.hasEquals}
	}
	return out, true
}

// ordered is a Ruby Hash or a PHP array: values by key, in insertion
// order.
type ordered struct {
	keys   []string
	values map[string]any
}

func newOrdered() *ordered { return &ordered{values: map[string]any{}} }

func (o *ordered) get(k string) (any, bool) { v, ok := o.values[k]; return v, ok }

func (o *ordered) set(k string, v any) {
	if _, ok := o.values[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.values[k] = v
}

// dump writes v with every order in it.
func dump(v any) string {
	switch v := v.(type) {
	case *ordered:
		parts := make([]string, len(v.keys))
		for i, k := range v.keys {
			parts[i] = strconv.Quote(k) + "=>" + dump(v.values[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case *[]any:
		parts := make([]string, len(*v))
		for i, e := range *v {
			parts[i] = dump(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case nil:
		return "nil"
	case string:
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%v", v)
}

// rackRead is how Rack reads body.
func rackRead(body string) string {
	pairs, ok := pairsOf(body)
	if !ok {
		return "refused"
	}
	params := newOrdered()
	for _, p := range pairs {
		var v any = p.value
		if !p.hasValue {
			v = nil // Rack: "a" is nil, "a=" is ""
		}
		if err := rackNormalize(params, p.key, v, 0); err != nil {
			return "error: " + err.Error()
		}
	}
	return dump(params)
}

// rackNormalize is Rack's normalize_params.
func rackNormalize(params *ordered, name string, v any, depth int) error {
	_, err := rackNormalizeInto(params, name, v, depth)
	return err
}

func rackNormalizeInto(params *ordered, name string, v any, depth int) (any, error) {
	if depth >= 32 {
		return nil, fmt.Errorf("too deep")
	}
	var k, after string
	switch {
	case depth == 0:
		if start := strings.IndexByte(name[min(1, len(name)):], '['); start >= 0 && len(name) > 0 {
			k, after = name[:start+1], name[start+1:]
		} else {
			k = name
		}
	case strings.HasPrefix(name, "[]"):
		k, after = "[]", name[2:]
	case strings.HasPrefix(name, "[") && strings.IndexByte(name[1:], ']') >= 0:
		end := strings.IndexByte(name[1:], ']') + 1
		k, after = name[1:end], name[end+1:]
	default:
		k = name
	}
	if k == "" {
		return params, nil
	}
	switch {
	case after == "":
		if k == "[]" && depth != 0 {
			return &[]any{v}, nil
		}
		params.set(k, v)
	case after == "[":
		params.set(name, v)
	case after == "[]":
		list, err := rackList(params, k)
		if err != nil {
			return nil, err
		}
		*list = append(*list, v)
	case strings.HasPrefix(after, "[]"):
		child := after[2:]
		if len(after) > 3 && after[2] == '[' && strings.HasSuffix(after, "]") {
			if c := after[3 : len(after)-1]; c != "" && !strings.ContainsAny(c, "[]") {
				child = c
			}
		}
		list, err := rackList(params, k)
		if err != nil {
			return nil, err
		}
		if last, ok := lastHash(*list); ok {
			if _, has := last.get(child); !has {
				return params, rackNormalize(last, child, v, depth+1)
			}
		}
		h := newOrdered()
		if _, err := rackNormalizeInto(h, child, v, depth+1); err != nil {
			return nil, err
		}
		*list = append(*list, h)
	default:
		cur, ok := params.get(k)
		if !ok {
			cur = newOrdered()
			params.set(k, cur)
		}
		h, isHash := cur.(*ordered)
		if !isHash {
			return nil, fmt.Errorf("expected Hash for param %q", k)
		}
		got, err := rackNormalizeInto(h, after, v, depth+1)
		if err != nil {
			return nil, err
		}
		params.set(k, got)
	}
	return params, nil
}

// rackList is params[k] ||= [], which must be an Array.
func rackList(params *ordered, k string) (*[]any, error) {
	cur, ok := params.get(k)
	if !ok {
		cur = &[]any{}
		params.set(k, cur)
	}
	list, isList := cur.(*[]any)
	if !isList {
		return nil, fmt.Errorf("expected Array for param %q", k)
	}
	return list, nil
}

func lastHash(list []any) (*ordered, bool) {
	if len(list) == 0 {
		return nil, false
	}
	h, ok := list[len(list)-1].(*ordered)
	return h, ok
}

// phpRead is how PHP's parse_str reads body.
func phpRead(body string) string {
	pairs, ok := pairsOf(body)
	if !ok {
		return "refused"
	}
	vars := newOrdered()
	for _, p := range pairs {
		phpRegister(vars, p.key, p.value)
	}
	return dump(vars)
}

// phpRegister is php_register_variable_ex: leading spaces of the name
// dropped, " " and "." of its top level turned into "_" (and a "[" that
// is never closed too), then each "[index]" one level, "[]" appending.
func phpRegister(vars *ordered, name, value string) {
	name = strings.TrimLeft(name, " ")
	top := name
	var rest string
	if i := strings.IndexByte(name, '['); i >= 0 {
		if strings.IndexByte(name[i:], ']') < 0 {
			// Never closed: the "[" becomes "_" and the rest is the name.
			top = name[:i] + "_" + name[i+1:]
		} else {
			top, rest = name[:i], name[i:]
		}
	}
	top = strings.NewReplacer(" ", "_", ".", "_").Replace(top)
	if top == "" {
		return
	}
	indices := []string{top}
	appends := []bool{false}
	for strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			break // PHP drops what follows an unclosed index
		}
		idx := rest[1:end]
		indices = append(indices, idx)
		appends = append(appends, idx == "")
		rest = rest[end+1:]
	}
	cur := vars
	for i, idx := range indices {
		if appends[i] {
			idx = phpNextIndex(cur)
		} else if n, err := strconv.ParseInt(idx, 10, 64); err == nil && strconv.FormatInt(n, 10) == idx {
			idx = strconv.FormatInt(n, 10) // numeric keys are integers
		}
		if i == len(indices)-1 {
			cur.set(idx, value)
			return
		}
		next, ok := cur.get(idx)
		arr, isArr := next.(*ordered)
		if !ok || !isArr {
			arr = newOrdered()
			cur.set(idx, arr)
		}
		cur = arr
	}
}

// phpNextIndex is the key "[]" appends at: one more than the largest
// integer key, or 0.
func phpNextIndex(a *ordered) string {
	next := int64(0)
	for _, k := range a.keys {
		if n, err := strconv.ParseInt(k, 10, 64); err == nil && n >= next {
			next = n + 1
		}
	}
	return strconv.FormatInt(next, 10)
}
