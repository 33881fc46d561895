package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/wire/bearer"
)

// request is what observe logs of one request, kept in its context:
// observe puts it there, and the front door fills it in.
type request struct {
	ctx     requestContext
	id      string          // the request's id (see requestID)
	route   string          // the route pattern ("/orders/{id}")
	op      *oapi.Operation // the operation in openapi.yaml
	outcome idempotency.Outcome
	// body is the operation's body once validateBody has checked it, with
	// the value it decoded (see validatedBody).
	body validatedBody
}

// validatedBody is a request body with the value validateBody decoded from
// it and checked against its schema. The generated handlers bind that
// value (runtime.BindJSONBody takes a body with ValidatedValue, as
// kin-openapi's KeepValidatedValue leaves it) instead of decoding the body
// a second time; a value that does not bind, they decode from the bytes.
type validatedBody struct {
	io.ReadCloser
	value any
}

// ValidatedValue is the body's value, decoded and checked against its
// schema.
func (b *validatedBody) ValidatedValue() any { return b.value }

// validated is body, the body validateBody checked for the operation
// about to run, with the value it decoded, if it kept one.
func (req *request) validated(body io.ReadCloser) io.ReadCloser {
	if req.body.value == nil {
		return body
	}
	req.body.ReadCloser = body
	return &req.body
}

type requestKey struct{}

// requestContext is the context of a request as observe hands it on: its
// parent's, with the request (under requestKey) and its id (under chi's
// middleware.RequestIDKey, which middleware.GetReqID reads). It is part of
// the request, so that the two cost one context, and no allocation of
// their own.
type requestContext struct {
	context.Context
	req *request
}

// Value implements context.Context.
func (c *requestContext) Value(key any) any {
	switch key {
	case requestKey{}:
		return c.req
	case middleware.RequestIDKey:
		return c.req.id
	}
	return c.Context.Value(key)
}

// withRequest is r with req, whose id is id, in its context.
func withRequest(r *http.Request, req *request, id string) *http.Request {
	req.id = id
	req.ctx = requestContext{Context: r.Context(), req: req}
	return r.WithContext(&req.ctx)
}

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
// The body's schema is checked last (validateBody). On an operation with a
// key the front door hands the check to the protocol with the request
// (idempotency.Request.Check), which runs it when it has decided to run
// the request or to answer a mismatch: a body against the schema gets the
// same 400 whether or not its key was used before, and a replay, whose
// body means what the body that passed when its operation ran meant, does
// not pay for it (a fifth of a cached replay's CPU, docs/benchmarks.md).
// The handlers read the body as sent, numbers by their exact value
// (integral).
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
			if key, err = idempotency.ParseKey(r.Header.Values(idempotency.HeaderKey)); err != nil {
				f.problems.write(w, r, err)
				return
			}
		}
		if err := f.contract.check(w, r, req.route, req.op.Spec, body); err != nil {
			f.problems.write(w, r, err)
			return
		}
		canonicalIDs(r, req.op.Spec)
		if req.op.Idempotent {
			serve, ok := f.protocols[req.op.ID]
			if !ok { // never run unprotected
				f.problems.write(w, r, errNoUnit)
				return
			}
			w.Header().Set(idempotency.HeaderKey, key) // every answer repeats the key
			check := func() error { return f.contract.validateBody(r, req.op.Spec, body) }
			req.outcome = serve(w, r, idempotency.Request{Scope: auth.Scope(account), Key: key, Body: body, Check: check}, account, next)
			return
		}
		if err := f.contract.validateBody(r, req.op.Spec, body); err != nil {
			f.problems.write(w, r, err)
			return
		}
		r.Body = req.validated(io.NopCloser(bytes.NewReader(body)))
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
	token, ok := bearer.Token(r.Header.Get("Authorization"))
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
type contract struct {
	doc *openapi3.T
	// exact holds the request bodies whose checked value binds into their
	// generated types as their bytes decode (bindsExactly): validateBody
	// hands the operation that value, so that the body is decoded once.
	exact map[*openapi3.RequestBody]bool
	// routes are what check hands kin-openapi for each operation, made
	// once (see checkedRoute).
	routes map[*openapi3.Operation]*routers.Route
}

// newContract is doc's contract.
func newContract(doc *openapi3.T) contract {
	c := contract{doc: doc, exact: map[*openapi3.RequestBody]bool{}, routes: map[*openapi3.Operation]*routers.Route{}}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			c.routes[op] = checkedRoute(doc, path, item, method, op)
			if op.RequestBody == nil || op.RequestBody.Value == nil {
				continue
			}
			body, exact := op.RequestBody.Value, true
			for media, content := range body.Content {
				// An object: kin-openapi reads a top-level binary string
				// otherwise.
				exact = exact && (media == "application/json" || strings.HasSuffix(media, "+json")) &&
					content.Schema != nil && content.Schema.Value != nil && content.Schema.Value.Type.Is(openapi3.TypeObject) &&
					bindsExactly(content.Schema, map[*openapi3.Schema]bool{})
			}
			// OpenAPI 3.1 checks bodies as JSON Schema 2020-12, which
			// checkJSON does not ask for.
			c.exact[body] = exact && len(body.Content) > 0 && !doc.IsOpenAPI31OrLater()
		}
	}
	return c
}

// bindsExactly reports whether every JSON value the schema s accepts binds
// into its generated type from the value validation decoded
// (runtime.BindJSONValue) as it does from its bytes (encoding/json):
// validation sets no default in it, and every object takes no member but
// its properties, whose names encoding/json would match without regard to
// case, and BindJSONValue exactly. Anything else (composition, nullable,
// the keywords of OpenAPI 3.1) counts as not.
func bindsExactly(s *openapi3.SchemaRef, seen map[*openapi3.Schema]bool) bool {
	if s == nil || s.Value == nil {
		return false
	}
	v := s.Value
	if seen[v] {
		return true
	}
	seen[v] = true
	if v.Default != nil || v.Nullable || v.Type == nil || !v.Type.IsSingle() ||
		len(v.AllOf)+len(v.AnyOf)+len(v.OneOf)+len(v.PrefixItems)+len(v.PatternProperties)+len(v.DependentSchemas) > 0 ||
		v.Not != nil || v.Contains != nil || v.If != nil || v.Then != nil || v.Else != nil || v.Const != nil ||
		v.UnevaluatedItems.Has != nil || v.UnevaluatedItems.Schema != nil || v.UnevaluatedProperties.Has != nil || v.UnevaluatedProperties.Schema != nil {
		return false
	}
	switch {
	case v.Type.Is(openapi3.TypeObject):
		if v.AdditionalProperties.Has == nil || *v.AdditionalProperties.Has || v.AdditionalProperties.Schema != nil {
			return false
		}
		for _, p := range v.Properties {
			if !bindsExactly(p, seen) {
				return false
			}
		}
		return true
	case v.Type.Is(openapi3.TypeArray):
		return bindsExactly(v.Items, seen)
	default:
		return len(v.Properties) == 0 && v.Items == nil
	}
}

// checkedRoute is the route kin-openapi checks the requests to the
// operation op (method path) against. Its security requirements are
// checked with checkOptions' AuthenticationFunc, which accepts every
// scheme, since admit authenticates: what that check can refuse (a
// scheme the document does not declare) does not depend on the request.
// Where it passes, the route's operation is op without requirements, so
// that kin-openapi does not check them again at every request: the sorted
// names, the copy of the body, its closures.
func checkedRoute(doc *openapi3.T, path string, item *openapi3.PathItem, method string, op *openapi3.Operation) *routers.Route {
	route := &routers.Route{Spec: doc, Path: path, PathItem: item, Method: method, Operation: op}
	security := doc.Security
	if op.Security != nil {
		security = *op.Security
	}
	in := &openapi3filter.RequestValidationInput{Route: route, Options: &checkOptions}
	if openapi3filter.ValidateSecurityRequirements(context.Background(), in, security) == nil {
		checked := *op
		checked.Security = &openapi3.SecurityRequirements{}
		route.Operation = &checked
	}
	return route
}

// keyParsed leaves the Idempotency-Key header out of what kin-openapi
// checks of the operations the front door runs the protocol on: it has
// parsed the key (idempotency.ParseKey) before check runs, and refused
// every key the header's schema would, if that schema is the one
// ParseKey enforces (keySchema); else the header is checked as before.
func (c contract) keyParsed(ops []*oapi.Operation) {
	for _, op := range ops {
		route := c.routes[op.Spec]
		if route == nil || route.PathItem.Parameters.GetByInAndName(openapi3.ParameterInHeader, idempotency.HeaderKey) != nil {
			continue // one the path declares is checked unless the operation's overrides it
		}
		var kept openapi3.Parameters
		for _, p := range route.Operation.Parameters {
			if p.Value != nil && p.Value.In == openapi3.ParameterInHeader && strings.EqualFold(p.Value.Name, idempotency.HeaderKey) && keySchema(p.Value) {
				continue
			}
			kept = append(kept, p)
		}
		if len(kept) == len(route.Operation.Parameters) {
			continue
		}
		checked := *route.Operation
		checked.Parameters = kept
		route.Operation = &checked
	}
}

// keySchema reports whether the Idempotency-Key header p accepts every
// key idempotency.ParseKey accepts: one value of 1 to 255
// printable ASCII characters, which it checks the same way.
func keySchema(p *openapi3.Parameter) bool {
	if p.Schema == nil || p.Schema.Value == nil || p.Content != nil {
		return false
	}
	s := p.Schema.Value
	return s.Type != nil && s.Type.Is(openapi3.TypeString) && s.Type.IsSingle() && s.Format == "" && len(s.Enum) == 0 &&
		s.MinLength <= 1 && (s.MaxLength == nil || *s.MaxLength >= 255) &&
		(s.Pattern == "" || s.Pattern == `^[\x20-\x7E]+$`) &&
		len(s.AllOf)+len(s.AnyOf)+len(s.OneOf) == 0 && s.Not == nil && s.Const == nil
}

// input is what kin-openapi checks r against: the operation op of route,
// with the path parameters chi matched.
func (c contract) input(r *http.Request, route string, op *openapi3.Operation) *openapi3filter.RequestValidationInput {
	var params map[string]string // kin-openapi only reads it
	if rc := chi.RouteContext(r.Context()); rc != nil && len(rc.URLParams.Keys) > 0 {
		params = make(map[string]string, len(rc.URLParams.Keys))
		for i, name := range rc.URLParams.Keys {
			params[name] = rc.URLParams.Values[i]
		}
	}
	checked := c.routes[op]
	if checked == nil || checked.Path != route || checked.Method != r.Method {
		checked = &routers.Route{Spec: c.doc, Path: route, PathItem: c.doc.Paths.Value(route), Method: r.Method, Operation: op}
	}
	return &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: params,
		Route:      checked,
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

// validateBody checks r's body against the schema of its operation op,
// the last of the front door's checks (on an operation with a key, the
// protocol's Request.Check), and consumes no key. The value it decoded, if
// it kept one, goes to the handler (request.validated).
func (c contract) validateBody(r *http.Request, op *openapi3.Operation, body []byte) error {
	if holdsNUL(body) {
		// PostgreSQL stores no NUL in text or jsonb (SQLSTATE 22P05): the
		// operation would fail with a 500 on every retry.
		return &contractError{kind: errBadRequest, detail: "request body: a string holds the NUL character (\\u0000), which cannot be stored"}
	}
	if op == nil || op.RequestBody == nil || op.RequestBody.Value == nil {
		return nil
	}
	if value, ok := c.checkJSON(r, op.RequestBody.Value, body); ok {
		requestFrom(r.Context()).body.value = value
		return nil
	}
	// A body that fails, or one checkJSON leaves alone: kin-openapi says
	// why, in its words.
	req := *r
	req.Body, req.GetBody = io.NopCloser(bytes.NewReader(body)), nil
	input := &openapi3filter.RequestValidationInput{Request: &req, Options: &bodyOptions}
	if err := openapi3filter.ValidateRequestBody(r.Context(), input, op.RequestBody.Value); err != nil {
		return describe(err)
	}
	return nil
}

// checkJSON checks a JSON body of a request body rb that binds exactly
// (bindsExactly) against its schema as openapi3filter.ValidateRequestBody
// does (its decoder, its options), without what that costs besides
// decoding and validating: reading the body again, copying it and the
// request, and its options and closures. It returns the value it decoded,
// and whether the body passed; false also when it cannot tell (no body,
// a media type it has no schema for), and ValidateRequestBody decides.
func (c contract) checkJSON(r *http.Request, rb *openapi3.RequestBody, body []byte) (any, bool) {
	if len(body) == 0 || !c.exact[rb] {
		return nil, false
	}
	media := rb.Content.Get(r.Header.Get("Content-Type"))
	if media == nil || media.Schema == nil || media.Schema.Value == nil {
		return nil, false
	}
	value, err := openapi3filter.JSONBodyDecoder(bytes.NewReader(body), r.Header, media.Schema, nil)
	if err != nil {
		return nil, false
	}
	if err := media.Schema.Value.VisitJSON(value, jsonBodyOptions...); err != nil {
		return nil, false
	}
	return integral(value), true
}

// integral respells, in a body's decoded value, each number that is an
// integer written with a fraction or an exponent (2.0, 1.2e3) as that
// integer. The operation reads the body as sent, and the fingerprint
// compares numbers as exact values: "qty":2.0 and "qty":2 are one request,
// so the operation must read them alike, but a generated type's integer
// field binds only the second as written. Numbers beyond int64 are left
// as they are.
func integral(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, ok := integerSpelling(string(v)); ok {
			return json.Number(n)
		}
	case []any:
		for i := range v {
			v[i] = integral(v[i])
		}
	case map[string]any:
		for k := range v {
			v[k] = integral(v[k])
		}
	}
	return v
}

// integerSpelling is lit, a JSON number with a fraction or an exponent,
// spelled as the integer it is, if it is one of at most 19 digits.
func integerSpelling(lit string) (string, bool) {
	if !strings.ContainsAny(lit, ".eE") {
		return "", false
	}
	sign := ""
	if strings.HasPrefix(lit, "-") {
		sign, lit = "-", lit[1:]
	}
	mantissa, exponent, _ := strings.Cut(strings.ToLower(lit), "e")
	exp := 0
	if exponent != "" {
		e, err := strconv.Atoi(strings.TrimPrefix(exponent, "+"))
		if err != nil {
			return "", false
		}
		exp = e
	}
	whole, fraction, _ := strings.Cut(mantissa, ".")
	digits := strings.TrimLeft(whole+fraction, "0")
	exp -= len(fraction)
	trimmed := strings.TrimRight(digits, "0")
	exp += len(digits) - len(trimmed)
	switch {
	case trimmed == "":
		return "0", true
	case exp < 0 || len(trimmed)+exp > 19:
		return "", false
	}
	return sign + trimmed + strings.Repeat("0", exp), true
}

// jsonBodyOptions are the options ValidateRequestBody validates a JSON
// body with, bodyOptions given. Defaults are set where a schema has them,
// which no body that binds exactly has.
var jsonBodyOptions = []openapi3.SchemaValidationOption{openapi3.VisitAsRequest(), openapi3.DefaultsSet(func() {})}

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
