// Package openenum lets a contract declare an enum open (x-open-enum: true)
// and have the breaking-change gate treat it so: a value added to an open
// enum is additive, since every client must accept a value it does not
// know, while a value removed from it still breaks the clients generated
// from the new contract, whose code named it.
//
// oasdiff has no such notion (its x-extensible-enum replaces enum, which
// would cost the generated types their constants), so the gate compares
// the revision with a base widened by Widen: the base's copy of each enum
// the revision marks open gains the revision's new values, and oasdiff
// sees no addition there, but every removal.
package openenum

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Marker is the extension that declares an enum open.
const Marker = "x-open-enum"

// Find returns the JSON pointers of the open enums of the OpenAPI document
// doc (YAML or JSON): every mapping with an enum and Marker set to true.
func Find(doc []byte) ([]string, error) {
	root, err := parse(doc)
	if err != nil {
		return nil, err
	}
	var found []string
	walk(root, "", func(pointer string, n *yaml.Node) {
		if isOpen(n) {
			found = append(found, pointer)
		}
	})
	return found, nil
}

// Widen returns base with each enum that revision marks open given the
// values the revision's has and base's lacks, after its own; an enum that
// is not where the revision has it, or not an enum in base, is left as it
// is (an addition there is the gate's to judge). Nothing else of base
// changes but its formatting.
func Widen(base, revision []byte) ([]byte, error) {
	rev, err := parse(revision)
	if err != nil {
		return nil, fmt.Errorf("the revision: %w", err)
	}
	b, err := parse(base)
	if err != nil {
		return nil, fmt.Errorf("the base: %w", err)
	}
	walk(rev, "", func(pointer string, n *yaml.Node) {
		if !isOpen(n) {
			return
		}
		target := lookup(b, pointer)
		if target == nil {
			return
		}
		have := value(target, "enum")
		if have == nil || have.Kind != yaml.SequenceNode {
			return
		}
		for _, v := range value(n, "enum").Content {
			if !slices.ContainsFunc(have.Content, func(h *yaml.Node) bool { return h.Value == v.Value && h.Tag == v.Tag }) {
				have.Content = append(have.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: v.Tag, Value: v.Value, Style: v.Style})
			}
		}
	})
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(b); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func parse(doc []byte) (*yaml.Node, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(doc, &root); err != nil {
		return nil, err
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) != 1 {
		return nil, fmt.Errorf("not one YAML document")
	}
	return root.Content[0], nil
}

// isOpen reports whether n is a mapping with an enum and Marker: true.
func isOpen(n *yaml.Node) bool {
	if n.Kind != yaml.MappingNode {
		return false
	}
	marker, enum := value(n, Marker), value(n, "enum")
	return marker != nil && marker.Kind == yaml.ScalarNode && marker.Value == "true" && enum != nil && enum.Kind == yaml.SequenceNode
}

// value is the value of key in the mapping n, or nil.
func value(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// walk calls visit for n and every node under it, with its JSON pointer.
func walk(n *yaml.Node, pointer string, visit func(string, *yaml.Node)) {
	visit(pointer, n)
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			walk(n.Content[i+1], pointer+"/"+escape(n.Content[i].Value), visit)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			walk(c, pointer+"/"+strconv.Itoa(i), visit)
		}
	}
}

// lookup is the node at pointer under n, or nil.
func lookup(n *yaml.Node, pointer string) *yaml.Node {
	if pointer == "" {
		return n
	}
	for _, token := range strings.Split(pointer[1:], "/") {
		token = strings.NewReplacer("~1", "/", "~0", "~").Replace(token)
		switch n.Kind {
		case yaml.MappingNode:
			n = value(n, token)
		case yaml.SequenceNode:
			i, err := strconv.Atoi(token)
			if err != nil || i < 0 || i >= len(n.Content) {
				return nil
			}
			n = n.Content[i]
		default:
			return nil
		}
		if n == nil {
			return nil
		}
	}
	return n
}

func escape(token string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(token)
}
