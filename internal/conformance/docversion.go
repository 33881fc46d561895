package conformance

import (
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// checkVersion says, before kin-openapi reads the document at root, what
// it is when it is not an OpenAPI 3 document: a Swagger 2.0 one, say,
// which kin-openapi would refuse with an error for each of its operations.
func checkVersion(root *yaml.Node) error {
	top := deref(root)
	if top.Kind == yaml.DocumentNode && len(top.Content) > 0 {
		top = deref(top.Content[0])
	}
	if top.Kind != yaml.MappingNode {
		return errors.New("not an OpenAPI document: it holds no object of fields")
	}
	openapi, swagger := field(top, "openapi"), field(top, "swagger")
	if swagger != nil && openapi == nil {
		return fmt.Errorf("a Swagger %s document: the tool reads OpenAPI 3.0 and 3.1 (convert it to OpenAPI 3 first, with swagger2openapi say)", swagger.Value)
	}
	if openapi == nil {
		return errors.New("not an OpenAPI document: it has no openapi field (the version of OpenAPI it follows)")
	}
	if !strings.HasPrefix(openapi.Value, "3.") {
		return fmt.Errorf("OpenAPI %q: the tool reads OpenAPI 3.0 and 3.1", openapi.Value)
	}
	return nil
}

// field is the value of key in the mapping m, or nil.
func field(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return deref(m.Content[i+1])
		}
	}
	return nil
}
