package conformance

import (
	"bytes"
	"errors"
	"fmt"
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
//
// Writing each alias out in full is what a YAML bomb counts on: a few
// hundred bytes of aliases of aliases stand for millions of nodes, which
// kin-openapi's own parser refuses (it counts aliases) but reads without a
// word once they are written out. So blockYAML writes at most
// expansionFactor times the nodes the tree is made of (and at least
// minExpansionBudget), and fails past it with an *expansionError.
func blockYAML(n *yaml.Node) ([]byte, error) {
	written := countNodes(n)
	w := &blockWriter{open: map[*yaml.Node]bool{}, written: written, left: max(expansionFactor*written, minExpansionBudget)}
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
	// written is how many nodes the tree is made of, each alias one node;
	// left, how many more nodes the writer may write.
	written, left int
}

// expansionFactor and minExpansionBudget bound what blockYAML writes:
// expansionFactor times the nodes of the document as it is written, and at
// least minExpansionBudget nodes, so that a small document may use an
// anchor a few times. A document's aliases rarely name more than a few
// shared schemas or responses; a bomb's grow it tenfold at each level.
const (
	expansionFactor    = 4
	minExpansionBudget = 10_000
)

// expansionError is a document whose YAML aliases, written out, would be
// more than blockYAML writes.
type expansionError struct {
	written, budget int
}

func (e *expansionError) Error() string {
	return fmt.Sprintf("the document's YAML aliases, written out, make more than %d nodes (%d times the %d it is written with, and at least %d): the tool reads no document that grows this much (a YAML bomb); use fewer aliases of collections",
		e.budget, expansionFactor, e.written, minExpansionBudget)
}

// countNodes counts the nodes of the tree at n as it is written: an alias
// is one node, and what it names is counted where it is anchored.
func countNodes(n *yaml.Node) int {
	count := 1
	for _, c := range n.Content {
		count += countNodes(c)
	}
	return count
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
	// Each entry of a collection is written as a node of its own (a key
	// and its value are two), whether it is an alias or not.
	w.left -= len(n.Content)
	if w.left < 0 {
		return &expansionError{written: w.written, budget: max(expansionFactor*w.written, minExpansionBudget)}
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
