package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/auth"
)

// request is what observe logs of one request, kept in its context:
// observe puts it there, and the front door fills it in.
type request struct {
	route   string          // the route pattern ("/orders/{id}")
	op      *oapi.Operation // the operation in openapi.yaml
	outcome idempotency.Outcome
}

type requestKey struct{}

// requestFrom returns the request in ctx; a context without one gets an
// empty one.
func requestFrom(ctx context.Context) *request {
	if req, ok := ctx.Value(requestKey{}).(*request); ok {
		return req
	}
	return &request{}
}

// frontDoor checks every request to an operation of openapi.yaml before its
// handler runs, in the order a client would want to hear about problems:
// body size (413), authentication (401, or 503 when the key cannot be
// checked), the Idempotency-Key header (400), then the contract (415 for the
// media type, 400 for everything else). It reads the body once, and runs
// the idempotency protocol on the operations that declare the key. A
// request it refuses consumes no key.
//
// The body's schema is the one part of the contract checked later, by the
// protocol, only when the operation is about to run (validateBody): a
// replay's body is the very body (the same canonical bytes, or its
// fingerprint would differ) that passed the check when its operation ran,
// so checking it again would only cost time. A body that fails it still
// consumes no key.
type frontDoor struct {
	ops      *oapi.Operations
	contract contract
	auth     auth.Store
	maxBody  int64
	log      *slog.Logger
	problems problemWriter
	// protocols runs each operation that takes an Idempotency-Key, by its
	// operationId.
	protocols map[string]protocol
	// baseline runs them without it (the benchmark's WithoutIdempotency).
	baseline bool
}

func (f *frontDoor) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := requestFrom(r.Context())
		req.route = routePattern(r)
		req.op = f.ops.Find(r.Method, req.route)
		if req.op == nil {
			f.problems.write(w, r, fmt.Errorf("%w: %s", errNoEndpoint, r.URL.Path))
			return
		}
		if f.contract.requiresAuth(req.op.Spec) {
			// Every answer of an authenticated operation holds one
			// account's data, replays included (whose stored headers keep
			// this one): no cache on the way may keep it.
			w.Header().Set("Cache-Control", "no-store")
		}
		body, err := f.readBody(w, r)
		if err != nil {
			f.problems.write(w, r, err)
			return
		}
		account, err := f.admit(r, req.op)
		if err != nil {
			f.problems.write(w, r, err)
			return
		}
		var key string
		if req.op.Idempotent {
			if key, err = idempotency.ParseKey(r.Header); err != nil {
				f.problems.write(w, r, err)
				return
			}
		}
		if err := f.contract.check(w, r, req.route, req.op.Spec, body); err != nil {
			f.problems.write(w, r, err)
			return
		}
		canonicalIDs(r, req.op.Spec)
		if req.op.Idempotent && !f.baseline {
			serve, ok := f.protocols[req.op.ID]
			if !ok { // never run unprotected
				f.problems.write(w, r, errNoUnit)
				return
			}
			req.outcome = serve(w, r, idempotency.Prepared{Scope: auth.Scope(account), Key: key, Body: body}, account, next)
			return
		}
		if err := f.contract.validateBody(r, body); err != nil {
			f.problems.write(w, r, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, withCall(r, call[noUnit]{account: account}))
	})
}

// admit authenticates the caller of an operation that requires it.
// Every client-side failure (no header, another scheme, an unknown or
// revoked key) is errUnauthorized and gets the same answer, so the response
// tells an attacker nothing about which keys exist. A lookup that itself
// failed is a 503: the key may well be valid, and a 401 would make clients
// give up on an operation they should retry.
func (f *frontDoor) admit(r *http.Request, op *oapi.Operation) (uuid.UUID, error) {
	if !f.contract.requiresAuth(op.Spec) {
		return uuid.Nil, nil
	}
	if n := len(r.Header.Values("Authorization")); n > 1 {
		// Which one would win differs between proxies and servers: an
		// account must never be chosen by the order of two headers.
		return uuid.Nil, &contractError{kind: errBadRequest, detail: fmt.Sprintf("send exactly one Authorization header, got %d", n)}
	}
	token, ok := auth.BearerToken(r.Header.Get("Authorization"))
	if !ok {
		return uuid.Nil, errUnauthorized
	}
	account, err := f.auth.AccountByKeyHash(r.Context(), auth.HashKey(token))
	switch {
	case errors.Is(err, auth.ErrUnknownKey):
		return uuid.Nil, errUnauthorized
	case err != nil:
		f.log.WarnContext(r.Context(), "api key lookup failed", "err", err)
		return uuid.Nil, fmt.Errorf("%w: the API key could not be checked right now: %w", errAuthUnavailable, err)
	}
	return account, nil
}

// readBody reads the whole body as the engine does (idempotency.ReadBody):
// an oversized one is not read beyond the limit, and one that breaks off is
// malformed.
func (f *frontDoor) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := idempotency.ReadBody(w, r, f.maxBody)
	if err != nil {
		return nil, err
	}
	r.ContentLength = int64(len(body)) // known now, chunked or not
	return body, nil
}

// contract is openapi.yaml, which requests are checked against.
type contract struct{ doc *openapi3.T }

// input is what kin-openapi checks r against: the operation op of route,
// with the path parameters chi matched.
func (c contract) input(r *http.Request, route string, op *openapi3.Operation) *openapi3filter.RequestValidationInput {
	params := map[string]string{}
	if rc := chi.RouteContext(r.Context()); rc != nil {
		for i, name := range rc.URLParams.Keys {
			params[name] = rc.URLParams.Values[i]
		}
	}
	return &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: params,
		Route:      &routers.Route{Spec: c.doc, Path: route, PathItem: c.doc.Paths.Value(route), Method: r.Method, Operation: op},
		Options:    &checkOptions,
	}
}

// checkOptions check everything of a request but its body's schema
// (validateBody's).
var checkOptions = openapi3filter.Options{
	AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, // admit did it
	ExcludeRequestBody: true,
}

// bodyOptions check a body against its schema, for which kin-openapi
// reads nothing of the input but the request and these.
var bodyOptions openapi3filter.Options

// check validates the request's parameters and media type against the
// operation op of route; its body's schema is validateBody's.
func (c contract) check(w http.ResponseWriter, r *http.Request, route string, op *openapi3.Operation, body []byte) error {
	input := c.input(r, route, op)
	r.Body = http.NoBody
	if err := openapi3filter.ValidateRequest(r.Context(), input); err != nil {
		return describe(err)
	}
	if len(body) > 0 {
		if n := len(r.Header.Values("Content-Type")); n > 1 {
			// Which one would win differs between proxies and servers: a
			// body must be read one way only, as its fingerprint is.
			return &contractError{kind: errBadRequest, detail: fmt.Sprintf("send exactly one Content-Type header, got %d", n)}
		}
		if coding := contentCoding(r.Header); coding != "" {
			// RFC 9110 §15.5.16: a 415 for a content coding names the
			// codings that are accepted.
			w.Header().Set("Accept-Encoding", "identity")
			return &contractError{kind: errUnsupportedMediaType, detail: fmt.Sprintf("Content-Encoding %q is not accepted: send the body unencoded (request bodies here are small)", coding)}
		}
	}
	if !acceptsMediaType(op, r, len(body)) {
		return errUnsupportedMediaType
	}
	return nil
}

// contentCoding is the first content coding of the request's body other
// than identity, or "" when it has none: a body is taken as its bytes say,
// never decoded, so a coding would be read as garbage or, worse, as JSON
// that it is not.
func contentCoding(h http.Header) string {
	for _, v := range h.Values("Content-Encoding") {
		for coding := range strings.SplitSeq(v, ",") {
			if c := strings.TrimSpace(coding); c != "" && !strings.EqualFold(c, "identity") {
				return c
			}
		}
	}
	return ""
}

// canonicalIDs rewrites the request's path parameters that are UUIDs
// (format uuid in openapi.yaml, which checkContract has held them to) to
// their canonical lower-case spelling, in the URL and in the route's
// parameters: the fingerprint and the handler then see one spelling of one
// id, and a retry that respells it is the same request.
func canonicalIDs(r *http.Request, op *openapi3.Operation) {
	rc := chi.RouteContext(r.Context())
	if rc == nil {
		return
	}
	changed := false
	for _, p := range op.Parameters {
		if p.Value == nil || p.Value.In != openapi3.ParameterInPath || p.Value.Schema == nil || p.Value.Schema.Value == nil || p.Value.Schema.Value.Format != "uuid" {
			continue
		}
		for i, name := range rc.URLParams.Keys {
			if name != p.Value.Name {
				continue
			}
			if id, err := uuid.Parse(rc.URLParams.Values[i]); err == nil && id.String() != rc.URLParams.Values[i] {
				rc.URLParams.Values[i], changed = id.String(), true
			}
		}
	}
	if !changed {
		return
	}
	path := rc.RoutePattern()
	for i, name := range rc.URLParams.Keys {
		path = strings.Replace(path, "{"+name+"}", rc.URLParams.Values[i], 1)
	}
	r.URL.Path, r.URL.RawPath = path, ""
}

// acceptsMediaType reports whether the operation takes a body of the
// request's Content-Type, or the request has no body to type.
func acceptsMediaType(op *openapi3.Operation, r *http.Request, size int) bool {
	body := op.RequestBody
	if body == nil || body.Value == nil || len(body.Value.Content) == 0 || size == 0 {
		return true
	}
	return body.Value.Content.Get(r.Header.Get("Content-Type")) != nil
}

// validateBody checks a body against the schema of the operation chi
// routed r to. It is the idempotency protocol's Validate (Config.Validate):
// called only when the operation is about to run, and before a request
// whose key holds another request's outcome is answered 409, so that a
// body against the schema gets the same 400 whether or not its key was
// used before.
func (c contract) validateBody(r *http.Request, body []byte) error {
	if holdsNUL(body) {
		// PostgreSQL stores no NUL in text or jsonb (SQLSTATE 22P05): the
		// operation would fail with a 500 on every retry.
		return &contractError{kind: errBadRequest, detail: "request body: a string holds the NUL character (\\u0000), which cannot be stored"}
	}
	route := routePattern(r)
	item := c.doc.Paths.Value(route)
	if item == nil {
		return nil
	}
	op := item.GetOperation(r.Method)
	if op == nil || op.RequestBody == nil || op.RequestBody.Value == nil {
		return nil
	}
	req := *r
	req.Body, req.GetBody = io.NopCloser(bytes.NewReader(body)), nil
	input := &openapi3filter.RequestValidationInput{Request: &req, Options: &bodyOptions}
	if err := openapi3filter.ValidateRequestBody(r.Context(), input, op.RequestBody.Value); err != nil {
		return describe(err)
	}
	return nil
}

// holdsNUL reports whether a JSON document has a string with the NUL
// character in it: JSON can only spell it \u0000, an escape that is not
// itself escaped (preceded by an odd number of backslashes, its own
// included).
func holdsNUL(doc []byte) bool {
	for i := 0; ; {
		j := bytes.Index(doc[i:], []byte(`\u0000`))
		if j < 0 {
			return false
		}
		at := i + j
		slashes := 1
		for k := at - 1; k >= 0 && doc[k] == '\\'; k-- {
			slashes++
		}
		if slashes%2 == 1 {
			return true
		}
		i = at + 1
	}
}

// requiresAuth reports whether op is for authenticated callers only.
func (c contract) requiresAuth(op *openapi3.Operation) bool {
	security := c.doc.Security
	if op.Security != nil {
		security = *op.Security
	}
	return len(security) > 0
}

// describe turns a validation error into a problem: where the problem is
// and what is wrong, never a dump of the schema.
func describe(err error) error {
	var reqErr *openapi3filter.RequestError
	if !errors.As(err, &reqErr) {
		return &contractError{kind: errBadRequest, detail: "the request does not match the API contract"}
	}
	if reqErr.RequestBody != nil && strings.HasPrefix(reqErr.Reason, "header Content-Type has unexpected value") {
		return errUnsupportedMediaType
	}
	// Parameters fail to parse with the same error type ("limit=abc"); only
	// a body that does not parse is malformed JSON.
	var parseErr *openapi3filter.ParseError
	if reqErr.RequestBody != nil && errors.As(err, &parseErr) {
		return &contractError{kind: idempotency.ErrMalformedBody, detail: "the request body is not valid JSON"}
	}
	where := "request body"
	if p := reqErr.Parameter; p != nil {
		where = fmt.Sprintf("%s parameter %q", p.In, p.Name)
	}
	var schemaErr *openapi3.SchemaError
	if errors.As(err, &schemaErr) {
		if ptr := schemaErr.JSONPointer(); len(ptr) > 0 {
			where += " at /" + strings.Join(ptr, "/")
		}
		return &contractError{kind: errBadRequest, detail: where + ": " + schemaErr.Reason}
	}
	if errors.Is(err, openapi3filter.ErrInvalidRequired) {
		return &contractError{kind: errBadRequest, detail: where + " is required"}
	}
	reason := reqErr.Reason
	if reason == "" && reqErr.Err != nil {
		reason = reqErr.Err.Error()
	}
	return &contractError{kind: errBadRequest, detail: where + ": " + reason}
}

// contractError is a request that breaks openapi.yaml: which kind of
// problem it is, and a detail for the client.
type contractError struct {
	kind   error
	detail string
}

func (e *contractError) Error() string { return e.detail }
func (e *contractError) Unwrap() error { return e.kind }
