package conformance

import (
	"bytes"
	"errors"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// blockYAML writes a node tree as block YAML: what Load hands
// kin-openapi when it changed the document, or when the document is JSON,
// which kin-openapi's YAML parser reads in time that grows much faster
// than its size (seconds for a few megabytes), while it reads the same
// values as block YAML in a fraction of that. Values are kept, and keys in
// their order; comments, anchors (each alias is written out in full) and
// styles are not. Strings are written double-quoted, with the escapes
// YAML and Go share, so no string is read back as a number or a boolean.
func blockYAML(n *yaml.Node) ([]byte, error) {
	w := &blockWriter{open: map[*yaml.Node]bool{}}
	n = deref(n)
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil, errors.New("the document is empty")
		}
		n = deref(n.Content[0])
	}
	if n.Kind == yaml.MappingNode && len(n.Content) > 0 {
		if err := w.block(n, 0); err != nil {
			return nil, err
		}
		return w.buf.Bytes(), nil
	}
	if err := w.value(n, 0); err != nil {
		return nil, err
	}
	return bytes.TrimPrefix(w.buf.Bytes(), []byte(" ")), nil
}

type blockWriter struct {
	buf bytes.Buffer
	// open are the collections being written: an alias to one of them is
	// a cycle, which would never end.
	open map[*yaml.Node]bool
}

// value writes n after a key's colon or a list's dash: a scalar or an
// empty collection on the same line, a collection on the lines below,
// indented.
func (w *blockWriter) value(n *yaml.Node, indent int) error {
	n = deref(n)
	switch {
	case n.Kind == yaml.ScalarNode:
		w.buf.WriteByte(' ')
		w.buf.WriteString(scalarText(n))
	case n.Kind == yaml.MappingNode && len(n.Content) == 0:
		w.buf.WriteString(" {}")
	case n.Kind == yaml.SequenceNode && len(n.Content) == 0:
		w.buf.WriteString(" []")
	case n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode:
		w.buf.WriteByte('\n')
		return w.block(n, indent)
	default:
		return errors.New("a YAML node of an unknown kind")
	}
	w.buf.WriteByte('\n')
	return nil
}

// block writes the entries of a non-empty collection, one a line at indent.
func (w *blockWriter) block(n *yaml.Node, indent int) error {
	if w.open[n] {
		return errors.New("a YAML alias refers to a node it is part of")
	}
	w.open[n] = true
	defer delete(w.open, n)
	pad := strings.Repeat(" ", indent)
	if n.Kind == yaml.SequenceNode {
		for _, item := range n.Content {
			w.buf.WriteString(pad)
			w.buf.WriteByte('-')
			if err := w.value(item, indent+2); err != nil {
				return err
			}
		}
		return nil
	}
	later := overridden(n)
	for i := 0; i+1 < len(n.Content); i += 2 {
		if later[i] {
			continue
		}
		k := deref(n.Content[i])
		if k.Kind != yaml.ScalarNode {
			return errors.New("a YAML mapping key that is not a scalar")
		}
		w.buf.WriteString(pad)
		w.buf.WriteString(scalarText(k))
		w.buf.WriteByte(':')
		if err := w.value(n.Content[i+1], indent+2); err != nil {
			return err
		}
	}
	return nil
}

// overridden marks the keys of a mapping (by their index) that a later
// key of the same name replaces, as JSON reads a duplicate key: YAML
// refuses one, but yaml.v3 reads a JSON document's.
func overridden(n *yaml.Node) map[int]bool {
	if len(n.Content) <= 2 {
		return nil
	}
	seen := make(map[string]int, len(n.Content)/2)
	var out map[int]bool
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := deref(n.Content[i]).Value
		if j, ok := seen[k]; ok {
			if out == nil {
				out = map[int]bool{}
			}
			out[j] = true
		}
		seen[k] = i
	}
	return out
}

// scalarText is a scalar as block YAML reads it back to the same value.
func scalarText(n *yaml.Node) string {
	switch n.Tag {
	case "!!int", "!!float", "!!bool":
		return n.Value
	case "!!null":
		return "null"
	case "!!merge":
		return "<<"
	case "!!str", "!!timestamp", "":
		// A timestamp is a string to kin-openapi, which reads dates
		// (examples, defaults) as the text they are written as.
		return strconv.Quote(n.Value)
	}
	return n.Tag + " " + strconv.Quote(n.Value)
}
