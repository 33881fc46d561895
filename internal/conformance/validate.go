package conformance

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// ValidatingTransport checks every response against an OpenAPI document
// (status, headers and body) and records each violation. Answers on paths
// the document does not describe are not checked.
type ValidatingTransport struct {
	// Base sends the requests.
	Base http.RoundTripper
	// router is built on the first answer: a document of thousands of
	// paths takes a while to route, and a run that sends nothing (a plan)
	// need not wait for it.
	router func() (routers.Router, error)

	mu         sync.Mutex
	violations []error
	checked    int
}

var registerDecoders sync.Once

// NewValidatingTransport returns a transport over base (nil: the default)
// that validates against doc the answers from baseURL, the API's URL with
// any path prefix; "" routes by path alone, whatever the host. It replaces
// doc's servers (the document's, its paths' and its operations') to do so.
// It routes answers to doc's operations from the first answer on: a
// document it cannot route makes every answer a violation that says why.
func NewValidatingTransport(doc *openapi3.T, baseURL string, base http.RoundTripper) (*ValidatingTransport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	registerDecoders.Do(func() {
		// kin-openapi has no decoder for HTML pages; their schema is a
		// plain string.
		openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder)
	})
	doc.Servers = nil
	if baseURL != "" {
		doc.Servers = openapi3.Servers{{URL: baseURL}}
	}
	if doc.Paths != nil {
		for _, item := range doc.Paths.Map() {
			item.Servers = nil
			for _, op := range item.Operations() {
				op.Servers = nil
			}
		}
	}
	router := sync.OnceValues(func() (routers.Router, error) {
		r, err := gorillamux.NewRouter(doc)
		if err != nil {
			return nil, fmt.Errorf("build spec router: %w", err)
		}
		return r, nil
	})
	return &ValidatingTransport{Base: base, router: router}, nil
}

// RoundTrip implements http.RoundTripper.
func (v *ValidatingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := v.Base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := readAnswer(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	checked, err := v.check(req, resp, body)
	v.mu.Lock()
	defer v.mu.Unlock()
	if checked {
		v.checked++
	}
	if err != nil {
		v.violations = append(v.violations, err)
	}
	return resp, nil
}

// check validates one answer; false: its path is not the document's.
func (v *ValidatingTransport) check(req *http.Request, resp *http.Response, body []byte) (bool, error) {
	router, err := v.router()
	if err != nil {
		return false, nil // response-valid says why nothing was checked
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		return false, nil
	}
	input := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status:  resp.StatusCode,
		Header:  resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true}, // an undeclared status is a violation
	}
	input.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(req.Context(), input); err != nil {
		return true, fmt.Errorf("%s %s: %d response violates the spec: %w (body: %.300s)", req.Method, req.URL.Path, resp.StatusCode, err, body)
	}
	return true, nil
}

// Unroutable is why no answer can be checked against the document: its
// paths could not be routed (nil: they can).
func (v *ValidatingTransport) Unroutable() error {
	_, err := v.router()
	return err
}

// Checked is how many answers were validated so far.
func (v *ValidatingTransport) Checked() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.checked
}

// Violations returns the violations recorded since the last call and
// forgets them.
func (v *ValidatingTransport) Violations() []error {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.violations
	v.violations = nil
	return out
}
