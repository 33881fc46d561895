// Package contracttest is Oncekey's own contract suite: the promises of its
// orders, payments and refunds (a change replays over a later one, refunds
// never exceed their payment, cancel and pay never both win), checked over
// HTTP against a running service with every response validated against
// openapi.yaml. The promises of the Idempotency-Key protocol that any API
// makes are internal/conformance's; the test suite runs both.
package contracttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/oncekey/oncekey"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/internal/conformance"
)

// Config says which deployment to check. The suite creates orders in the
// account of APIKey, changes and cancels some, pays some (1200 RUB each,
// charged through the deployment's payment provider) and refunds parts of
// those payments: use a dedicated test account on a sandbox provider.
type Config struct {
	BaseURL string
	APIKey  string
	// Timeout bounds each request (default 10s).
	Timeout time.Duration
}

// Result is one check's outcome.
type Result struct {
	Name string
	Err  error // nil: passed
}

// check is one promise of the protocol, verified over HTTP.
type check struct {
	name string
	run  func(ctx context.Context, s *session) error
}

// session is the suite's HTTP client for one run.
type session struct {
	cfg       Config
	http      *http.Client
	validator *conformance.ValidatingTransport
	runID     string
}

// Run executes every check in order and returns their results. An error
// means the suite could not start at all.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.BaseURL == "" || cfg.APIKey == "" {
		return nil, errors.New("contracttest: a URL and an API key are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(bytes.Clone(oncekey.OpenAPISpec))
	if err != nil {
		return nil, fmt.Errorf("contracttest: load openapi.yaml: %w", err)
	}
	v, err := conformance.NewValidatingTransport(doc, "", nil)
	if err != nil {
		return nil, err
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	s := &session{cfg: cfg, http: &http.Client{Transport: v, Timeout: cfg.Timeout}, validator: v, runID: hex.EncodeToString(id[:])}

	results := make([]Result, 0, len(checks))
	for _, c := range checks {
		err := c.run(ctx, s)
		for _, violation := range v.Violations() {
			err = errors.Join(err, violation)
		}
		results = append(results, Result{Name: c.name, Err: err})
	}
	return results, nil
}

// key returns an Idempotency-Key unique to this run, so the suite can run
// against a live deployment again and again.
func (s *session) key(name string) string { return "contract-test-" + s.runID + "-" + name }

// answer is a response with its body read.
type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) problemType() string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Type
}

func (s *session) do(ctx context.Context, method, path, key, body string, header ...string) (answer, error) {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.cfg.BaseURL+path, r)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+s.cfg.APIKey)
	if body != "" {
		req.Header.Set("Content-Type", contentType(method))
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func expect(a answer, status int, problemType string) error {
	if a.status != status {
		return fmt.Errorf("got %d, want %d (body: %.300s)", a.status, status, a.body)
	}
	if problemType != "" && a.problemType() != problemBase+problemType {
		return fmt.Errorf("got problem type %q, want %q", a.problemType(), problemBase+problemType)
	}
	return nil
}

// contentType is the media type of a request body: a PATCH is a JSON
// Merge Patch.
func contentType(method string) string {
	if method == http.MethodPatch {
		return "application/merge-patch+json"
	}
	return "application/json"
}

// want sends a request and checks the answer's status and problem type.
func (s *session) want(ctx context.Context, status int, problemType, method, path, key, body string, header ...string) (answer, error) {
	a, err := s.do(ctx, method, path, key, body, header...)
	if err != nil {
		return a, err
	}
	if err := expect(a, status, problemType); err != nil {
		return a, fmt.Errorf("%s %s: %w", method, path, err)
	}
	return a, nil
}

// fresh is want for a request that must run: its answer is not a replay.
func (s *session) fresh(ctx context.Context, status int, problemType, method, path, key, body string) (answer, error) {
	a, err := s.want(ctx, status, problemType, method, path, key, body)
	if err == nil && replayed(a) {
		err = fmt.Errorf("%s %s: the first request with its key was answered with a replay", method, path)
	}
	return a, err
}

// twice sends a request that must run, then again with the same key: the
// second answer must be the first, replayed.
func (s *session) twice(ctx context.Context, status int, problemType, method, path, key, body string) (answer, error) {
	first, err := s.fresh(ctx, status, problemType, method, path, key, body)
	if err != nil {
		return first, err
	}
	again, err := s.do(ctx, method, path, key, body)
	if err != nil {
		return first, err
	}
	if err := replayOf(first, again); err != nil {
		return first, fmt.Errorf("%s %s retried: %w", method, path, err)
	}
	return first, nil
}

const headerReplayed = "Idempotent-Replayed"

func replayed(a answer) bool { return a.header.Get(headerReplayed) == "true" }

// replayOf checks that again is first replayed: the same status, body and
// Location, marked Idempotent-Replayed.
func replayOf(first, again answer) error {
	if again.status != first.status || !bytes.Equal(first.body, again.body) || !replayed(again) ||
		again.header.Get("Location") != first.header.Get("Location") {
		return fmt.Errorf("not a byte-identical replay:\nfirst: %d %s\nretry: %d %s (%s: %q)",
			first.status, first.body, again.status, again.body, headerReplayed, again.header.Get(headerReplayed))
	}
	return nil
}

// inProgress reports whether a is the answer to a duplicate of a request
// still running: 202 request-in-progress. It must say when to come back.
func inProgress(a answer) (bool, error) {
	if a.status != http.StatusAccepted || a.problemType() != problemBase+idempotency.ProblemOf(idempotency.ErrInFlight).Slug {
		return false, nil
	}
	if a.header.Get("Retry-After") == "" {
		return true, errors.New("a 202 request-in-progress without Retry-After")
	}
	return true, nil
}

// stormSize is how many copies of one request a burst sends at once.
const stormSize = 20

// burst sends stormSize copies of one request at once, with no way to
// slow the server down: the protocol's promise for duplicates in flight.
// Exactly one of them runs the operation, with status (the one answer
// without Idempotent-Replayed); every other one gets 202
// request-in-progress with Retry-After, or a replay that isReplay accepts
// (nil: replayOf). Once the burst is over the key replays the one that ran.
// burst returns the answer of the one that ran.
func (s *session) burst(ctx context.Context, status int, send func(context.Context) (answer, error), isReplay func(ran, a answer) error) (answer, error) {
	if isReplay == nil {
		isReplay = replayOf
	}
	answers := make([]answer, stormSize)
	errs := make([]error, stormSize)
	var wg sync.WaitGroup
	for i := range stormSize {
		wg.Go(func() { answers[i], errs[i] = send(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return answer{}, err
	}
	var ran, replays []answer
	for _, a := range answers {
		waiting, err := inProgress(a)
		switch {
		case err != nil:
			return answer{}, err
		case waiting:
		case replayed(a):
			replays = append(replays, a)
		default:
			ran = append(ran, a)
		}
	}
	if len(ran) != 1 {
		var got []string
		for _, a := range ran {
			got = append(got, fmt.Sprintf("%d %.200s", a.status, a.body))
		}
		return answer{}, fmt.Errorf("%d of %d duplicates were answered without %s (each ran the operation), want exactly 1: %s",
			len(ran), stormSize, headerReplayed, strings.Join(got, "; "))
	}
	if ran[0].status != status {
		return answer{}, fmt.Errorf("the duplicate that ran got %d, want %d (body: %.300s)", ran[0].status, status, ran[0].body)
	}
	for _, a := range replays {
		if err := isReplay(ran[0], a); err != nil {
			return answer{}, fmt.Errorf("a duplicate in the burst: %w", err)
		}
	}
	again, err := send(ctx)
	if err != nil {
		return answer{}, err
	}
	if err := isReplay(ran[0], again); err != nil {
		return answer{}, fmt.Errorf("after the burst: %w", err)
	}
	return ran[0], nil
}

// resource is what the checks read of an order, a payment or a refund.
type resource struct {
	ID          string  `json:"id"`
	Status      string  `json:"status"`
	Amount      int64   `json:"amount"`
	PaymentID   string  `json:"payment_id"`
	CancelledAt *string `json:"cancelled_at"`
}

func decode(a answer) (resource, error) {
	var r resource
	if err := json.Unmarshal(a.body, &r); err != nil || r.ID == "" {
		return r, fmt.Errorf("not a resource with an id: %.300s", a.body)
	}
	return r, nil
}

// get reads the resource at path.
func (s *session) get(ctx context.Context, path string) (resource, error) {
	a, err := s.want(ctx, http.StatusOK, "", http.MethodGet, path, "", "")
	if err != nil {
		return resource{}, err
	}
	return decode(a)
}

// sameJSON reports whether a and b are the same JSON value, whatever their
// layout.
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

const problemBase = "https://oncekey.dev/problems/"

const (
	seedOrder      = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`
	unknownCurrncy = `{"items":[{"sku":"SKU-1","qty":1}],"amount":100,"currency":"XYZ"}`
	// unknownID is an id no deployment issued.
	unknownID = "00000000-0000-7000-8000-000000000000"
)

// checks are every check, in the order they run.
var checks = slices.Concat(protocolChecks, orderChecks, paymentChecks)

// protocolChecks are what conformance cannot know of Oncekey: its
// operational endpoints, its 401s, a stored business outcome, and orders
// read back. (The protocol's own promises are conformance's checks.)
var protocolChecks = []check{
	{"operations endpoints answer", func(ctx context.Context, s *session) error {
		for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml"} {
			if _, err := s.want(ctx, http.StatusOK, "", http.MethodGet, path, "", "", "Authorization", ""); err != nil {
				return err
			}
		}
		return nil
	}},
	{"unauthenticated requests get 401, alike", func(ctx context.Context, s *session) error {
		none, err := s.do(ctx, http.MethodGet, "/orders", "", "", "Authorization", "")
		if err != nil {
			return err
		}
		bad, err := s.do(ctx, http.MethodGet, "/orders", "", "", "Authorization", "Bearer ok_not_a_key_"+s.runID)
		if err != nil {
			return err
		}
		if err := errors.Join(expect(none, 401, idempotency.ProblemOf(idempotency.ErrNoScope).Slug), expect(bad, 401, idempotency.ProblemOf(idempotency.ErrNoScope).Slug)); err != nil {
			return err
		}
		if !bytes.Equal(none.body, bad.body) {
			return errors.New("a missing and an unknown key get different bodies: that enumerates keys")
		}
		return nil
	}},
	{"a business outcome is stored and replayed", func(ctx context.Context, s *session) error {
		_, err := s.twice(ctx, http.StatusUnprocessableEntity, "unknown-currency", http.MethodPost, "/orders", s.key("outcome"), unknownCurrncy)
		return err
	}},
	{"orders read back, another id is 404", func(ctx context.Context, s *session) error {
		created, err := s.want(ctx, http.StatusCreated, "", http.MethodPost, "/orders", s.key("read"), seedOrder)
		if err != nil {
			return err
		}
		order, err := decode(created)
		if err != nil {
			return err
		}
		got, err := s.want(ctx, http.StatusOK, "", http.MethodGet, "/orders/"+order.ID, "", "")
		if err != nil {
			return err
		}
		if !bytes.Equal(bytes.TrimSpace(got.body), bytes.TrimSpace(created.body)) {
			return fmt.Errorf("GET differs from the created order:\n%s\n%s", got.body, created.body)
		}
		if _, err := s.want(ctx, http.StatusNotFound, "not-found", http.MethodGet, "/orders/"+unknownID, "", ""); err != nil {
			return err
		}
		list, err := s.want(ctx, http.StatusOK, "", http.MethodGet, "/orders?limit=100", "", "")
		if err != nil {
			return err
		}
		if !bytes.Contains(list.body, []byte(order.ID)) {
			return errors.New("the new order is not on the first page of GET /orders")
		}
		return nil
	}},
}
