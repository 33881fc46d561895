package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"go.yaml.in/yaml/v3"

	"github.com/oncekey/oncekey/idempotency/oapi"
)

// SpecRoutes are the operations of an OpenAPI document that the protocol
// covers (they declare the Idempotency-Key header, or x-idempotency; see
// package oapi), each validating its body against the document's schema.
func SpecRoutes(doc *openapi3.T) ([]Route, error) {
	ops, err := oapi.New(doc, nil)
	if err != nil {
		return nil, err
	}
	var routes []Route
	for _, op := range ops.Covered() {
		rt := Route{Method: op.Method, Path: op.Path, TTL: op.TTL, Wait: op.Wait}
		if body := op.Spec.RequestBody; body != nil && body.Value != nil {
			rt.Validate = bodyValidator(body.Value)
		}
		routes = append(routes, rt)
	}
	if len(routes) == 0 {
		return nil, errors.New("gateway: the document covers no operation (none declares the Idempotency-Key header or x-idempotency)")
	}
	return routes, nil
}

// bodyValidator checks a body against an operation's request body schema.
func bodyValidator(body *openapi3.RequestBody) func(*http.Request, []byte) error {
	return func(r *http.Request, raw []byte) error {
		req := *r
		req.Body, req.GetBody = io.NopCloser(bytes.NewReader(raw)), nil
		input := &openapi3filter.RequestValidationInput{Request: &req, Options: &openapi3filter.Options{}}
		err := openapi3filter.ValidateRequestBody(r.Context(), input, body)
		if err == nil {
			return nil
		}
		detail := "request body: does not match the API's OpenAPI document"
		var schemaErr *openapi3.SchemaError
		switch {
		case errors.As(err, &schemaErr):
			where := "request body"
			if ptr := schemaErr.JSONPointer(); len(ptr) > 0 {
				where += " at /" + strings.Join(ptr, "/")
			}
			detail = where + ": " + schemaErr.Reason
		case errors.Is(err, openapi3filter.ErrInvalidRequired):
			detail = "request body is required"
		}
		return &invalidError{detail}
	}
}

// invalidError is a request that breaks the upstream's OpenAPI document:
// 400, and no key consumed.
type invalidError struct{ detail string }

func (e *invalidError) Error() string { return e.detail }

// routeFile is the routes file read by ReadRoutes.
type routeFile struct {
	Routes []struct {
		Method string `yaml:"method"`
		Path   string `yaml:"path"`
		TTL    string `yaml:"ttl"`
		Wait   string `yaml:"wait"`
	} `yaml:"routes"`
}

// ReadRoutes reads the covered routes of an API without an OpenAPI
// document, from YAML:
//
//	routes:
//	  - method: POST
//	    path: /transfers          # {name} matches any one segment
//	    ttl: 24h                  # optional, Go durations
//	    wait: 2s                  # optional
func ReadRoutes(in io.Reader) ([]Route, error) {
	dec := yaml.NewDecoder(in)
	dec.KnownFields(true)
	var f routeFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("gateway: routes file: %w", err)
	}
	if len(f.Routes) == 0 {
		return nil, errors.New("gateway: the routes file lists no routes")
	}
	routes := make([]Route, 0, len(f.Routes))
	for i, r := range f.Routes {
		rt := Route{Method: r.Method, Path: r.Path}
		for _, d := range []struct {
			name, value string
			to          *time.Duration
		}{{"ttl", r.TTL, &rt.TTL}, {"wait", r.Wait, &rt.Wait}} {
			if d.value == "" {
				continue
			}
			v, err := time.ParseDuration(d.value)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("gateway: routes file: route %d: %s %q is not a positive duration such as 24h", i+1, d.name, d.value)
			}
			*d.to = v
		}
		if r.Method == "" || r.Path == "" {
			return nil, fmt.Errorf("gateway: routes file: route %d needs a method and a path", i+1)
		}
		routes = append(routes, rt)
	}
	if _, err := compile(slices.Clone(routes)); err != nil {
		return nil, err
	}
	return routes, nil
}
