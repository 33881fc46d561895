package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
)

// setupError is a check that could not test its promise at all, because
// the tool could not make a request that works: Run reports it as Error, not
// Fail, so that CI can tell "the API breaks the protocol" (exit 1) from "the
// tool needs a hint" (exit 2). Which errors are setup errors, call site by
// call site:
//
//   - Building a request (build) that fails: an operation that makes a
//     resource the request needs (inferred, or a {{create:…}} template)
//     that did not answer 2xx with the value, or a template that names no
//     operation.
//   - The first request of a check under a new key (first, sendFirst,
//     working, works for mismatch-request's other request, in-flight's
//     slowed first request) refused because of the request itself (400,
//     404, 405, 415, or the profile's mismatch status, to a key no request
//     has used) or of the credential (401, 403): nothing was tested yet.
//   - concurrent-once's and in-flight's identical requests sent at once,
//     when every answer that was neither in flight nor a replay is such a
//     refusal: none of them ran.
//   - validation-not-stored's valid request after an invalid one under the
//     same key, and credential-isolation's second credential under the
//     first's key, when the refusal is also what the same request gets
//     under a new key (refusedAnyway): the request, or the second
//     credential, does not work whatever the key. When it works under a
//     new key, the key made the difference, and the refusal is the failure
//     under test.
//
// Everything else stays a failure: a 5xx, a transport error, an in-flight
// answer or a replay to a new key, every answer to a retry, a duplicate or
// a reused key, and key-required's request without a key where the profile
// makes the key optional (the same request has just worked with one).
type setupError struct {
	cause error   // what could not be made, and why
	need  string  // what the tool needs to make it
	op    *target // the operation whose request an override can mend; nil: a credential's
}

func (e setupError) Error() string {
	return "no working request could be made: " + e.cause.Error() + ": " + e.need
}

func (e setupError) Unwrap() error { return e.cause }

// overridesFile is how the hints name the file that gives what the spec
// cannot.
const overridesFile = "the overrides file (--overrides; --write-overrides starts one)"

// setup marks err, a failure to build a request of t, as a setup error; a
// skip stays a skip.
func setup(t *target, err error) error {
	var skip skipped
	if err == nil || errors.As(err, &skip) || isSetup(err) {
		return err
	}
	var maker makerRefused
	if errors.As(err, &maker) {
		return setupError{cause: err, need: maker.need, op: cmp.Or(maker.op, t)}
	}
	return setupError{op: t, cause: err, need: "give the value in " + overridesFile + ", or a {{create:…}} template that names an operation answering 2xx with that field"}
}

// makerRefused is an operation that makes a resource a request needs
// refusing the request made of it, and what the tool needs to make it.
type makerRefused struct {
	err  error
	need string
	op   *target // the maker, where an override can mend its request
}

func (e makerRefused) Error() string { return e.err.Error() }

func (e makerRefused) Unwrap() error { return e.err }

// isSetup reports whether err is a setup error.
func isSetup(err error) bool {
	var e setupError
	return errors.As(err, &e)
}

// asFailure is err with its setup mark removed: a refusal that is the
// failure under test.
func asFailure(err error) error {
	var e setupError
	if errors.As(err, &e) {
		return e.cause
	}
	return err
}

// refusal is the setup error of a, an answer that refused q because of q
// itself or of the credential it was sent with (--auth).
func refusal(q request, a answer) setupError {
	if a.status == http.StatusUnauthorized || a.status == http.StatusForbidden {
		return setupError{
			cause: fmt.Errorf("the credential (--auth) was refused (%s)", a),
			need:  "give --auth the credential of a test account that may make this request, where the API reads it (see docs/conformance.md, Credentials)",
		}
	}
	e := setupError{op: q.target, cause: fmt.Errorf("%s %s was refused (%s)", q.method, q.path, a)}
	switch a.status {
	case http.StatusNotFound:
		e.need = "its path parameters must name resources that exist: give them in " + overridesFile + ", as ids or {{create:…}} templates"
	case http.StatusMethodNotAllowed:
		e.need = "the API takes no " + q.method + " there: is --url the API's base URL, and --spec its document?"
	case http.StatusUnsupportedMediaType:
		e.need = "the API does not take the body's media type " + q.contentType + ", which the spec lists for the operation: correct the spec"
	default:
		e.need = "its body and parameters must be values the API accepts: give them in " + overridesFile
	}
	return e
}

// allRefused is the setup error of answers to identical requests, every one
// of which refused the request itself (so none ran), or nil.
func (s *session) allRefused(q request, as []answer) error {
	if len(as) == 0 {
		return nil
	}
	for _, a := range as {
		if !isSetup(s.usable(q, a)) {
			return nil
		}
	}
	return s.usable(q, as[0])
}

// refusedAnyway tells a refusal under a reused key from a request that does
// not work: it sends q under a new key, and returns the setup error of its
// refusal there (after what), or nil when it works there and the key made
// the difference.
func (s *session) refusedAnyway(ctx context.Context, q request, what string) error {
	a, err := s.send(ctx, q, s.newKey(), s.auth)
	if err != nil {
		return nil // the failure it was asked about stands
	}
	if err := s.usable(q, a); isSetup(err) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
