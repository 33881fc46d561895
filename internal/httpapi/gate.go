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
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/google/uuid"

	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/idempotency"
	"github.com/oncekey/oncekey/internal/problem"
)

// gate checks every request against openapi.yaml before any handler runs,
// in the order a client would want to hear about problems: body size (413),
// authentication (401, or 503 when the key cannot be checked), the
// Idempotency-Key header (400), then the contract (415 for the media type,
// 400 for everything else). A request the gate rejects never reaches the
// idempotency layer, so it consumes no key.
//
// The body's schema is the one part of the contract checked later, by
// validateBody, inside the idempotency layer: a replay's body is the very
// body (the same canonical bytes, or its fingerprint would differ) that
// passed the check when its operation ran, so checking it again would only
// cost time, the largest single cost of a replay in the profile. A body
// that fails it still consumes no key: the 400 is not stored.
type gate struct {
	router  routers.Router
	auth    auth.Store
	maxBody int64
	log     *slog.Logger
}

func newGate(doc *openapi3.T, store auth.Store, maxBody int64, log *slog.Logger) (*gate, error) {
	// Route by path alone: the servers list documents where the API is
	// deployed and must not make requests to other hosts unroutable.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("build OpenAPI router: %w", err)
	}
	return &gate{router: router, auth: store, maxBody: maxBody, log: log}, nil
}

func (g *gate) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route, pathParams, err := g.router.FindRoute(r)
		if err != nil {
			// Not in the contract: chi answers 404 or 405 as problems.
			next.ServeHTTP(w, r)
			return
		}
		// Known before routing, so requests the gate rejects are still
		// counted under their route rather than as unmatched.
		setRoute(r.Context(), route.Path)
		if !g.readBody(w, r) {
			return
		}
		ctx := r.Context()
		if requiresAuth(route) {
			account, err := g.authenticate(ctx, r)
			if errors.Is(err, auth.ErrUnknownKey) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="oncekey"`)
				problem.Write(w, problem.Unauthorized, "send an API key as 'Authorization: Bearer <key>'")
				return
			}
			if err != nil {
				// The key may well be valid: a 401 would make clients give
				// up on an operation they should retry.
				g.log.WarnContext(ctx, "api key lookup failed", "err", err)
				w.Header().Set("Retry-After", "1")
				problem.Write(w, problem.Unavailable, "the API key could not be checked right now; retry later (with the same Idempotency-Key, if any)")
				return
			}
			ctx = auth.WithAccount(ctx, account)
			r = r.WithContext(ctx)
		}
		if declaresKey(route) {
			// Checked before the generic validator so that key errors carry
			// their own problem types.
			if _, err := idempotency.ParseKey(r.Header); err != nil {
				idempotency.WriteKeyError(w, err)
				return
			}
		}
		input := &openapi3filter.RequestValidationInput{
			Request:    r,
			PathParams: pathParams,
			Route:      route,
			Options: &openapi3filter.Options{
				AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, // done above
				ExcludeRequestBody: true,                                  // validateBody
				MultiError:         false,
			},
		}
		if err := openapi3filter.ValidateRequest(ctx, input); err != nil {
			kind, detail := describe(err)
			problem.Write(w, kind, detail)
			return
		}
		if !acceptsMediaType(route, r) {
			problem.Write(w, problem.UnsupportedMediaType, "send the body as application/json")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, validationKey{}, input)))
	})
}

type validationKey struct{}

// acceptsMediaType reports whether the operation takes a body of the
// request's Content-Type, or the request has no body to type.
func acceptsMediaType(route *routers.Route, r *http.Request) bool {
	body := route.Operation.RequestBody
	if body == nil || body.Value == nil || len(body.Value.Content) == 0 || r.ContentLength == 0 {
		return true
	}
	return body.Value.Content.Get(r.Header.Get("Content-Type")) != nil
}

// validateBody checks the request body against the operation's schema
// (see gate): registered per operation, inside the idempotency layer, so
// only requests whose operation is about to run pay for it.
func validateBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !refuseBody(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// refuseBody answers 400 (or 415) and returns true if the body does not
// match the operation's schema; otherwise it leaves r's body to be read
// again and returns false. It is also the idempotency layer's Refuse, so
// that a body against the schema is refused alike whether its key was used
// or not.
func refuseBody(w http.ResponseWriter, r *http.Request) bool {
	input, ok := r.Context().Value(validationKey{}).(*openapi3filter.RequestValidationInput)
	if !ok || input.Route.Operation.RequestBody == nil || input.Route.Operation.RequestBody.Value == nil {
		return false
	}
	// The body the operation will read (the idempotency layer's canonical
	// form), buffered already; the validator reads a copy, since it would
	// restore the body it first saw (GetBody).
	body, err := io.ReadAll(r.Body)
	if err != nil {
		problem.Write(w, problem.Validation, "the request body could not be read")
		return true
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	req := *r
	req.Body, req.GetBody = io.NopCloser(bytes.NewReader(body)), nil
	in := *input
	in.Request = &req
	if err := openapi3filter.ValidateRequestBody(r.Context(), &in, input.Route.Operation.RequestBody.Value); err != nil {
		kind, detail := describe(err)
		problem.Write(w, kind, detail)
		return true
	}
	return false
}

// readBody buffers the body up to the limit, so the validator, the
// idempotency layer and the handler can each read it, and answers 413
// without reading more than the limit of an oversized body.
func (g *gate) readBody(w http.ResponseWriter, r *http.Request) bool {
	if r.ContentLength > g.maxBody {
		problem.Write(w, problem.PayloadTooLarge, fmt.Sprintf("the body is %d bytes; the limit is %d", r.ContentLength, g.maxBody))
		return false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			problem.Write(w, problem.PayloadTooLarge, fmt.Sprintf("the body exceeds the limit of %d bytes", g.maxBody))
			return false
		}
		problem.Write(w, problem.Validation, "the request body could not be read")
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body)) // known now, chunked or not
	return true
}

// authenticate resolves the bearer key. Every client-side failure — no
// header, another scheme, an unknown or revoked key — is auth.ErrUnknownKey
// and gets the same answer, so the response tells an attacker nothing about
// which keys exist. Any other error means the lookup itself failed.
func (g *gate) authenticate(ctx context.Context, r *http.Request) (uuid.UUID, error) {
	token, ok := auth.BearerToken(r.Header.Get("Authorization"))
	if !ok {
		return uuid.UUID{}, auth.ErrUnknownKey
	}
	return g.auth.AccountByKeyHash(ctx, auth.HashKey(token))
}

func declaresKey(route *routers.Route) bool {
	for _, p := range route.Operation.Parameters {
		if p.Value != nil && p.Value.In == openapi3.ParameterInHeader && strings.EqualFold(p.Value.Name, idempotency.HeaderKey) {
			return true
		}
	}
	return false
}

func requiresAuth(route *routers.Route) bool {
	security := route.Spec.Security
	if route.Operation.Security != nil {
		security = *route.Operation.Security
	}
	return len(security) > 0
}

// describe turns a validation error into a problem kind and a short detail:
// where the problem is and what is wrong, never a dump of the schema.
func describe(err error) (problem.Kind, string) {
	var reqErr *openapi3filter.RequestError
	if !errors.As(err, &reqErr) {
		return problem.Validation, "the request does not match the API contract"
	}
	if reqErr.RequestBody != nil && strings.HasPrefix(reqErr.Reason, "header Content-Type has unexpected value") {
		return problem.UnsupportedMediaType, "send the body as application/json"
	}
	// Parameters fail to parse with the same error type ("limit=abc"); only
	// a body that does not parse is malformed JSON.
	var parseErr *openapi3filter.ParseError
	if reqErr.RequestBody != nil && errors.As(err, &parseErr) {
		return problem.MalformedJSON, "the request body is not valid JSON"
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
		return problem.Validation, where + ": " + schemaErr.Reason
	}
	if errors.Is(err, openapi3filter.ErrInvalidRequired) {
		return problem.Validation, where + " is required"
	}
	reason := reqErr.Reason
	if reason == "" && reqErr.Err != nil {
		reason = reqErr.Err.Error()
	}
	return problem.Validation, where + ": " + reason
}
