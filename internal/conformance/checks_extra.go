package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The checks of this file need something a black box cannot be made to do
// by the spec alone: fail on demand or answer large (an override), or be
// waited on (--retention-wait). Without it, each is skipped and says how to
// enable it.

// LargeAnswerBytes is the least body large-answer takes for a large
// answer: above the pieces an engine may store an answer in (Oncekey's are
// 256 KiB) and the buffers of most proxies, and below MaxAnswerBytes, past
// which the tool reads no answer.
const LargeAnswerBytes = 1 << 20

// ttlHeader is the header in which Oncekey's engine (idempotency.Serve)
// advertises how long it keeps a key, in whole seconds. The IETF draft
// names none, and no other API the tool knows of advertises one.
const ttlHeader = "Idempotency-TTL"

func checkErrorNotStored(ctx context.Context, s *session, t *target) error {
	fail := t.override.Fail
	if s.cfg.Profile.StoresServerErrors {
		return skipped("profile " + s.cfg.Profile.Name + " stores a 5xx and replays it like any answer")
	}
	if fail == nil {
		return skipped("the API cannot be made to fail from outside without help: give the operation a fail override (fail: {header: {X-Fail: \"1\"}}) that makes its first request answer 5xx")
	}
	q, err := s.build(ctx, t)
	if err != nil {
		return err
	}
	failing, err := fail.apply(q)
	if err != nil {
		return err
	}
	key := s.newKey()
	failed, err := s.send(ctx, failing, key, s.auth)
	if err != nil {
		return err
	}
	if failed.status < 500 || failed.status > 599 {
		if err := s.usable(failing, failed); isSetup(err) {
			return err // the request itself was refused: say why
		}
		return setupError{
			op:    t,
			cause: fmt.Errorf("the request with the fail override answered %s, not 5xx", failed),
			need:  "give the operation a fail override in " + overridesFile + " that makes the API answer 5xx",
		}
	}
	again, err := s.send(ctx, q, key, s.auth)
	if err != nil {
		return err
	}
	switch {
	case s.replayed(again):
		return fmt.Errorf("the failure was stored: the retry under its key was answered with a replay: %s", again)
	case again.status == failed.status && string(again.body) == string(failed.body):
		// The same failure again is a stored one only if the request
		// works under a new key: an API that fails it whatever the key
		// says nothing of what it stores.
		fresh, err := s.send(ctx, q, s.newKey(), s.auth)
		if err != nil {
			return err
		}
		if fresh.status >= 500 {
			return setupError{op: t, cause: fmt.Errorf("the request without the fail override fails under a new key too (%s)", fresh),
				need: "the operation's request must work without the fail override: give its body and parameters in " + overridesFile}
		}
		return fmt.Errorf("the failure was stored: the retry under its key got it again (%s), and under a new key %d", again, fresh.status)
	}
	err = s.usable(q, again)
	if isSetup(err) {
		// A refusal only the key explains is the failure under test.
		if setupErr := s.refusedAnyway(ctx, q, "the request without the fail override"); setupErr != nil {
			return setupErr
		}
		return fmt.Errorf("the failure consumed the key: the retry under it: %w", asFailure(err))
	}
	if err != nil {
		return fmt.Errorf("the retry under the failed request's key: %w", err)
	}
	return nil
}

func checkRetention(ctx context.Context, s *session, t *target) error {
	bound := s.cfg.RetentionWait
	if bound <= 0 {
		return skipped("waiting for a key's retention takes time: give --retention-wait (how long a key must at least be kept) to run it")
	}
	start := time.Now()
	q, key, first, err := s.first(ctx, t)
	if err != nil {
		return err
	}
	wait, said := bound, ""
	if kept, ok := advertised(first); ok {
		said = fmt.Sprintf(" (the answer advertised %s %s)", ttlHeader, first.header.Get(ttlHeader))
		// The header counts whole seconds from a moment the tool cannot
		// see: retry a second before it, counted from before the first
		// request was sent.
		wait = min(bound, max(kept-time.Second, 0))
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(start.Add(wait))):
	}
	again, err := s.send(ctx, q, key, s.auth)
	if err != nil {
		return err
	}
	if err := s.replayOf(first, again); err != nil {
		return fmt.Errorf("a retry %s after the first request%s: %w", wait.Round(time.Millisecond), said, err)
	}
	return nil
}

// advertised is how long a says its key is kept, where it says.
func advertised(a answer) (time.Duration, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(a.header.Get(ttlHeader)), 10, 64)
	if err != nil || n < 0 || n > int64(100*365*24*time.Hour/time.Second) {
		return 0, false
	}
	return time.Duration(n) * time.Second, true
}

func checkLargeAnswer(ctx context.Context, s *session, t *target) error {
	large := t.override.Large
	if large == nil {
		return skipped(fmt.Sprintf("the spec cannot say how to make the operation answer large: give it a large override (large: {query: {…}} or {header: {…}}) that makes its answer at least %d bytes", LargeAnswerBytes))
	}
	q, err := s.build(ctx, t)
	if err != nil {
		return err
	}
	if q, err = large.apply(q); err != nil {
		return err
	}
	key := s.newKey()
	first, err := s.send(ctx, q, key, s.auth)
	if errors.Is(err, errAnswerTooLarge) {
		return setupError{op: t, cause: err, need: fmt.Sprintf("make the large override's answer at most %d bytes", MaxAnswerBytes)}
	}
	if err != nil {
		return err
	}
	if err := s.usable(q, first); err != nil {
		return err
	}
	if first.status/100 != 2 {
		// The API refuses to run what it could not store: it keeps the
		// promise if it says so with a 4xx its document declares.
		if first.status/100 != 4 || !s.declares(t, first.status) {
			return fmt.Errorf("the request with the large override got %s, neither a 2xx nor a 4xx the operation's document declares", first)
		}
		return nil
	}
	if len(first.body) < LargeAnswerBytes {
		return setupError{
			op:    t,
			cause: fmt.Errorf("the request with the large override answered %d bytes, fewer than %d", len(first.body), LargeAnswerBytes),
			need:  "give the operation a large override in " + overridesFile + " that makes its answer larger",
		}
	}
	again, err := s.send(ctx, q, key, s.auth)
	if err != nil {
		return fmt.Errorf("the retry of a large answer: %w", err)
	}
	replayErr := s.replayOf(first, again)
	switch {
	case replayErr == nil:
		return nil
	case again.status >= 400 && again.status <= 499 && !s.replayed(again) && s.declares(t, again.status):
		// Not stored, and the retry told so (Oncekey's gateway: 409
		// not-stored): never run again, never a part of the answer.
		return nil
	case again.status == first.status && len(again.body) != len(first.body):
		return fmt.Errorf("the replay of a %d-byte answer has %d bytes", len(first.body), len(again.body))
	}
	return fmt.Errorf("the retry of a %d-byte answer: %w", len(first.body), replayErr)
}

// apply is q with the trigger's header and query parameters added.
func (g *Trigger) apply(q request) (request, error) {
	q.header = q.header.Clone()
	if q.header == nil {
		q.header = http.Header{}
	}
	for name, value := range g.Header {
		q.header.Set(name, value)
	}
	if len(g.Query) == 0 {
		return q, nil
	}
	query, err := url.ParseQuery(q.query)
	if err != nil {
		return q, err
	}
	for name, v := range g.Query {
		query.Set(name, text(v))
	}
	q.query = query.Encode()
	return q, nil
}

// declares reports whether t's document declares status among its
// answers: by itself, by its class ("4XX") or as the default.
func (s *session) declares(t *target, status int) bool {
	item := s.cfg.Spec.Paths.Value(t.path)
	if item == nil {
		return false
	}
	op := item.GetOperation(t.method)
	if op == nil || op.Responses == nil {
		return false
	}
	codes := maps.Keys(op.Responses.Map())
	for code := range codes {
		if code == strconv.Itoa(status) || strings.EqualFold(code, fmt.Sprintf("%dXX", status/100)) || code == "default" {
			return true
		}
	}
	return false
}
