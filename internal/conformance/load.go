package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/getkin/kin-openapi/openapi3"
	"go.yaml.in/yaml/v3"
)

// Notice is a construct of an OpenAPI document that the tool cannot
// support, where it is, and what Load put in its place so that the rest of
// the document loads: the run goes on without it, and the user learns
// which operations it may have changed.
type Notice struct {
	// What the construct is: `an external $ref to "common.yaml#/Expand" …`.
	What string
	// Pointer is the JSON pointer of the object holding it
	// ("/paths/~1orders/post/parameters/1"); for the unknown fields that
	// validation met, kin-openapi's words for where they are.
	Pointer string
	// Line is the line of the file it is on, from 1; 0: unknown (the
	// unknown fields, and a JSON document YAML cannot read, which
	// encoding/json reads without lines: one with a key longer than YAML
	// allows, or a lone UTF-16 surrogate).
	Line int
	// Done is what Load did in its place: "the parameter is left out".
	Done string
	// path is, for a notice of validation about a path item, its path
	// ("/orders"), whose line Load finds.
	path string
}

// Location is where the construct is: its pointer, and its line if known.
func (n Notice) Location() string {
	if n.Line > 0 {
		return fmt.Sprintf("%s (line %d)", n.Pointer, n.Line)
	}
	return n.Pointer
}

// String is the notice as the tool prints it, Printable: what it quotes
// of the document was written by others.
func (n Notice) String() string {
	return Printable("unsupported: " + n.What + " at " + n.Location() + ": " + n.Done)
}

// Load reads the OpenAPI document (3.0 or 3.1, YAML or JSON) at path as
// the tool checks an API with it: each construct it cannot support (a
// $ref to another document or to an anchor) is replaced by what fits its
// place and returned as a Notice, and validation passes over the nits real
// documents have (examples and defaults that do not fit their schemas,
// patterns Go's regexp cannot compile, unknown formats, unknown fields).
// What remains invalid is an error: the document cannot be trusted to say
// what the API does.
func Load(path string) (*openapi3.T, []Notice, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	root, err := parse(data)
	if err != nil {
		return nil, nil, err
	}
	if err := checkVersion(root); err != nil {
		return nil, nil, err
	}
	notices := scan(root)
	lines := pathLines(root)
	// A document in block YAML, unchanged, is handed over as it is; a JSON
	// one (or a changed one) is written out as block YAML first, which
	// kin-openapi reads many times faster (see blockYAML).
	rewritten := len(notices) > 0 || flow(root)
	if rewritten {
		if data, err = blockYAML(root); err != nil {
			return nil, notices, err
		}
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		var external *openapi3.DisallowedExternalRefError
		if errors.As(err, &external) {
			return nil, notices, fmt.Errorf("%w (a $ref where the tool does not look for one: make it a $ref within the document)", err)
		}
		if rewritten && strings.HasPrefix(err.Error(), "failed to unmarshal data: ") {
			return nil, notices, unreadable(err)
		}
		return nil, notices, err
	}
	more, err := validate(loader.Context, doc)
	for i := range more {
		if more[i].Line == 0 && more[i].path != "" {
			more[i].Line = lines[more[i].path]
		}
	}
	notices = append(notices, more...)
	if err != nil {
		return nil, notices, fmt.Errorf("not a valid OpenAPI document: %w", err)
	}
	return doc, notices, nil
}

// unreadableRe matches what kin-openapi says of a document it cannot read
// into its types that is about the text Load handed it: the error of
// reading it as JSON (it is not), and the lines of block YAML that are
// not the document's.
var unreadableRe = regexp.MustCompile(`^failed to unmarshal data: (json error: .*?, )?yaml error: (yaml: )?(construct errors: )?|line \d+: `)

// unreadable is kin-openapi's error for a document that Load rewrote as
// block YAML and kin-openapi cannot read into its types, with what it says
// of the rewritten text left out: where the value is (its pointer) stays.
func unreadable(err error) error {
	return fmt.Errorf("the document does not fit OpenAPI's types: %s", unreadableRe.ReplaceAllString(err.Error(), ""))
}

// parse reads data as YAML (JSON included), with the line of each node.
// JSON that YAML refuses (a key longer than YAML allows, say) is read by
// encoding/json, without lines.
func parse(data []byte) (*yaml.Node, error) {
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' && json.Valid(data) {
		data = yamlSafeJSON(data)
	}
	var root yaml.Node
	yerr := yaml.Unmarshal(data, &root)
	if yerr == nil {
		if root.Kind == 0 {
			return nil, errors.New("the document is empty")
		}
		return &root, nil
	}
	var v any
	if jerr := json.Unmarshal(data, &v); jerr != nil {
		if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
			return nil, fmt.Errorf("neither YAML (%v) nor JSON (%w)", yerr, jerr)
		}
		return nil, yerr
	}
	if err := root.Encode(v); err != nil {
		return nil, err
	}
	return &root, nil
}

// yamlSafeJSON rewrites, in a JSON document, what YAML reads otherwise,
// without moving a line: the escape \/ (which YAML does not have, and
// PHP's encoder writes for every slash) becomes the slash it stands for; a
// pair of UTF-16 escapes (\ud83d\ude00, which YAML refuses, and Python's
// encoder writes for every character past U+FFFF) becomes the one escape
// YAML has for it (\U0001F600); and a raw U+0085 (a line break to YAML,
// folded into a space) becomes its escape.
func yamlSafeJSON(data []byte) []byte {
	out := make([]byte, 0, len(data)+64)
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case escaped:
			escaped = false
			if c == '/' {
				out[len(out)-1] = '/' // the backslash
				continue
			}
			if r, ok := surrogates(data[i:]); ok {
				out = append(out, fmt.Sprintf("U%08X", r)...)
				i += len(`u0000\u0000`) - 1
				continue
			}
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case c == 0xc2 && i+1 < len(data) && data[i+1] == 0x85: // U+0085, in a string
			out = append(out, `\u0085`...)
			i++
			continue
		}
		out = append(out, c)
	}
	return out
}

// surrogates reads the rune of a UTF-16 surrogate pair escaped at the
// start of b ("ud83d\ude00", the first backslash already read).
func surrogates(b []byte) (rune, bool) {
	if len(b) < len(`u0000\u0000`) || b[0] != 'u' || b[5] != '\\' || b[6] != 'u' {
		return 0, false
	}
	hi, err1 := strconv.ParseUint(string(b[1:5]), 16, 16)
	lo, err2 := strconv.ParseUint(string(b[7:11]), 16, 16)
	if err1 != nil || err2 != nil || !utf16.IsSurrogate(rune(hi)) || lo < 0xdc00 || lo > 0xdfff || hi > 0xdbff {
		return 0, false
	}
	return utf16.DecodeRune(rune(hi), rune(lo)), true
}

// pathLines are the lines of the path items of the document at root,
// by path ("/orders"), so that a notice of validation can say where its
// path is once the node tree is gone (it is large).
func pathLines(root *yaml.Node) map[string]int {
	n := deref(root)
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = deref(n.Content[0])
	}
	lines := map[string]int{}
	for i := 0; i+1 < len(n.Content) && n.Kind == yaml.MappingNode; i += 2 {
		if n.Content[i].Value != "paths" {
			continue
		}
		paths := deref(n.Content[i+1])
		for j := 0; j+1 < len(paths.Content) && paths.Kind == yaml.MappingNode; j += 2 {
			lines[paths.Content[j].Value] = paths.Content[j].Line
		}
	}
	return lines
}

// flow reports whether the document is written in flow style, as JSON is.
func flow(root *yaml.Node) bool {
	n := deref(root)
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = deref(n.Content[0])
	}
	return n.Style&yaml.FlowStyle != 0
}

// maxUnknownRounds bounds how many times validation runs again, allowing
// the unknown fields the last one met: each run takes a while on a large
// document.
const maxUnknownRounds = 10

// validate validates doc without the checks real documents fail for
// reasons that do not stop the tool from building requests (examples,
// defaults, patterns, formats), allows the unknown fields it meets, and
// lets through paths that differ only in their parameters' names (GitHub's
// has them), with a notice each.
func validate(ctx context.Context, doc *openapi3.T) ([]Notice, error) {
	opts := []openapi3.ValidationOption{
		openapi3.DisableExamplesValidation(),
		openapi3.DisableSchemaDefaultsValidation(),
		openapi3.DisableSchemaPatternValidation(),
		openapi3.DisableSchemaFormatValidation(),
		openapi3.EnableMultiError(),
	}
	var notices []Notice
	var allowed []string
	if doc.IsOpenAPI31OrLater() {
		// OpenAPI 3.1's, which kin-openapi follows $refs to but does not
		// know as a field of the components.
		allowed = append(allowed, "pathItems")
	}
	for range maxUnknownRounds {
		err := doc.Validate(ctx, append(opts, openapi3.AllowExtraSiblingFields(allowed...))...)
		if err == nil {
			return notices, nil
		}
		found := sortErrors(err, "")
		if len(found.fatal) > 0 {
			return notices, err
		}
		if len(found.unknown) == 0 {
			// Only what the tool lets through, which no option of
			// kin-openapi's turns off: noted once, on the last round.
			return append(notices, found.tolerated...), nil
		}
		for _, u := range found.unknown {
			fields := slices.DeleteFunc(slices.Clone(u.err.Fields), func(f string) bool { return slices.Contains(allowed, f) })
			if len(fields) == 0 {
				continue
			}
			allowed = append(allowed, fields...)
			notices = append(notices, Notice{
				What:    fmt.Sprintf("fields that are neither OpenAPI's nor extensions (x-): %s", strings.Join(fields, ", ")),
				Pointer: u.where, Done: "they are ignored",
			})
		}
	}
	return notices, errors.New("validation met unknown fields over and over")
}

// unknownFields is a validation error that is only fields kin-openapi
// does not know, with where it is in kin-openapi's words.
type unknownFields struct {
	err   *openapi3.ExtraSiblingFieldsError
	where string
}

// validationErrors are the errors of one validation, sorted by what Load
// does with them.
type validationErrors struct {
	fatal   []error
	unknown []unknownFields
	// tolerated are the errors that do not stop the tool from building
	// requests, as the notices they become.
	tolerated []Notice
}

// emptyField says, of an error of validation, whether it is a field the
// document leaves empty that the tool can do without: what it describes
// itself with, where it is served, an example without a value. None of
// them makes a request. what is what is empty; done, what the tool does
// instead.
func emptyField(err error) (what, done string, ok bool) {
	switch err.(type) {
	case *openapi3.InfoTitleRequired:
		return "an info without a title", "the tool does not need one", true
	case *openapi3.InfoVersionRequired:
		return "an info without a version", "the tool does not need one", true
	case *openapi3.LicenseNameRequired:
		return "a license without a name", "the tool does not need one", true
	case *openapi3.ExternalDocsURLRequired:
		return "external docs without a url", "the tool does not need them", true
	case *openapi3.ServerURLRequired:
		return "a server without a url", "the tool sends its requests to --url", true
	case *openapi3.ExampleValueOrExternalValueRequired:
		return "an example with neither value nor externalValue", "it is left out", true
	}
	return "", "", false
}

// sortErrors sorts the errors of a validation (a multi-error tree); where
// is the path of wrapping messages down to err.
func sortErrors(err error, where string) validationErrors {
	if what, done, ok := emptyField(err); ok {
		return validationErrors{tolerated: []Notice{{What: what, Pointer: strings.TrimSuffix(where, ": "), Done: done}}}
	}
	switch e := err.(type) {
	case *openapi3.ExtraSiblingFieldsError:
		return validationErrors{unknown: []unknownFields{{e, strings.TrimSuffix(where, ": ")}}}
	case *openapi3.ConflictingPathsError:
		// Two paths that differ only in their parameters' names
		// (/users/{username}/keys/{key_id} and /users/{username}/keys/{digest}):
		// a server can route only one of them for a method, but each
		// operation of both still says what a request to it is.
		// kin-openapi does not validate the operations of the second.
		return validationErrors{tolerated: []Notice{{
			What:    fmt.Sprintf("the paths %q and %q, which differ only in their parameters' names", e.Path2, e.Path1),
			Pointer: "/paths/" + escapePointer(e.Path1),
			Done:    fmt.Sprintf("both are kept; the operations of %s are not validated", e.Path1),
			path:    e.Path1,
		}}}
	case openapi3.MultiError:
		var all validationErrors
		for _, inner := range e {
			got := sortErrors(inner, where)
			all.fatal = append(all.fatal, got.fatal...)
			all.unknown = append(all.unknown, got.unknown...)
			all.tolerated = append(all.tolerated, got.tolerated...)
		}
		return all
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			prefix, _ := strings.CutSuffix(err.Error(), inner.Error())
			return sortErrors(inner, where+prefix)
		}
	}
	return validationErrors{fatal: []error{err}}
}
