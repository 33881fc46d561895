package conformance

import (
	"maps"
	"slices"
	"strings"
	"unicode"

	"github.com/getkin/kin-openapi/openapi3"
)

// answerSchema is the schema of the JSON body of op's first answer that
// says it worked (by status code), or nil: the document declares none.
// The tool reads the id of what a maker made from it.
func answerSchema(op *openapi3.Operation) *openapi3.Schema {
	if op.Responses == nil {
		return nil
	}
	m := op.Responses.Map()
	for _, code := range slices.Sorted(maps.Keys(m)) {
		resp := m[code]
		if !strings.HasPrefix(code, "2") || resp == nil || resp.Value == nil {
			continue
		}
		media := jsonMedia(resp.Value.Content)
		if !jsonish(media) {
			continue
		}
		if mt := resp.Value.Content.Get(media); mt != nil && mt.Schema != nil && mt.Schema.Value != nil {
			return mt.Schema.Value
		}
	}
	return nil
}

// idField is the field of t's answer that holds what name (a path
// parameter, or a field that names a resource: "paymentPspReference",
// "card_id") takes from what t makes, as a dotted path; collection is the
// word t makes one of ("payments"). Real answers are not all {"id": …}:
// Adyen's payment answers its pspReference, Square's wraps the resource
// ({"card": {"id": …}, "errors": […]}), GitHub's stack is named by its
// number. In this order, it is the field that name is ("ghsa_id"); the
// field name ends with, as a word ("pspReference" of
// "paymentPspReference", "number" of "stack_number"); id; the id of the
// one object the answer holds that has one ("card.id"). A name that is
// the resource's own ("promotion_code" of promotion_codes, "customer")
// names it by its id, whatever other fields it has ("code"). "id" when
// the document does not say what t answers; "" when it says, and none
// fits (an answer that is a string or a list): no value is taken from t.
func (t *target) idField(name, collection string) string {
	if t.answer == nil {
		return "id"
	}
	fields := properties(t.answer)
	if len(fields) == 0 {
		if typeOf(t.answer) == "" || typeOf(t.answer) == openapi3.TypeObject {
			return "id" // an object the document does not describe
		}
		return ""
	}
	if !slices.Contains(plurals(strings.ToLower(name)), collection) {
		if _, ok := fields[name]; ok {
			return name
		}
		best := ""
		for _, field := range slices.Sorted(maps.Keys(fields)) {
			if endsWithWord(name, field) && len(field) > len(best) {
				best = field
			}
		}
		if best != "" {
			return best
		}
	}
	if _, ok := fields["id"]; ok {
		return "id"
	}
	var held []string
	for _, field := range slices.Sorted(maps.Keys(fields)) {
		if s := fields[field]; s != nil && s.Value != nil {
			if _, ok := properties(s.Value)["id"]; ok {
				held = append(held, field)
			}
		}
	}
	if len(held) == 1 {
		return held[0] + ".id"
	}
	return ""
}

// properties are the fields an object of schema s may have: its own, and
// those of its allOf, oneOf and anyOf (each schema read once: one may name
// itself).
func properties(s *openapi3.Schema) map[string]*openapi3.SchemaRef {
	out := map[string]*openapi3.SchemaRef{}
	seen := map[*openapi3.Schema]bool{}
	var walk func(s *openapi3.Schema)
	walk = func(s *openapi3.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		for k, v := range s.Properties {
			if _, ok := out[k]; !ok {
				out[k] = v
			}
		}
		for _, list := range []openapi3.SchemaRefs{s.AllOf, s.OneOf, s.AnyOf} {
			for _, part := range list {
				if part != nil {
					walk(part.Value)
				}
			}
		}
	}
	walk(s)
	return out
}

// endsWithWord reports whether name ends with field as a word of its
// own: after "_", "-" or ".", or where camel case starts a word
// ("paymentPspReference" ends with the word "pspReference", "customerID"
// and "stack_number" with "id" and "number"; "repo" does not end with "po").
func endsWithWord(name, field string) bool {
	if len(field) == 0 || len(field) >= len(name) {
		return false
	}
	rest := name[len(name)-len(field):]
	if !strings.EqualFold(rest, field) {
		return false
	}
	before := rune(name[len(name)-len(field)-1])
	first := rune(rest[0])
	switch {
	case before == '_' || before == '-' || before == '.':
		return rest == field
	case unicode.IsUpper(first) && unicode.IsLower(before):
		// "PspReference" is the word pspReference; "ID", an acronym, is id.
		return rest[1:] == field[1:] || rest == strings.ToUpper(rest)
	}
	return false
}
