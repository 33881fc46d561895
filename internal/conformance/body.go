package conformance

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
)

// exampleOf is the value a media type, parameter or schema gives as its
// example, preferring the media type's (or parameter's) own: example, then
// the first of examples by name, then the schema's example or examples.
func exampleOf(example any, examples openapi3.Examples, schema *openapi3.SchemaRef) (any, bool) {
	if example != nil {
		return example, true
	}
	for _, name := range slices.Sorted(maps.Keys(examples)) {
		if ex := examples[name]; ex != nil && ex.Value != nil && ex.Value.Value != nil {
			return ex.Value.Value, true
		}
	}
	if schema != nil && schema.Value != nil {
		if schema.Value.Example != nil {
			return schema.Value.Example, true
		}
		if len(schema.Value.Examples) > 0 {
			return schema.Value.Examples[0], true
		}
	}
	return nil, false
}

// specValue is the value the spec gives parameter p: its example, else
// the least value its schema accepts.
func specValue(p *openapi3.Parameter) any {
	if v, ok := exampleOf(p.Example, p.Examples, p.Schema); ok {
		return v
	}
	return minimal(p.Schema, 0)
}

// maxDepth bounds the generation of recursive schemas.
const maxDepth = 8

// minimal is the smallest value schema accepts, as far as one can be made
// without knowing what it means: every required property, as few items as
// allowed, the first enum value, the least number in range, a string of the
// least length in its format.
func minimal(ref *openapi3.SchemaRef, depth int) any {
	if ref == nil || ref.Value == nil || depth > maxDepth {
		return nil
	}
	s := ref.Value
	switch {
	case s.Const != nil:
		return s.Const
	case len(s.Enum) > 0:
		return s.Enum[0]
	case s.Default != nil:
		return s.Default
	case s.Example != nil:
		return s.Example
	case len(s.Examples) > 0:
		return s.Examples[0]
	case len(s.AllOf) > 0:
		merged := map[string]any{}
		for _, part := range s.AllOf {
			if m, ok := minimal(part, depth+1).(map[string]any); ok {
				maps.Copy(merged, m)
			}
		}
		if obj, ok := minimalObject(s, depth).(map[string]any); ok {
			maps.Copy(merged, obj)
		}
		return merged
	case len(s.OneOf) > 0:
		return minimal(s.OneOf[0], depth+1)
	case len(s.AnyOf) > 0:
		return minimal(s.AnyOf[0], depth+1)
	}
	switch typeOf(s) {
	case openapi3.TypeObject:
		return minimalObject(s, depth)
	case openapi3.TypeArray:
		items := make([]any, 0, s.MinItems)
		for range max(s.MinItems, 1) {
			items = append(items, minimal(s.Items, depth+1))
		}
		return items
	case openapi3.TypeString:
		return minimalString(s)
	case openapi3.TypeInteger:
		return math.Ceil(lowest(s, 1))
	case openapi3.TypeNumber:
		return lowest(s, 0.5)
	case openapi3.TypeBoolean:
		return true
	case openapi3.TypeNull:
		return nil
	}
	return map[string]any{}
}

func minimalObject(s *openapi3.Schema, depth int) any {
	obj := map[string]any{}
	for _, name := range s.Required {
		obj[name] = minimal(s.Properties[name], depth+1)
	}
	return obj
}

// typeOf is a schema's one type, guessed from its keywords where it names
// none ("null" only when nothing else is allowed).
func typeOf(s *openapi3.Schema) string {
	if s.Type != nil {
		for _, t := range s.Type.Slice() {
			if t != openapi3.TypeNull {
				return t
			}
		}
		if s.Type.Is(openapi3.TypeNull) {
			return openapi3.TypeNull
		}
	}
	switch {
	case len(s.Properties) > 0 || len(s.Required) > 0:
		return openapi3.TypeObject
	case s.Items != nil:
		return openapi3.TypeArray
	}
	return ""
}

// lowest is the least number in s's range, or def when it is unbounded
// below (but never above its maximum).
func lowest(s *openapi3.Schema, step float64) float64 {
	v := def(s, step)
	if s.Max != nil && v > *s.Max {
		v = *s.Max
		if s.ExclusiveMax.IsTrue() {
			v -= step
		}
	}
	if s.ExclusiveMax.Value != nil && v >= *s.ExclusiveMax.Value {
		v = *s.ExclusiveMax.Value - step
	}
	return v
}

func def(s *openapi3.Schema, step float64) float64 {
	switch {
	case s.ExclusiveMin.Value != nil:
		return *s.ExclusiveMin.Value + step
	case s.Min != nil && s.ExclusiveMin.IsTrue():
		return *s.Min + step
	case s.Min != nil:
		return *s.Min
	}
	return 1
}

func minimalString(s *openapi3.Schema) string {
	var v string
	switch s.Format {
	case "uuid":
		v = newUUID()
	case "date-time":
		v = time.Now().UTC().Format(time.RFC3339)
	case "date":
		v = time.Now().UTC().Format(time.DateOnly)
	case "email":
		v = "conformance@example.com"
	case "uri", "url":
		v = "https://example.com/"
	default:
		v = "conformance"
	}
	if n := int(s.MinLength); len(v) < n {
		v += strings.Repeat("x", n-len(v))
	}
	if s.MaxLength != nil && uint64(len(v)) > *s.MaxLength {
		v = v[:*s.MaxLength]
	}
	return v
}

// newUUID is a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// varied returns a value that schema accepts and that differs from v in one
// place: the first property (by name) that can take another value. false:
// none can.
func varied(ref *openapi3.SchemaRef, v any, depth int) (any, bool) {
	if ref == nil || ref.Value == nil || depth > maxDepth {
		return nil, false
	}
	s := ref.Value
	if len(s.Enum) > 0 {
		for _, e := range s.Enum {
			if fmt.Sprint(e) != fmt.Sprint(v) {
				return e, true
			}
		}
		return nil, false
	}
	if s.Const != nil {
		return nil, false
	}
	for _, part := range slices.Concat(s.AllOf, s.OneOf[:min(1, len(s.OneOf))], s.AnyOf[:min(1, len(s.AnyOf))]) {
		if out, ok := varied(part, v, depth+1); ok {
			return out, true
		}
	}
	switch x := v.(type) {
	case map[string]any:
		for _, name := range slices.Sorted(maps.Keys(x)) {
			if out, ok := varied(s.Properties[name], x[name], depth+1); ok {
				changed := maps.Clone(x)
				changed[name] = out
				return changed, true
			}
		}
		// Else a property it leaves out, set.
		for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
			if _, ok := x[name]; !ok {
				if v := minimal(s.Properties[name], depth+1); v != nil {
					changed := maps.Clone(x)
					changed[name] = v
					return changed, true
				}
			}
		}
	case []any:
		for i, item := range x {
			if out, ok := varied(s.Items, item, depth+1); ok {
				changed := slices.Clone(x)
				changed[i] = out
				return changed, true
			}
		}
	case float64, int, int64, uint64, json.Number:
		n := toFloat(x)
		for _, candidate := range []float64{n + 1, n - 1} {
			if inRange(s, candidate) {
				return candidate, true
			}
		}
	case string:
		if s.Format != "" || s.Pattern != "" {
			return nil, false
		}
		if s.MaxLength == nil || uint64(len(x)) < *s.MaxLength {
			return x + "x", true
		}
	case bool:
		return !x, true
	}
	return nil, false
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case json.Number:
		f, _ := x.Float64()
		return f
	case float64:
		return x
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	}
	return 0
}

func inRange(s *openapi3.Schema, n float64) bool {
	above := s.Min == nil || n > *s.Min || (n == *s.Min && !s.ExclusiveMin.IsTrue())
	below := s.Max == nil || n < *s.Max || (n == *s.Max && !s.ExclusiveMax.IsTrue())
	if s.ExclusiveMin.Value != nil && n <= *s.ExclusiveMin.Value {
		above = false
	}
	if s.ExclusiveMax.Value != nil && n >= *s.ExclusiveMax.Value {
		below = false
	}
	if s.MultipleOf != nil && *s.MultipleOf != 0 && math.Mod(n, *s.MultipleOf) != 0 {
		return false
	}
	return above && below
}

// invalid returns a body that schema refuses, made from the valid body v:
// a required property left out, or else a property of the wrong type, or
// else a value of the wrong type altogether. false: none could be made.
func invalid(ref *openapi3.SchemaRef, v any) (any, bool) {
	if ref == nil || ref.Value == nil {
		return nil, false
	}
	s := ref.Value
	obj, ok := v.(map[string]any)
	if !ok {
		switch typeOf(s) {
		case openapi3.TypeObject:
			return []any{}, true
		case "":
			return nil, false // it may accept anything
		}
		return map[string]any{"conformance": true}, true
	}
	required := slices.Clone(s.Required)
	for _, part := range s.AllOf {
		if part.Value != nil {
			required = append(required, part.Value.Required...)
		}
	}
	slices.Sort(required)
	for _, name := range required {
		if _, ok := obj[name]; ok {
			out := maps.Clone(obj)
			delete(out, name)
			return out, true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		p := s.Properties[name]
		if p == nil || p.Value == nil {
			continue
		}
		var wrong any
		switch typeOf(p.Value) {
		case openapi3.TypeString:
			wrong = map[string]any{}
		case openapi3.TypeInteger, openapi3.TypeNumber, openapi3.TypeBoolean, openapi3.TypeArray, openapi3.TypeObject:
			wrong = "conformance: not of its type"
		default:
			continue
		}
		if p.Value.Type != nil && p.Value.Type.IncludesNull() {
			continue
		}
		out := maps.Clone(obj)
		out[name] = wrong
		return out, true
	}
	if typeOf(s) != openapi3.TypeObject {
		return nil, false // it may accept anything
	}
	return []any{}, true
}
