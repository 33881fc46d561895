package conformance

import (
	"fmt"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// schemaKeywordKinds are, for the keywords of a schema that kin-openapi
// reads into a field of one type, what their values must be: a document
// whose "pattern" is 0 (api.video's) or whose property says "required:
// true" (Swagger 2.0's way) is not read at all otherwise.
var schemaKeywordKinds = map[string]string{
	"pattern": "a string", "format": "a string", "title": "a string", "description": "a string",
	"minLength": "a whole number", "maxLength": "a whole number", "minItems": "a whole number",
	"maxItems": "a whole number", "minProperties": "a whole number", "maxProperties": "a whole number",
	"minimum": "a number", "maximum": "a number", "multipleOf": "a number",
	"nullable": "a boolean", "readOnly": "a boolean", "writeOnly": "a boolean", "deprecated": "a boolean",
	"required": "a list", "enum": "a list", "examples": "a list",
	"properties": "a map",
}

// mistyped says, of the keyword key of a schema and its value v, what the
// value must be when it is not; "": it fits (or the keyword is not one
// kin-openapi reads into a typed field).
func mistyped(key string, v *yaml.Node) string {
	want, ok := schemaKeywordKinds[key]
	if !ok {
		return ""
	}
	v = deref(v)
	fits := false
	switch want {
	case "a string":
		fits = v.Kind == yaml.ScalarNode && v.Tag != "!!int" && v.Tag != "!!float" && v.Tag != "!!bool"
	case "a whole number":
		// A number encoding/json read is a float ("3"), for YAML.
		_, err := strconv.ParseUint(v.Value, 10, 64)
		fits = v.Kind == yaml.ScalarNode && (v.Tag == "!!int" || v.Tag == "!!float") && err == nil
	case "a number":
		fits = v.Kind == yaml.ScalarNode && (v.Tag == "!!int" || v.Tag == "!!float")
	case "a boolean":
		fits = v.Kind == yaml.ScalarNode && v.Tag == "!!bool"
	case "a list":
		fits = v.Kind == yaml.SequenceNode
	case "a map":
		fits = v.Kind == yaml.MappingNode
	}
	if fits {
		return ""
	}
	return want
}

// valueText is a short text of v for a notice: a scalar as written, a
// list or a map as such.
func valueText(v *yaml.Node) string {
	switch v = deref(v); v.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a map"
	}
	return fmt.Sprintf("%.40q", v.Value)
}
