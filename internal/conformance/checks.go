package conformance

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
)

// Check is one promise of the protocol, with a stable id, why it matters and
// where it comes from.
type Check struct {
	ID        string `json:"id"`
	Rationale string `json:"rationale"`
	Source    string `json:"source"`

	perOperation func(ctx context.Context, s *session, t *target) error
	perRun       func(ctx context.Context, s *session) error // reads every answer of the run; runs last
}

// draft is the IETF document the checks cite.
const draft = "draft-ietf-httpapi-idempotency-key-header-06"

// Checks lists every check in the order they run.
func Checks() []Check { return slices.Clone(catalogue) }

var catalogue = []Check{
	{
		ID:           "key-required",
		Rationale:    "A request without a key cannot be made safe to retry: refuse it with 4xx, or with the one status the profile names (or, where the profile makes the key optional, run it as usual).",
		Source:       draft + " §2.7",
		perOperation: checkKeyRequired,
	},
	{
		ID:           "key-malformed",
		Rationale:    "An empty or over-long key is refused with 4xx before anything runs, so that it is never stored or compared.",
		Source:       draft + " §2.1, §2.7",
		perOperation: checkKeyMalformed,
	},
	{
		ID:           "replay",
		Rationale:    "A retry with the same key and request gets the first answer again (same status and body bytes, marked as a replay where the profile names a header) and does not run the operation again.",
		Source:       draft + " §2.6",
		perOperation: checkReplay,
	},
	{
		ID:           "mismatch-request",
		Rationale:    "The same key with a different request (another body, or another resource in the path) is refused with the profile's mismatch status: a client bug must not get another request's answer.",
		Source:       draft + " §2.4, §2.7",
		perOperation: checkMismatchRequest,
	},
	{
		ID:           "mismatch-operation",
		Rationale:    "The same key on another operation is refused with the profile's mismatch status: the fingerprint includes the method and the route.",
		Source:       draft + " §2.4, §2.7",
		perOperation: checkMismatchOperation,
	},
	{
		ID:           "canonical-json",
		Rationale:    "Reordered JSON keys and other whitespace are the same request: a retry from another client library replays instead of being refused.",
		Source:       draft + " §2.4",
		perOperation: checkCanonicalJSON,
	},
	{
		ID:           "canonical-form",
		Rationale:    "Form fields percent-encoded otherwise (\"%20\" for \"+\", \"%61\" for \"a\"), in their order, are the same request: a retry from another client library replays instead of being refused. (Their order is not asked: parsers that read \"[]\" by position, Rack's and PHP's, read reordered fields as another request.)",
		Source:       draft + " §2.4; WHATWG URL §5 (application/x-www-form-urlencoded)",
		perOperation: checkCanonicalForm,
	},
	{
		ID:           "concurrent-once",
		Rationale:    "Identical requests sent at the same moment run the operation once: their answers name one resource (its id, wherever the answer keeps it, or its Location), and it exists; where the answers name none of their own, every answer is the one answer (or the in-flight answer). How a replay differs from the first answer otherwise is the replay check's finding.",
		Source:       draft + " §2.6",
		perOperation: checkConcurrentOnce,
	},
	{
		ID:           "in-flight",
		Rationale:    "A duplicate that arrives while the first request runs gets the profile's in-flight answer (or, where the profile lets it wait, the first answer), never a second execution.",
		Source:       draft + " §2.7",
		perOperation: checkInFlight,
	},
	{
		ID:           "credential-isolation",
		Rationale:    "Keys belong to the caller: another account's request under the same key runs on its own and never receives the first account's answer, however the two send their credentials (with bare --auth and --auth2 values, under each security scheme the operation takes alone).",
		Source:       draft + " §2.2, §5",
		perOperation: checkCredentialIsolation,
	},
	{
		ID:           "validation-not-stored",
		Rationale:    "A request refused as invalid ran nothing, so it consumes no key: the corrected request under the same key runs.",
		Source:       draft + " §2.6",
		perOperation: checkValidationNotStored,
	},
	{
		ID:           "no-set-cookie",
		Rationale:    "Stored answers never include Set-Cookie: a replay must not hand one client's session to another.",
		Source:       draft + " §5; RFC 6265 §8",
		perOperation: checkNoSetCookie,
	},
	{
		ID:           "error-not-stored",
		Rationale:    "A request that failed (5xx) may not have run, so its failure is not stored: the retry under the same key runs and gets an answer of its own, not the failure again. Needs a fail override.",
		Source:       draft + " §2.6, which leaves failures to the server; Oncekey's engine stores no 5xx, Stripe's API v1 replays them (profile stripe skips it)",
		perOperation: checkErrorNotStored,
	},
	{
		ID:           "retention",
		Rationale:    "A key is kept at least as long as a client may retry: a retry after --retention-wait (or just before the retention the answer advertises in Idempotency-TTL, if sooner) still replays. Needs --retention-wait.",
		Source:       draft + " §2.3",
		perOperation: checkRetention,
	},
	{
		ID:           "large-answer",
		Rationale:    "A large answer (1 MiB or more) replays whole, byte for byte, or the request (or its retry) is refused with a 4xx the document declares: never a truncated or empty replay, never a second run. Needs a large override.",
		Source:       draft + " §2.6",
		perOperation: checkLargeAnswer,
	},
	{
		ID:        "response-valid",
		Rationale: "Every answer of the run, replays and refusals included, is one the OpenAPI document declares (status, headers, body).",
		Source:    "OpenAPI Specification 3.0/3.1, Responses Object",
		perRun:    checkResponsesValid,
	},
	{
		ID:        "retry-after",
		Rationale: "The in-flight answer and 503 say when to come back with Retry-After, so that clients do not hammer a key that is still running.",
		Source:    draft + " §2.7; RFC 9110 §10.2.3",
		perRun:    checkRetryAfter,
	},
}

func checkKeyRequired(ctx context.Context, s *session, t *target) error {
	q, err := s.working(ctx, t)
	if err != nil {
		return err
	}
	a, err := s.send(ctx, q, "", s.auth)
	if err != nil {
		return err
	}
	if !s.cfg.Profile.KeyRequired {
		// The same request has just worked with a key: a refusal without
		// one is the failure under test, not a request that cannot work.
		if err := s.usable(q, a); err != nil {
			return fmt.Errorf("without a key (optional in profile %s): %w", s.cfg.Profile.Name, asFailure(err))
		}
		return nil
	}
	switch want := s.cfg.Profile.MissingKeyStatus; {
	case want != 0 && a.status != want:
		return fmt.Errorf("without a key: got %s, want %d", a, want)
	case a.status < 400 || a.status > 499:
		return fmt.Errorf("without a key: got %s, want 4xx", a)
	}
	return nil
}

func checkKeyMalformed(ctx context.Context, s *session, t *target) error {
	q, err := s.working(ctx, t)
	if err != nil {
		return err
	}
	var errs []error
	long, fresh := s.cfg.Profile.MaxKeyLength+1, s.newKey()
	for _, bad := range []struct{ name, key string }{
		{"an empty key", ""},
		// A key of its own: one of a constant length that an API took
		// once would be a replay or a mismatch next time, and pass.
		{fmt.Sprintf("a key of %d bytes", long), fresh + strings.Repeat("k", max(long-len(fresh), 0))},
	} {
		name := bad.name
		a, err := s.sendKeyed(ctx, q, bad.key, true, s.auth)
		if err != nil {
			return err
		}
		if a.status < 400 || a.status > 499 {
			errs = append(errs, fmt.Errorf("%s: got %s, want 4xx", name, a))
		}
	}
	return errors.Join(errs...)
}

func checkReplay(ctx context.Context, s *session, t *target) error {
	first, again, err := s.twice(ctx, t)
	if err != nil {
		return err
	}
	return s.replayOf(first, again)
}

func checkMismatchRequest(ctx context.Context, s *session, t *target) error {
	q, key, _, err := s.first(ctx, t)
	if err != nil {
		return err
	}
	var other request
	switch {
	case q.body != nil:
		// Made anew, a request whose body or path names resources of its
		// own is another request, and one an API that acts once per
		// resource (pays an order once) still takes; otherwise the first
		// body with one field varied.
		if fresh, err := s.build(ctx, t); err == nil && (!bytes.Equal(fresh.body, q.body) || fresh.path != q.path) && (fresh.path == q.path || !s.cfg.Profile.KeyPerPath) {
			other = fresh
			break
		}
		v, ok := varied(t.schema, q.value, 0)
		if !ok {
			return skipped("no field of the body can take another valid value; give a body in the overrides file")
		}
		if other, err = q.withBody(v); err != nil {
			return err
		}
	case len(t.params) > 0 && s.cfg.Profile.KeyPerPath:
		return skipped("the operation has no body, and profile " + s.cfg.Profile.Name + " holds a key on one path only: another resource in the path is another key")
	case len(t.params) > 0:
		if other, err = s.build(ctx, t); err != nil {
			return err
		}
		if other.path == q.path {
			return skipped("the operation has no body and its path parameters name one resource; use a create template for them")
		}
	default:
		return skipped("the operation has neither a body nor path parameters: no other request to send")
	}
	if err := s.works(ctx, other); err != nil {
		return fmt.Errorf("the other request (another body or resource): %w", err)
	}
	a, err := s.send(ctx, other, key, s.auth)
	if err != nil {
		return err
	}
	return s.mismatch(a, "the same key with another request")
}

func checkMismatchOperation(ctx context.Context, s *session, t *target) error {
	if len(s.covered) < 2 {
		return skipped("the spec has only one operation under the protocol")
	}
	i := slices.Index(s.covered, t)
	u := s.covered[(i+1)%len(s.covered)]
	if s.cfg.Profile.KeyPerPath {
		// Another operation on the same path, another method: the one
		// place the same key is the same key.
		j := slices.IndexFunc(s.covered, func(o *target) bool { return o != t && o.path == t.path })
		if j < 0 {
			return skipped("profile " + s.cfg.Profile.Name + " holds a key on one path only, and no other operation under the protocol shares " + t.path)
		}
		u = s.covered[j]
	}
	_, key, _, err := s.first(ctx, t)
	if err != nil {
		return err
	}
	q, err := s.working(ctx, u)
	if isSetup(err) {
		return err // it names u's request
	} else if err != nil {
		return fmt.Errorf("%s: %w", u.name, err)
	}
	a, err := s.send(ctx, q, key, s.auth)
	if err != nil {
		return err
	}
	return s.mismatch(a, "the same key on "+u.name)
}

// canonicalApplies says why a check that a body of one kind may be written
// otherwise does not apply: the profile does not promise it, or t takes no
// such body.
func canonicalApplies(s *session, t *target, promised, takes bool, kind string) error {
	switch {
	case !promised:
		return skipped("profile " + s.cfg.Profile.Name + " leaves the fingerprint's form to the server")
	case t.media == "":
		return skipped("the operation takes no body")
	case !takes:
		return skipped("the operation's body is " + t.media + ", not " + kind)
	}
	return nil
}

func checkCanonicalJSON(ctx context.Context, s *session, t *target) error {
	if err := canonicalApplies(s, t, s.cfg.Profile.CanonicalJSON, jsonish(t.media), "JSON"); err != nil {
		return err
	}
	q, key, first, err := s.first(ctx, t)
	if err != nil {
		return err
	}
	reordered := q
	reordered.body = relaid(q.value)
	return s.replays(ctx, reordered, key, first, "the body with its keys reordered and spaced out")
}

func checkCanonicalForm(ctx context.Context, s *session, t *target) error {
	if err := canonicalApplies(s, t, s.cfg.Profile.CanonicalForm, t.form, "a form"); err != nil {
		return err
	}
	q, err := s.build(ctx, t)
	if err != nil {
		return err
	}
	if q.contentType != formMedia {
		// The operation takes JSON too, which other requests are sent as.
		q.contentType = formMedia
		if q, err = q.withBody(q.value); err != nil {
			return err
		}
	}
	other := q
	if other.body = respelled(q.value); bytes.Equal(other.body, q.body) {
		return skipped("the form has no field to spell otherwise")
	}
	key, first, err := s.sendFirst(ctx, q)
	if err != nil {
		return err
	}
	return s.replays(ctx, other, key, first, fmt.Sprintf("the form with its fields percent-encoded otherwise (%.200s)", other.body))
}

func checkConcurrentOnce(ctx context.Context, s *session, t *target) error {
	q, err := s.build(ctx, t)
	if err != nil {
		return err
	}
	key := s.newKey()
	st, err := s.storm(ctx, q, key)
	if err != nil {
		return err
	}
	if err := s.allRefused(q, st.ran); err != nil {
		return err
	}
	final, err := s.settled(ctx, q, key)
	if err != nil {
		return err
	}
	all := append(slices.Clone(st.all), final)
	var ran answer
	if ids, ok := s.countable(q, all); ok {
		// What ran is counted by what it made: answers that differ in
		// their headers alone (a replay without the first's Location) are
		// the replay check's finding, not a second execution.
		if len(ids) > 1 {
			return fmt.Errorf("%d identical requests sent at once made %d resources (%s): more than one ran", len(st.all), len(ids), shortList(ids))
		}
		// The answer of the one that ran: one not marked as a replay where
		// there is one (all marked is the usable check's finding).
		ran = final
		for _, a := range slices.Backward(all) {
			if a.status/100 == 2 && !s.inFlight(a) && (!s.replayed(a) || s.replayed(ran)) {
				ran = a
			}
		}
	} else {
		if len(st.ran) > 1 && s.cfg.Profile.ReplayHeader != "" {
			return fmt.Errorf("%d of %d identical requests sent at once were answered neither as replays (%s) nor in flight (%d), and their answers name no resource of their own to count what ran by (%s)",
				len(st.ran), len(st.all), s.cfg.Profile.ReplayHeader, s.cfg.Profile.InFlightStatus, summary(st.ran))
		}
		ran = final // without a replay marker, any answer may be the one that ran
		if len(st.ran) == 1 {
			ran = st.ran[0]
		}
		for _, a := range all {
			if s.inFlight(a) {
				continue
			}
			if err := s.sameOutcome(ran, a); err != nil {
				return fmt.Errorf("%d identical requests sent at once got different answers, which name no resource of their own to count what ran by: %w", len(st.all), err)
			}
		}
	}
	// Not every answer refused the request (allRefused): a refusal now is
	// the protocol's.
	if err := s.usable(q, ran); err != nil {
		return asFailure(err)
	}
	// The one answer names one resource: it exists (a deleted one need not).
	id := bodyID(ran)
	loc := ran.header.Get("Location")
	if (t.get == "" && loc == "") || (id == "" && loc == "") || ran.status/100 != 2 || t.method == http.MethodDelete {
		return nil
	}
	path := s.location(q, loc)
	if loc == "" {
		path = resourcePath(t.get, id, q)
	}
	got, err := s.get(ctx, path)
	if err != nil {
		return err
	}
	if got.status != http.StatusOK || (id != "" && bodyID(got) != "" && bodyID(got) != id) {
		return fmt.Errorf("GET %s of the one resource: got %s, want 200 with id %s", path, got, id)
	}
	return nil
}

func checkInFlight(ctx context.Context, s *session, t *target) error {
	q, err := s.build(ctx, t)
	if err != nil {
		return err
	}
	key := s.newKey()
	if slow := t.override.Slow; slow != nil {
		return s.slowDuplicate(ctx, q, key, slow)
	}
	st, err := s.storm(ctx, q, key)
	if err != nil {
		return err
	}
	if err := s.allRefused(q, st.ran); err != nil {
		return err
	}
	final, err := s.settled(ctx, q, key)
	if err != nil {
		return err
	}
	ids, counted := s.countable(q, append(slices.Clone(st.all), final))
	switch {
	case counted && len(ids) > 1:
		return fmt.Errorf("%d identical requests sent at once made %d resources (%s): more than one ran", len(st.all), len(ids), shortList(ids))
	case len(st.ran) == 1:
		final = st.ran[0]
	case !counted && len(st.ran) > 1 && s.cfg.Profile.ReplayHeader != "":
		return fmt.Errorf("%d of %d identical requests sent at once were answered neither in flight nor as replays, and their answers name no resource of their own to count what ran by (%s)",
			len(st.ran), len(st.all), summary(st.ran))
	}
	seen := 0
	for _, a := range st.all {
		if s.inFlight(a) {
			seen++
			continue
		}
		if counted && a.status/100 == 2 && idOf(a) == ids[0] {
			continue // the one resource's answer: how it differs is the replay check's
		}
		if s.sameOutcome(final, a) != nil {
			return fmt.Errorf("a duplicate sent while the first request ran got %s: want %d (the in-flight answer) or the first answer %s",
				a, s.cfg.Profile.InFlightStatus, final)
		}
	}
	switch {
	case seen > 0:
	case s.cfg.Profile.WaitsForFirst:
		// Oncekey's own case: a duplicate that waits for the first request
		// gets its answer, and so does one sent after it ended.
		return skipped(fmt.Sprintf("each of %d identical requests sent at once got the first answer, which profile %s allows a duplicate that waits for the first request: from outside, such a wait cannot be told from a retry after the first request ended (a slow request can tell them apart)",
			len(st.all), s.cfg.Profile.Name))
	default:
		return skipped(fmt.Sprintf("none of %d identical requests sent at once arrived while another ran; give the operation a slow override to test this", len(st.all)))
	}
	return nil
}

// slowDuplicate sends q slowed down, then a duplicate while it runs.
func (s *session) slowDuplicate(ctx context.Context, q request, key string, slow *Slow) error {
	slowed := q
	slowed.header = q.header.Clone()
	for name, value := range slow.Header {
		slowed.header.Set(name, value)
	}
	after := cmp.Or(slow.After, 100*time.Millisecond)
	type result struct {
		a    answer
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		a, err := s.send(ctx, slowed, key, s.auth)
		done <- result{a, err, time.Since(start)}
	}()
	time.Sleep(after)
	dup, err := s.send(ctx, q, key, s.auth)
	s.note(dup)
	first := <-done
	if err := errors.Join(err, first.err); err != nil {
		return err
	}
	// A refused first request ran nothing to slow down: first, say so.
	if err := s.usable(slowed, first.a); err != nil {
		return err
	}
	if first.took < after {
		return fmt.Errorf("the slowed first request took %s, less than the %s after which its duplicate was sent: the slow override does not slow it", first.took.Round(time.Millisecond), after)
	}
	switch {
	case s.inFlight(dup):
		return nil
	case s.cfg.Profile.WaitsForFirst && s.replayOf(first.a, dup) == nil:
		return nil
	}
	return fmt.Errorf("a duplicate sent %s into the first request got %s, want %d (the in-flight answer)", after, dup, s.cfg.Profile.InFlightStatus)
}

func checkCredentialIsolation(ctx context.Context, s *session, t *target) error {
	if s.cfg.Auth2 == "" {
		return skipped("no second credential (--auth2)")
	}
	forms, err := s.credentialForms(t)
	if err != nil {
		return err
	}
	var skip error
	passed := false
	for _, f := range forms {
		err := s.isolated(ctx, t, f)
		var sk skipped
		switch {
		case errors.As(err, &sk):
			skip = err
		case err != nil && len(forms) > 1:
			return fmt.Errorf("both credentials %s: %w", f.name, err)
		case err != nil:
			return err
		default:
			passed = true
		}
	}
	if passed {
		return nil
	}
	return skip
}

// credentialForm is the two credentials, each where one way of sending
// it puts it.
type credentialForm struct {
	name          string // how a reason names the form; "" for the only one
	first, second credential
}

// credentialForms are the ways t's callers may send their credentials, as
// the document declares them: with --auth and --auth2 bare values, each
// security scheme t accepts alone that the tool can place them in (an API
// key in a header and in the query, Bearer, Basic), as keys scoped by
// what one form carries leak between the callers of another; else the one
// way they are given.
func (s *session) credentialForms(t *target) ([]credentialForm, error) {
	only := []credentialForm{{first: s.auth, second: s.auth2}}
	_, bare1, _ := parseCredential(s.cfg.Auth)
	_, bare2, _ := parseCredential(s.cfg.Auth2)
	doc := s.cfg.Spec
	if !bare1 || !bare2 || doc.Components == nil {
		return only, nil
	}
	var forms []credentialForm
	for _, r := range securityOf(doc, t) {
		if len(r) != 1 {
			continue
		}
		for name := range r {
			ref := doc.Components.SecuritySchemes[name]
			if ref == nil || ref.Value == nil || !placeable(ref.Value) {
				continue
			}
			n := &namedScheme{name, ref.Value}
			first, err := n.place(s.cfg.Auth)
			if err != nil {
				continue // a value this form cannot carry (a cookie's)
			}
			second, err := n.place(s.cfg.Auth2)
			if err != nil {
				continue
			}
			forms = append(forms, credentialForm{name: fmt.Sprintf("sent by security scheme %s", describeRequirements(openapi3.SecurityRequirements{r}, func(string) *openapi3.SecurityScheme { return ref.Value })), first: first, second: second})
		}
	}
	if len(forms) < 2 {
		return only, nil
	}
	return forms, nil
}

// isolated checks that, with the credentials of f, the second caller's
// request under the first's key runs on its own.
func (s *session) isolated(ctx context.Context, t *target, f credentialForm) error {
	q, err := s.build(ctx, t)
	if err != nil {
		return err
	}
	key := s.newKey()
	first, err := s.send(ctx, q, key, f.first)
	if err != nil {
		return err
	}
	if err := s.usable(q, first); isSetup(err) {
		return err
	} else if err != nil {
		return fmt.Errorf("the first request under a new key: %w", err)
	}
	other, err := s.send(ctx, q, key, f.second)
	if err != nil {
		return err
	}
	id := idOf(first)
	switch {
	case other.status == http.StatusUnauthorized || other.status == http.StatusForbidden:
		return s.secondRefused(ctx, q, other, f.second)
	case s.replayed(other):
		return fmt.Errorf("the second credential's request under the first's key was answered with a replay: %s", other)
	case id != "" && idOf(other) == id && !strings.Contains(q.path, id): // a resource the first request made
		return fmt.Errorf("the second credential's request under the first's key got the first's resource %s: %s", id, other)
	case s.cfg.Profile.ReplayHeader == "" && id == "":
		return skipped("the profile marks no replay and the answer names no resource: a replay cannot be told from a new answer")
	}
	return nil
}

// secondRefused tells why the second credential's request under the
// first's key was refused (other): the same request under a new key
// refused too is a second credential that does not work (a setup error);
// one that works there was refused for the key, which belongs to the
// first credential alone.
func (s *session) secondRefused(ctx context.Context, q request, other answer, second credential) error {
	fresh, err := s.send(ctx, q, s.newKey(), second)
	if err != nil {
		return err
	}
	if fresh.status == http.StatusUnauthorized || fresh.status == http.StatusForbidden {
		return setupError{
			cause: fmt.Errorf("the second credential (--auth2) was refused under a new key too (%s)", fresh),
			need:  "give --auth2 the Authorization header of another test account that may make this request, or skip credential-isolation for the operation in " + overridesFile,
		}
	}
	return fmt.Errorf("the second credential's request under the first's key was refused (%s), and under a new key answered %s: the key is not the caller's alone", other, fresh)
}

func checkValidationNotStored(ctx context.Context, s *session, t *target) error {
	q, err := s.build(ctx, t)
	if err != nil {
		return err
	}
	bad, ok := q, false
	if q.body != nil {
		var v any
		if v, ok = invalid(t.schema, q.value); ok {
			if bad, err = q.withBody(v); err != nil {
				return err
			}
		}
	} else if p, value := invalidParam(t); p != "" {
		bad.path, ok = strings.Replace(t.path, "{"+p+"}", value, 1), true
		for _, other := range t.params {
			if other.Name != p {
				bad.path = strings.Replace(bad.path, "{"+other.Name+"}", pathValue(q, t, other.Name), 1)
			}
		}
	}
	if !ok {
		return skipped("no invalid request can be made from the spec: the operation's body and path parameters accept anything")
	}
	key := s.newKey()
	refused, err := s.send(ctx, bad, key, s.auth)
	if err != nil {
		return err
	}
	if refused.status < 400 || refused.status > 499 {
		return fmt.Errorf("an invalid request (%s %s %s) got %s, want 4xx", bad.method, bad.path, bad.body, refused)
	}
	fixed, err := s.send(ctx, q, key, s.auth)
	if err != nil {
		return err
	}
	// A refusal of the valid request is the failure under test only if the
	// same request works under a new key.
	const valid = "the valid request"
	switch {
	case s.replayed(fixed):
		return fmt.Errorf("the refused request's answer was stored: the valid request under its key got it again: %s", fixed)
	case fixed.status == refused.status && bytes.Equal(fixed.body, refused.body):
		if err := s.refusedAnyway(ctx, q, valid); err != nil {
			return err
		}
		return fmt.Errorf("the refused request's answer was stored: the valid request under its key got it again: %s", fixed)
	case fixed.status == s.cfg.Profile.MismatchStatus && fixed.status/100 != 2,
		fixed.status/100 == 4 && !slices.Contains([]int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnsupportedMediaType}, fixed.status):
		// Any other refusal of the valid request, where the same request
		// works under a new key, is the key's: whatever its status (an
		// API that says 422 "key already used" where the profile says
		// 409 consumed the key all the same).
		again, err := s.send(ctx, q, s.newKey(), s.auth)
		if err != nil {
			return err
		}
		if again.status/100 != 2 {
			if err := s.usable(q, again); isSetup(err) {
				return fmt.Errorf("%s: %w", valid, err)
			}
			return setupError{op: t, cause: fmt.Errorf("%s %s was refused under a new key too (%s)", q.method, q.path, again),
				need: "its body and parameters must be values the API accepts: give them in " + overridesFile}
		}
		return fmt.Errorf("the refused request consumed the key: the valid request under it got %s, and works under a new key", fixed)
	}
	err = s.usable(q, fixed)
	if isSetup(err) {
		if setupErr := s.refusedAnyway(ctx, q, valid); setupErr != nil {
			return setupErr
		}
		return fmt.Errorf("the valid request under the refused request's key: %w", asFailure(err))
	}
	return err
}

func checkNoSetCookie(ctx context.Context, s *session, t *target) error {
	first, again, err := s.twice(ctx, t)
	if err != nil {
		return err
	}
	if len(first.header.Values("Set-Cookie")) == 0 {
		return skipped("the first answer set no cookie: there was none to store")
	}
	for _, c := range again.header.Values("Set-Cookie") {
		if slices.Contains(first.header.Values("Set-Cookie"), c) {
			return fmt.Errorf("the replay repeats the first answer's Set-Cookie %q", c)
		}
	}
	return nil
}

func checkResponsesValid(_ context.Context, s *session) error {
	if s.validator.Checked() == 0 {
		if err := s.validator.Unroutable(); err != nil {
			return skipped("the document's paths cannot be routed, so no answer was checked against it: " + err.Error())
		}
		return skipped("no answer of the run was on a path of the document (is --url the API's base URL?)")
	}
	violations := s.validator.Violations()
	if len(violations) > 10 {
		violations = append(violations[:10], fmt.Errorf("and %d more", len(violations)-10))
	}
	return errors.Join(violations...)
}

func checkRetryAfter(_ context.Context, s *session) error {
	if !s.cfg.Profile.RetryAfter {
		return skipped("profile " + s.cfg.Profile.Name + " does not require Retry-After (the draft says MAY)")
	}
	s.mu.Lock()
	noted := slices.Clone(s.noted)
	s.mu.Unlock()
	n := 0
	for _, a := range noted {
		if !s.inFlight(a) && a.status != http.StatusServiceUnavailable {
			continue
		}
		n++
		if !validRetryAfter(a.header.Get("Retry-After")) {
			return fmt.Errorf("%s without a valid Retry-After (%q)", a, a.header.Get("Retry-After"))
		}
	}
	if n == 0 {
		return skipped("no duplicate of the run was answered in flight, and no answer was 503")
	}
	return nil
}

func validRetryAfter(v string) bool {
	if n, err := strconv.Atoi(v); err == nil {
		return n >= 0
	}
	_, err := http.ParseTime(v)
	return err == nil
}

// working builds a request of t and shows that it works: sent under a new
// key, it gets an answer a first request can have. The checks that expect
// a refusal send it again, so that a refusal is theirs and not a broken
// request's. It returns a new request of t (the one sent may have changed
// what it acts on, as a DELETE does).
func (s *session) working(ctx context.Context, t *target) (request, error) {
	if _, _, _, err := s.first(ctx, t); err != nil {
		return request{}, err
	}
	return s.build(ctx, t)
}

// works sends q under a new key: it must get an answer a first request can
// have.
func (s *session) works(ctx context.Context, q request) error {
	a, err := s.send(ctx, q, s.newKey(), s.auth)
	if err != nil {
		return err
	}
	return s.usable(q, a)
}

// first builds a request of t and sends it under a new key: its answer must
// be one a first request can have.
func (s *session) first(ctx context.Context, t *target) (request, string, answer, error) {
	q, err := s.build(ctx, t)
	if err != nil {
		return q, "", answer{}, err
	}
	key, a, err := s.sendFirst(ctx, q)
	return q, key, a, err
}

// sendFirst sends q under a new key: its answer must be one a first
// request can have.
func (s *session) sendFirst(ctx context.Context, q request) (string, answer, error) {
	key := s.newKey()
	a, err := s.send(ctx, q, key, s.auth)
	if err != nil {
		return key, a, err
	}
	if err := s.usable(q, a); isSetup(err) {
		return key, a, err // it says what could not be made
	} else if err != nil {
		return key, a, fmt.Errorf("the first request under a new key: %w", err)
	}
	return key, a, nil
}

// replays sends other, the same request as the one first answered but
// written otherwise (what), under its key: it must get first again.
func (s *session) replays(ctx context.Context, other request, key string, first answer, what string) error {
	again, err := s.send(ctx, other, key, s.auth)
	if err != nil {
		return err
	}
	if err := s.replayOf(first, again); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// twice sends a first request of t, then the same again under its key.
func (s *session) twice(ctx context.Context, t *target) (first, again answer, err error) {
	q, key, first, err := s.first(ctx, t)
	if err != nil {
		return first, again, err
	}
	again, err = s.send(ctx, q, key, s.auth)
	return first, again, err
}

// usable says whether a can answer q, a request that ran: not a failure,
// not an in-flight answer or a replay (failures), not a refusal of the
// request itself or of its credential (a setup error: see setupError).
func (s *session) usable(q request, a answer) error {
	switch {
	case a.status >= 500:
		return fmt.Errorf("the request failed: %s", a)
	case s.inFlight(a):
		return fmt.Errorf("a request under a new key was answered as in flight: %s", a)
	case s.replayed(a):
		return fmt.Errorf("a request under a new key was answered with a replay: %s", a)
	case a.status == http.StatusUnauthorized || a.status == http.StatusForbidden,
		slices.Contains([]int{400, 404, 405, 415}, a.status) || (a.status == s.cfg.Profile.MismatchStatus && a.status/100 != 2):
		return refusal(q, a)
	}
	return nil
}

// replayed reports whether a is marked as a replay.
func (s *session) replayed(a answer) bool {
	h := s.cfg.Profile.ReplayHeader
	return h != "" && a.header.Get(h) == "true"
}

// inFlight reports whether a is the profile's answer to a duplicate of a
// request still running. A 2xx in-flight answer is a problem document, so
// that it is not the operation's own 202.
func (s *session) inFlight(a answer) bool {
	if a.status != s.cfg.Profile.InFlightStatus {
		return false
	}
	return a.status/100 != 2 || strings.HasPrefix(a.header.Get("Content-Type"), "application/problem+json")
}

// replayOf checks that again replays first: the same outcome, marked as a
// replay where the profile marks them.
func (s *session) replayOf(first, again answer) error {
	if err := s.sameOutcome(first, again); err != nil {
		return err
	}
	if h := s.cfg.Profile.ReplayHeader; h != "" && !s.replayed(again) {
		return fmt.Errorf("the replay has no %s: true", h)
	}
	return nil
}

// sameOutcome checks that again is the answer first was: the same status,
// body bytes and Location. An accepted (202) long operation may finish
// between two answers: then one is the accepted resource and the other the
// finished one, with the same id.
func (s *session) sameOutcome(first, again answer) error {
	if again.status == first.status && bytes.Equal(again.body, first.body) {
		if again.header.Get("Location") != first.header.Get("Location") {
			return fmt.Errorf("the same answer with another Location: %q, first %q", again.header.Get("Location"), first.header.Get("Location"))
		}
		return nil
	}
	accepted := (first.status == http.StatusAccepted && !s.inFlight(first)) || (again.status == http.StatusAccepted && !s.inFlight(again))
	if accepted && first.status/100 == 2 && again.status/100 == 2 && idOf(first) != "" && idOf(first) == idOf(again) {
		return nil
	}
	return fmt.Errorf("not the first answer:\nfirst: %s\nagain: %s", first, again)
}

// mismatch checks that a refuses a reused key.
func (s *session) mismatch(a answer, what string) error {
	if a.status != s.cfg.Profile.MismatchStatus || s.replayed(a) {
		return fmt.Errorf("%s: got %s, want %d", what, a, s.cfg.Profile.MismatchStatus)
	}
	return nil
}

// stormed is what identical requests sent at once got.
type stormed struct {
	all []answer
	ran []answer // neither in flight nor marked as replays
}

// storm sends cfg.Concurrency copies of q under key at once, and notes
// their answers for retry-after: all but one answer a duplicate.
func (s *session) storm(ctx context.Context, q request, key string) (stormed, error) {
	n := s.cfg.Concurrency
	answers, errs := make([]answer, n), make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = s.send(ctx, q, key, s.auth)
		})
	}
	close(start)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return stormed{}, err
	}
	s.note(answers...)
	st := stormed{all: answers}
	for _, a := range answers {
		if !s.inFlight(a) && !s.replayed(a) {
			st.ran = append(st.ran, a)
		}
	}
	return st, nil
}

// settled sends q under key until it is no longer in flight (at most 10s,
// honouring Retry-After up to a second at a time).
func (s *session) settled(ctx context.Context, q request, key string) (answer, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := s.send(ctx, q, key, s.auth)
		if err != nil || !s.inFlight(a) {
			return a, err
		}
		s.note(a)
		if time.Now().After(deadline) {
			return a, fmt.Errorf("still in flight after 10s: %s", a)
		}
		wait := 50 * time.Millisecond
		if n, err := strconv.Atoi(a.header.Get("Retry-After")); err == nil && n > 0 {
			wait = time.Duration(min(n, 1)) * time.Second
		}
		select {
		case <-ctx.Done():
			return a, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// idOf is the id of the resource a names: the id in its body (bodyID),
// or else its Location.
func idOf(a answer) string {
	if id := bodyID(a); id != "" {
		return id
	}
	return a.header.Get("Location")
}

// bodyID is the id of the resource a's JSON body names, found as the
// inference finds what a maker made (idField): the field the operation's
// answer schema says names it ("pspReference", "card.id"), its "id", or
// the id of the one object the body wraps ({"payment": {"id": …}}); ""
// for none.
func bodyID(a answer) string {
	doc, err := decodeJSON(a.body)
	if err != nil {
		return ""
	}
	fields := []string{"id"}
	if t := a.target; t != nil {
		if f := t.idField("id", lastWord(t.path)); f != "" && f != "id" {
			fields = append([]string{f}, fields...)
		}
	}
	for _, f := range fields {
		if v, ok := lookup(doc, f); ok && scalar(v) {
			return text(v)
		}
	}
	m, ok := doc.(map[string]any)
	if !ok {
		return ""
	}
	var held []string
	for _, v := range m {
		if o, ok := v.(map[string]any); ok && scalar(o["id"]) {
			held = append(held, text(o["id"]))
		}
	}
	if len(held) == 1 {
		return held[0]
	}
	return ""
}

// scalar reports whether v, a decoded JSON value, is a string or number
// that can name a resource.
func scalar(v any) bool {
	switch x := v.(type) {
	case string:
		return x != ""
	case float64, json.Number:
		return true
	}
	return false
}

// countable is what answers to identical requests q made, where that
// counts what ran: q creates (a POST), every answer that says it worked
// names a resource, and none is one q's path names (an action on an
// existing resource answers with it however often it runs).
func (s *session) countable(q request, as []answer) ([]string, bool) {
	if q.method != http.MethodPost {
		return nil, false
	}
	ids, named := s.made(as)
	if !named || slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(q.path, id) }) {
		return nil, false
	}
	return ids, true
}

// shortList is ids for a reason: the first five, and how many more.
func shortList(ids []string) string {
	if len(ids) <= 5 {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:5], ", "), len(ids)-5)
}

// made is what answers to identical requests made: the distinct resources
// (ids, or Locations where an answer names no id) that their answers which
// say it worked (2xx, not in flight) name, in the order first seen.
// named is false when one of those answers names none: then what ran
// cannot be counted by what it made.
func (s *session) made(as []answer) (ids []string, named bool) {
	named = true
	for _, a := range as {
		if a.status/100 != 2 || s.inFlight(a) {
			continue
		}
		id := idOf(a)
		if id == "" {
			named = false
			continue
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, named && len(ids) > 0
}

// resourcePath is the spec's GET path get of the resource with id that q
// created or changed: q's own path when get has as many parameters, else
// q's path and the id.
func resourcePath(get, id string, q request) string {
	if !strings.Contains(get, "{") || strings.Count(get, "{") == strings.Count(q.target.path, "{") {
		return q.path
	}
	return q.path + "/" + url.PathEscape(id)
}

// invalidParam is a path parameter of t and a value its schema refuses.
func invalidParam(t *target) (string, string) {
	for _, p := range t.params {
		if p.Schema == nil || p.Schema.Value == nil {
			continue
		}
		switch sch := p.Schema.Value; {
		case sch.Format == "uuid":
			return p.Name, "not-a-uuid"
		case typeOf(sch) == "integer" || typeOf(sch) == "number":
			return p.Name, "not-a-number"
		case len(sch.Enum) > 0:
			return p.Name, "not-one-of-its-values"
		case sch.MaxLength != nil && *sch.MaxLength < 1024:
			return p.Name, strings.Repeat("x", int(*sch.MaxLength)+1)
		case sch.Pattern != "":
			if re, err := regexp.Compile(sch.Pattern); err == nil && !re.MatchString("~not~matching~") {
				return p.Name, "~not~matching~"
			}
		}
	}
	return "", ""
}

// pathValue is the value q's path gives the parameter name of t.
func pathValue(q request, t *target, name string) string {
	want, got := strings.Split(t.path, "/"), strings.Split(q.path, "/")
	for i, seg := range want {
		if seg == "{"+name+"}" && i < len(got) {
			return got[i]
		}
	}
	return ""
}

// relaid is v as JSON with its object keys in reverse order and spaces and
// newlines between the tokens: the same value, laid out as another client
// library might.
func relaid(v any) []byte {
	var b bytes.Buffer
	var write func(v any, indent string)
	write = func(v any, indent string) {
		switch x := v.(type) {
		case map[string]any:
			b.WriteString("{\n")
			keys := slices.Sorted(maps.Keys(x))
			slices.Reverse(keys)
			for i, k := range keys {
				name, _ := json.Marshal(k)
				b.WriteString(indent + "  " + string(name) + " : ")
				write(x[k], indent+"  ")
				if i < len(keys)-1 {
					b.WriteString(" ,")
				}
				b.WriteString("\n")
			}
			b.WriteString(indent + "}")
		case []any:
			b.WriteString("[ ")
			for i, item := range x {
				if i > 0 {
					b.WriteString(" , ")
				}
				write(item, indent)
			}
			b.WriteString(" ]")
		default:
			scalar, _ := json.Marshal(x)
			b.Write(scalar)
		}
	}
	write(v, "")
	b.WriteString("\n")
	return b.Bytes()
}

// respelled is v as a form that another client library could send, and
// that every form parser reads as the first: its fields in the same order,
// every byte percent-encoded in lower-case hex (a space as "%20", not
// "+"). It differs from url.Values.Encode's form in every byte but the
// separators.
func respelled(v any) []byte {
	form := url.Values{}
	flatten(form, "", v)
	// In the order withBody sends them (url.Values.Encode's): a form's
	// order is part of its meaning.
	keys := slices.Sorted(maps.Keys(form))
	var b bytes.Buffer
	for _, k := range keys {
		for _, value := range form[k] {
			if b.Len() > 0 {
				b.WriteByte('&')
			}
			b.WriteString(percentEncoded(k) + "=" + percentEncoded(value))
		}
	}
	return b.Bytes()
}

func percentEncoded(s string) string {
	var b strings.Builder
	for i := range len(s) {
		fmt.Fprintf(&b, "%%%02x", s[i])
	}
	return b.String()
}

func summary(as []answer) string {
	var parts []string
	for _, a := range as {
		parts = append(parts, fmt.Sprintf("%d %.120s", a.status, bytes.TrimSpace(a.body)))
	}
	return strings.Join(parts, "; ")
}
