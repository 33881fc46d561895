// Package conformance checks, from the outside, that a running API keeps the
// promises of the Idempotency-Key header: the operations its OpenAPI
// document covers (those that declare the header or x-idempotency, as
// idempotency/oapi reads them) replay, refuse mismatches, run concurrent
// duplicates once, keep credentials apart and store no validation error.
// Profiles say which statuses and headers a given API uses for those
// promises. It is `oncekey conformance`.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/oapi"
)

// Config says what to check and how.
type Config struct {
	// Spec is the API's OpenAPI document (3.0 or 3.1). Run routes it to
	// BaseURL: it replaces the document's servers.
	Spec *openapi3.T
	// BaseURL is where the API is served.
	BaseURL string
	// Auth is the credential of every request; Auth2, of a second
	// account, lets credential-isolation run. Each is "Name: value" (that
	// header), "Scheme value" ("Bearer …": the Authorization header as
	// given), or a bare value, which goes where the document's security
	// says (an API key's header, query parameter or cookie, Basic,
	// Bearer): two bare values go to the same place.
	Auth, Auth2 string
	// KeyHeader and KeyField say where the key goes for a document that
	// does not say (--key-header, --key-field): a header, or a top-level
	// member of the body. With either, the operations that declare that
	// header or member are covered, or, where none does, every POST and
	// PATCH.
	KeyHeader, KeyField string
	// Profile says which answers keep the promises (default: oncekey).
	Profile Profile
	// Only keeps the checks whose id, or operations whose name ("POST
	// /orders") or operationId, it lists; empty: all.
	Only []string
	// Overrides give what the spec cannot: real ids, headers, a slow
	// request, checks that do not apply.
	Overrides Overrides
	// Concurrency is how many identical requests concurrent-once and
	// in-flight send at once (default, and at least, 2: fewer means 10).
	Concurrency int
	// Timeout bounds each request (default 10s).
	Timeout time.Duration
	// RetentionWait is how long retention waits before it retries a key
	// (less where the answer advertises a shorter retention); 0 skips
	// retention, whose wait no condition can replace.
	RetentionWait time.Duration
	// Progress, if set, is told each result as it comes, with how many of
	// how many are done.
	Progress func(done, total int, r Result)
}

// Status is a check's outcome: pass, fail, skip or error.
type Status string

// A check passes, fails or is skipped (with its reason). It is an error
// when it could not run because the tool could not make a request that
// works (a request made from the spec was refused, a create template
// failed): the tool needs a hint, and the API broke no promise. Keeping
// errors apart from failures lets CI tell the two (exit 2 and 1).
const (
	Pass  Status = "pass"
	Fail  Status = "fail"
	Skip  Status = "skip"
	Error Status = "error"
)

// Result is one check on one operation (or on the whole run, for the checks
// that read every answer: Operation is empty).
type Result struct {
	Check     string `json:"check"`               // the check's id
	Operation string `json:"operation,omitempty"` // "POST /orders"
	Status    Status `json:"status"`
	Reason    string `json:"reason,omitempty"` // why it failed, errored or was skipped
	// NeedsOverride names, for an error, the operation whose request could
	// not be made: what --write-overrides writes an entry for.
	NeedsOverride string        `json:"needs_override,omitempty"`
	Duration      time.Duration `json:"duration_ns"`
}

// Run finds the operations of cfg.Spec under the protocol and runs every
// check that cfg selects on them. An error with no results means it could
// not start: a SetupError (the document, the URL or the credentials), or
// ctx's error; with results, that ctx ended the run after them.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	s, err := newSession(cfg)
	if err != nil {
		return nil, SetupError{err}
	}
	type job struct {
		c Check
		t *target
	}
	checks, ops, err := s.only()
	if err != nil {
		return nil, SetupError{err}
	}
	if err := s.probe(ctx); err != nil {
		return nil, err
	}
	var jobs []job
	for _, c := range catalogue {
		if len(checks) > 0 && !checks[c.ID] {
			continue
		}
		if c.perRun != nil {
			jobs = append(jobs, job{c: c})
			continue
		}
		for _, t := range s.covered {
			if len(ops) == 0 || ops[t] {
				jobs = append(jobs, job{c, t})
			}
		}
	}
	results := make([]Result, 0, len(jobs))
	for i, j := range jobs {
		start := time.Now()
		r := Result{Check: j.c.ID}
		var err error
		if j.t == nil {
			err = j.c.perRun(ctx, s)
		} else {
			r.Operation = j.t.name
			if reason, ok := j.t.override.Skip[j.c.ID]; ok {
				err = skipped("the overrides skip it: " + reason)
			} else {
				err = j.c.perOperation(ctx, s, j.t)
			}
		}
		var skip skipped
		var setupErr setupError
		switch {
		case err == nil:
			r.Status = Pass
		case errors.As(err, &skip):
			r.Status, r.Reason = Skip, string(skip)
		case errors.As(err, &setupErr):
			r.Status, r.Reason = Error, err.Error()
			if setupErr.op != nil {
				r.NeedsOverride = setupErr.op.name
			}
		default:
			r.Status, r.Reason = Fail, err.Error()
		}
		if ctx.Err() != nil { // the check was cut short: it says nothing
			return results, ctx.Err()
		}
		r.Duration = time.Since(start)
		results = append(results, r)
		if cfg.Progress != nil {
			cfg.Progress(i+1, len(jobs), r)
		}
	}
	return results, nil
}

// skipped is a check that does not apply, with the reason.
type skipped string

func (s skipped) Error() string { return string(s) }

// session is one run: the operations, the HTTP client and what it saw.
type session struct {
	cfg       Config
	covered   []*target
	byRoute   map[string]*target // every operation, by "METHOD /path"
	itemGets  map[string]string  // path → the GET of path/{param} (the first by name)
	http      *http.Client
	validator *ValidatingTransport
	auth      credential // cfg.Auth, where the API reads it
	auth2     credential // cfg.Auth2, likewise
	runID     string
	keys      atomic.Int64

	mu    sync.Mutex
	noted []answer // answers to duplicates, and 503s: where Retry-After belongs
}

func newSession(cfg Config) (*session, error) {
	if cfg.Spec == nil || cfg.BaseURL == "" {
		return nil, errors.New("conformance: a spec and a URL are required")
	}
	if cfg.Profile.Name == "" {
		cfg.Profile = Profiles["oncekey"]
	}
	if cfg.Concurrency <= 1 {
		cfg.Concurrency = 10
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	if cfg.KeyHeader != "" && cfg.KeyField != "" {
		return nil, errors.New("conformance: the key goes in a header (--key-header) or a body field (--key-field), not both")
	}
	if cfg.KeyField != "" {
		field, err := keyField(cfg.KeyField)
		if err != nil {
			return nil, err
		}
		cfg.KeyField = field
	}
	if strings.ContainsAny(cfg.KeyHeader, " \t:") {
		return nil, fmt.Errorf("conformance: --key-header %q is not a header name", cfg.KeyHeader)
	}
	ops, err := oapi.New(cfg.Spec, nil)
	if err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	v, err := NewValidatingTransport(cfg.Spec, cfg.BaseURL, nil)
	if err != nil {
		return nil, fmt.Errorf("conformance: %w", err)
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	s := &session{
		cfg: cfg, byRoute: map[string]*target{}, validator: v, runID: hex.EncodeToString(id[:]),
		http: &http.Client{
			Transport: v, Timeout: cfg.Timeout,
			// A redirect is an answer of its own, to compare as it is.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	known := map[string]bool{}
	for path, item := range cfg.Spec.Paths.Map() {
		for method, spec := range item.Operations() {
			op := ops.Find(method, path)
			t := newTarget(op, item, spec)
			// t.id is t.name where the operation has no operationId.
			for _, name := range slices.Compact([]string{t.name, t.id}) {
				o, ok := cfg.Overrides.Operations[name]
				if !ok {
					continue
				}
				if known[t.name] {
					return nil, fmt.Errorf("conformance: the overrides name %s twice (as %q and by its operationId %q)", t.name, t.name, t.id)
				}
				for id := range o.Skip {
					if !slices.ContainsFunc(catalogue, func(c Check) bool { return c.ID == id }) {
						return nil, fmt.Errorf("conformance: the overrides of %s skip %q, which is no check", name, id)
					}
				}
				t.override = o
				known[name], known[t.name] = true, true
			}
			s.byRoute[t.name] = t
			if s.cover(t, op, item, spec) {
				s.covered = append(s.covered, t)
			}
			if t.media != "" && !jsonish(t.media) && t.media != formMedia {
				t.unsupported = "its body is " + t.media + ", which the checks cannot build (JSON and form bodies only)"
			}
		}
	}
	for name := range cfg.Overrides.Operations {
		if !known[name] {
			return nil, fmt.Errorf("conformance: the overrides name %q, which the spec has no operation for (name one as \"POST /orders\" or by its operationId)", name)
		}
	}
	// The GETs of one resource under each path, indexed once: getOf looks
	// for one for every operation, and a document may have thousands.
	s.itemGets = map[string]string{}
	for name, g := range s.byRoute {
		i := strings.LastIndexByte(g.path, '/')
		last := g.path[i+1:]
		if !strings.HasPrefix(name, "GET ") || i < 0 || !strings.HasPrefix(last, "{") || !strings.HasSuffix(last, "}") {
			continue
		}
		if other, ok := s.itemGets[g.path[:i]]; !ok || g.path < other {
			s.itemGets[g.path[:i]] = g.path
		}
	}
	in := newInference(s.byRoute)
	for _, path := range cfg.Spec.Paths.InMatchingOrder() {
		item := cfg.Spec.Paths.Value(path)
		for method, spec := range item.Operations() {
			if t := s.byRoute[method+" "+path]; t != nil {
				in.addLinks(t, spec)
			}
		}
	}
	for _, t := range s.byRoute {
		t.get = s.getOf(t)
		in.infer(t)
	}
	if len(s.covered) == 0 && (cfg.KeyHeader != "" || cfg.KeyField != "") {
		s.coverUnsafe()
	}
	if len(s.covered) == 0 {
		return nil, fmt.Errorf("conformance: no operation of the spec declares an %s header parameter (or a header whose name ends so) or %s; for a document that declares none, say where the key goes with --key-header or --key-field", idempotency.HeaderKey, oapi.Extension)
	}
	slices.SortFunc(s.covered, func(a, b *target) int { return strings.Compare(a.name, b.name) })
	if err := s.credentials(); err != nil {
		return nil, err
	}
	return s, nil
}

// newTarget reads what the checks need of one operation.
func newTarget(op *oapi.Operation, item *openapi3.PathItem, spec *openapi3.Operation) *target {
	t := &target{name: op.Method + " " + op.Path, id: op.ID, method: op.Method, path: op.Path}
	// An operation's parameter overrides the path item's of the same name.
	params := map[string]*openapi3.Parameter{}
	var order []string
	for _, list := range []openapi3.Parameters{item.Parameters, spec.Parameters} {
		for _, p := range list {
			if p.Value == nil {
				continue
			}
			k := p.Value.In + " " + p.Value.Name
			if _, ok := params[k]; !ok {
				order = append(order, k)
			}
			params[k] = p.Value
		}
	}
	for _, k := range order {
		switch p := params[k]; p.In {
		case openapi3.ParameterInPath:
			t.params = append(t.params, p)
		case openapi3.ParameterInQuery:
			t.query = append(t.query, p)
		}
	}
	if spec.RequestBody != nil && spec.RequestBody.Value != nil {
		t.media = jsonMedia(spec.RequestBody.Value.Content)
		_, t.form = spec.RequestBody.Value.Content[formMedia]
		if mt := spec.RequestBody.Value.Content.Get(t.media); mt != nil {
			t.schema = mt.Schema
			if ex, ok := exampleOf(mt.Example, mt.Examples, mt.Schema); ok {
				t.example, t.exampled = ex, true
			} else {
				t.example = minimal(mt.Schema, 0)
			}
		}
	}
	t.answer = answerSchema(spec)
	if spec.Responses != nil {
		for code, resp := range spec.Responses.Map() {
			if !strings.HasPrefix(code, "2") || resp.Value == nil {
				continue
			}
			for name := range resp.Value.Headers {
				t.location = t.location || strings.EqualFold(name, "Location")
			}
		}
	}
	return t
}

// getOf is the path of the GET that reads what t answers with: the
// operation's own path for a PUT, PATCH or DELETE, or its path with one
// more parameter for a create (the first by name if there are several).
// Empty: the spec has none.
func (s *session) getOf(t *target) string {
	if g, ok := s.byRoute["GET "+t.path]; ok && t.method != http.MethodPost {
		return g.path
	}
	return s.itemGets[strings.TrimRight(t.path, "/")]
}

// only sorts cfg.Only into the checks and the operations it names.
func (s *session) only() (map[string]bool, map[*target]bool, error) {
	checks, ops := map[string]bool{}, map[*target]bool{}
	for _, name := range s.cfg.Only {
		if slices.ContainsFunc(catalogue, func(c Check) bool { return c.ID == name }) {
			checks[name] = true
			continue
		}
		i := slices.IndexFunc(s.covered, func(t *target) bool { return t.name == name || t.id == name })
		if i < 0 {
			var ids []string
			for _, c := range catalogue {
				ids = append(ids, c.ID)
			}
			return nil, nil, fmt.Errorf("conformance: --only %q is neither a check (%s) nor an operation under the protocol (%s)",
				name, strings.Join(ids, ", "), s.names())
		}
		ops[s.covered[i]] = true
	}
	return checks, ops, nil
}

func (s *session) names() string {
	var names []string
	for _, t := range s.covered {
		names = append(names, t.name)
	}
	return strings.Join(names, ", ")
}

// newKey returns an Idempotency-Key no request of any run has used.
func (s *session) newKey() string {
	return fmt.Sprintf("conformance-%s-%d-%s", s.runID, s.keys.Add(1), newUUID()[:8])
}

// answer is a response with its body read.
type answer struct {
	status int
	header http.Header
	body   []byte
	target *target // the operation it answers, where known: what says where its id is
}

func (a answer) String() string { return fmt.Sprintf("%d %.300s", a.status, bytes.TrimSpace(a.body)) }

// send sends q under key ("": none) with the credential auth (s.auth or
// s.auth2; the zero credential: none), and records the answer.
func (s *session) send(ctx context.Context, q request, key string, auth credential, header ...string) (answer, error) {
	return s.sendKeyed(ctx, q, key, key != "", auth, header...)
}

// sendKeyed is send with a key that is sent when keyed, even if empty, in
// the place q's operation takes it (a header, or a member of the body).
func (s *session) sendKeyed(ctx context.Context, q request, key string, keyed bool, auth credential, header ...string) (answer, error) {
	place := keyPlace{header: idempotency.HeaderKey}
	if q.target != nil {
		place = q.target.key
	}
	field := place.field
	if keyed && field != "" && q.body != nil {
		b, err := bodyWithKey(q, field, key)
		if err != nil {
			return answer{}, err
		}
		q.body = b
	}
	var body io.Reader
	if q.body != nil {
		body = bytes.NewReader(q.body)
	}
	target := q.path
	if !strings.HasPrefix(target, "http://") && !strings.HasPrefix(target, "https://") {
		target = s.cfg.BaseURL + q.path
	} else if err := sameOrigin(s.cfg.BaseURL, target); err != nil {
		// A Location (or an absolute path of the overrides) elsewhere: the
		// credentials under test never leave the API under test, nor its
		// scheme (https downgraded to http).
		return answer{}, skipped(err.Error())
	}
	if q.query != "" {
		target += "?" + q.query
	}
	req, err := http.NewRequestWithContext(ctx, q.method, target, body)
	if err != nil {
		return answer{}, err
	}
	for name, values := range q.header {
		req.Header[name] = values
	}
	if q.body != nil {
		req.Header.Set("Content-Type", q.contentType)
	}
	shown := req.URL.String()
	auth.apply(req)
	if keyed && field == "" {
		req.Header[http.CanonicalHeaderKey(place.header)] = []string{key} // sent as given, even if empty
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header[header[i]] = []string{header[i+1]} // sent as given, even if empty
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", q.method, q.path, hideURL(err, shown))
	}
	defer resp.Body.Close()
	b, err := readAnswer(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", q.method, q.path, err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b, target: q.target}
	if a.status == http.StatusServiceUnavailable {
		s.note(a)
	}
	return a, nil
}

// note keeps an answer for retry-after: one to a duplicate, or a 503.
func (s *session) note(as ...answer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noted = append(s.noted, as...)
}

// MaxAnswerBytes bounds what the tool reads of any answer: an API under
// test may be hostile, and an endless body must not take the tool's memory.
const MaxAnswerBytes = 4 << 20

// errAnswerTooLarge is an answer past MaxAnswerBytes.
var errAnswerTooLarge = errors.New("the answer's body is larger than the tool reads")

// readAnswer reads a whole answer body, or fails past MaxAnswerBytes.
func readAnswer(body io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(body, MaxAnswerBytes+1))
	if err == nil && len(b) > MaxAnswerBytes {
		err = fmt.Errorf("%w (%d bytes)", errAnswerTooLarge, MaxAnswerBytes)
	}
	return b, err
}

// sameOrigin refuses a target URL that is not under base's scheme, host
// and port.
func sameOrigin(base, target string) error {
	b, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("the API's URL %q: %w", base, err)
	}
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("a URL the API named: %w", err)
	}
	if u.Scheme != b.Scheme || u.Host != b.Host {
		return fmt.Errorf("the API named %s://%s, which is not %s://%s: credentials are sent to the API under test alone", u.Scheme, u.Host, b.Scheme, b.Host)
	}
	return nil
}

// get reads path (a path of the spec, or an absolute URL) with the first
// credential.
func (s *session) get(ctx context.Context, path string) (answer, error) {
	return s.send(ctx, request{method: http.MethodGet, path: path}, "", s.auth)
}

// location is the absolute URL of a Location header, resolved as a client
// resolves it: against the URL of the request it answered.
func (s *session) location(q request, loc string) string {
	base, err := url.Parse(s.cfg.BaseURL + q.path)
	if err != nil {
		return loc
	}
	u, err := base.Parse(loc)
	if err != nil {
		return loc
	}
	return u.String()
}
