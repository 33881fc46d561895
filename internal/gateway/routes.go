package gateway

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"go.yaml.in/yaml/v3"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
	"github.com/oncekey/oncekey/idempotency/oapi"
)

// SpecRoutes are the operations of an OpenAPI document that the protocol
// covers (they declare the Idempotency-Key header, or x-idempotency; see
// package oapi; or a header whose name ends in Idempotency-Key, such as
// X-Idempotency-Key), each validating its body against the document's
// schema and reading its key from the header it declares (an operation
// that declares none reads it where Config.Key says); x-idempotency's
// key-header or key-field, where it names one, wins.
//
// An operation whose document declares no 202 answer is given the ietf
// profile whatever the gateway's: its clients take every 2xx for the
// operation's result, so the gateway must never send one the upstream did
// not. One that declares a 202 takes the gateway's profile.
func SpecRoutes(doc *openapi3.T) ([]Route, error) {
	ops, err := oapi.New(doc, nil)
	if err != nil {
		return nil, err
	}
	var routes []Route
	for path, item := range doc.Paths.Map() {
		for method, spec := range item.Operations() {
			op := ops.Find(method, path)
			header := keyHeader(item.Parameters, spec.Parameters)
			if op == nil || !(op.Idempotent || header != "" && spec.Extensions[oapi.Extension] != false) {
				continue
			}
			key := frontdoor.KeyPlace{Header: cmp.Or(op.KeyHeader, header)}
			if op.KeyField != "" { // x-idempotency's key-field: a top-level member
				key = frontdoor.KeyPlace{BodyField: "/" + op.KeyField}
			}
			rt := Route{Method: op.Method, Path: op.Path, TTL: op.TTL, Wait: op.Wait, Key: key,
				RepeatWindow: op.RepeatWindow, RefuseRepeats: op.RefuseRepeats, MaxStored: op.MaxStored}
			if spec.Responses.Value("202") == nil {
				rt.Profile = frontdoor.IETF
			}
			if body := op.Spec.RequestBody; body != nil && body.Value != nil {
				rt.Validate = bodyValidator(body.Value)
			}
			routes = append(routes, rt)
		}
	}
	if len(routes) == 0 {
		return nil, errors.New("gateway: the document covers no operation (none declares the Idempotency-Key header or x-idempotency)")
	}
	slices.SortFunc(routes, func(a, b Route) int { return strings.Compare(a.Path+" "+a.Method, b.Path+" "+b.Method) })
	return routes, nil
}

// keyHeader is the header parameter, of the path's or the operation's,
// that carries the key: one whose name ends in Idempotency-Key, case
// aside (Idempotency-Key, X-Idempotency-Key), as `oncekey conformance`
// reads it; "" if none.
func keyHeader(params ...openapi3.Parameters) string {
	for _, ps := range params {
		for _, p := range ps {
			if p.Value != nil && p.Value.In == openapi3.ParameterInHeader &&
				strings.HasSuffix(strings.ToLower(p.Value.Name), strings.ToLower(idempotency.HeaderKey)) {
				return p.Value.Name
			}
		}
	}
	return ""
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
		// RepeatWindow ("off" or a duration) and RefuseRepeats override
		// the gateway's for the route.
		RepeatWindow  string `yaml:"repeat_window"`
		RefuseRepeats bool   `yaml:"refuse_repeats"`
		// MaxStoredBytes bounds the responses the route stores, and
		// StoreResponses false stores none (Route.MaxStored).
		MaxStoredBytes *int64 `yaml:"max_stored_bytes"`
		StoreResponses *bool  `yaml:"store_responses"`
		// Profile, ErrorTemplate, KeyHeader and KeyBodyField override
		// the gateway's for the route.
		Profile       string `yaml:"profile"`
		ErrorTemplate string `yaml:"error_template"`
		KeyHeader     string `yaml:"key_header"`
		KeyBodyField  string `yaml:"key_body_field"`
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
//	    repeat_window: 10m        # optional: "off", or how long a request is
//	                              # remembered to spot it under a new key
//	    refuse_repeats: true      # optional: refuse such a repeat (409)
//	    max_stored_bytes: 65536   # optional: store responses up to this size
//	    store_responses: false    # optional: store no response at all
//	    profile: oncekey          # optional: ietf or oncekey
//	    error_template: err.json  # optional: the route's error shape
//	    key_header: X-Idempotency-Key  # or key_body_field: /idempotency_key
//
// An error_template's path is read from the working directory; see
// ReadRoutesFile.
func ReadRoutes(in io.Reader) ([]Route, error) { return readRoutes(in, "") }

// ReadRoutesFile reads the routes file at path, as ReadRoutes, with its
// routes' error_template paths taken from the file's directory.
func ReadRoutesFile(path string) ([]Route, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readRoutes(f, filepath.Dir(path))
}

// ReadErrorTemplate reads the error template in the file at path.
func ReadErrorTemplate(path string) (*frontdoor.Template, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := frontdoor.ParseTemplate(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// storedLimit is Route.MaxStored for a route of the routes file that
// sets limit (max_stored_bytes) or store (store_responses), each nil
// where it is not set.
func storedLimit(limit *int64, store *bool) (int64, error) {
	switch {
	case store != nil && !*store && limit != nil:
		return 0, errors.New("store_responses: false stores no response, and max_stored_bytes bounds those stored: give one of them")
	case store != nil && !*store:
		return StoreNone, nil
	case limit == nil:
		return 0, nil
	case *limit <= 0:
		return 0, fmt.Errorf("max_stored_bytes %d is not a positive number of bytes (store_responses: false stores no response)", *limit)
	}
	return *limit, nil
}

func readRoutes(in io.Reader, dir string) ([]Route, error) {
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
		rt := Route{Method: r.Method, Path: r.Path, RefuseRepeats: r.RefuseRepeats}
		for _, d := range []struct {
			name, value string
			to          *time.Duration
		}{{"ttl", r.TTL, &rt.TTL}, {"wait", r.Wait, &rt.Wait}, {"repeat_window", r.RepeatWindow, &rt.RepeatWindow}} {
			if d.value == "" {
				continue
			}
			if d.name == "repeat_window" && d.value == "off" {
				*d.to = -1
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
		var err error
		if rt.MaxStored, err = storedLimit(r.MaxStoredBytes, r.StoreResponses); err != nil {
			return nil, fmt.Errorf("gateway: routes file: route %d: %w", i+1, err)
		}
		if r.Profile != "" {
			if rt.Profile, err = frontdoor.ParseProfile(r.Profile); err != nil {
				return nil, fmt.Errorf("gateway: routes file: route %d: %w", i+1, err)
			}
		}
		rt.Key = frontdoor.KeyPlace{Header: r.KeyHeader, BodyField: r.KeyBodyField}
		if err := rt.Key.Check(); err != nil {
			return nil, fmt.Errorf("gateway: routes file: route %d: %w", i+1, err)
		}
		if r.ErrorTemplate != "" {
			path := r.ErrorTemplate
			if !filepath.IsAbs(path) && dir != "" {
				path = filepath.Join(dir, path)
			}
			if rt.ErrorTemplate, err = ReadErrorTemplate(path); err != nil {
				return nil, fmt.Errorf("gateway: routes file: route %d: error_template: %w", i+1, err)
			}
		}
		routes = append(routes, rt)
	}
	if _, err := compile(slices.Clone(routes)); err != nil {
		return nil, err
	}
	return routes, nil
}
