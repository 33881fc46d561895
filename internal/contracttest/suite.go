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
	"strings"
	"sync"
	"time"
)

// Config says which deployment to check. The suite creates a few orders in
// the account of APIKey: use a dedicated test account.
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
	validator *ValidatingTransport
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
	v, err := NewValidatingTransport(nil)
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
		req.Header.Set("Content-Type", "application/json")
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

const problemBase = "https://oncekey.dev/problems/"

const (
	seedOrder      = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`
	seedReordered  = "{ \"currency\": \"RUB\", \"amount\": 1200,\n  \"items\": [ { \"qty\": 2, \"sku\": \"SKU-1\" } ] }"
	otherOrder     = `{"items":[{"sku":"SKU-1","qty":3}],"amount":1800,"currency":"RUB"}`
	unknownCurrncy = `{"items":[{"sku":"SKU-1","qty":1}],"amount":100,"currency":"XYZ"}`
)

var checks = []check{
	{"operations endpoints answer", func(ctx context.Context, s *session) error {
		for _, path := range []string{"/healthz", "/readyz", "/openapi.yaml"} {
			a, err := s.do(ctx, http.MethodGet, path, "", "", "Authorization", "")
			if err != nil {
				return err
			}
			if err := expect(a, http.StatusOK, ""); err != nil {
				return fmt.Errorf("%s: %w", path, err)
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
		if err := errors.Join(expect(none, 401, "unauthorized"), expect(bad, 401, "unauthorized")); err != nil {
			return err
		}
		if !bytes.Equal(none.body, bad.body) {
			return errors.New("a missing and an unknown key get different bodies: that enumerates keys")
		}
		return nil
	}},
	{"first request runs, a retry replays byte for byte", func(ctx context.Context, s *session) error {
		key := s.key("replay")
		first, err := s.do(ctx, http.MethodPost, "/orders", key, seedOrder)
		if err != nil {
			return err
		}
		if err := expect(first, http.StatusCreated, ""); err != nil {
			return fmt.Errorf("first: %w", err)
		}
		if first.header.Get("Idempotency-Key") != key || first.header.Get("Location") == "" {
			return errors.New("first: Idempotency-Key echo or Location missing")
		}
		for _, body := range []string{seedOrder, seedReordered} {
			again, err := s.do(ctx, http.MethodPost, "/orders", key, body)
			if err != nil {
				return err
			}
			if err := expect(again, http.StatusCreated, ""); err != nil {
				return fmt.Errorf("retry: %w", err)
			}
			if !bytes.Equal(first.body, again.body) || again.header.Get("Idempotent-Replayed") != "true" ||
				again.header.Get("Location") != first.header.Get("Location") {
				return fmt.Errorf("retry is not a byte-identical replay:\nfirst: %s\nretry: %s", first.body, again.body)
			}
		}
		return nil
	}},
	{"the same key with a different request is 409", func(ctx context.Context, s *session) error {
		key := s.key("mismatch")
		if a, err := s.do(ctx, http.MethodPost, "/orders", key, seedOrder); err != nil || expect(a, 201, "") != nil {
			return errors.Join(err, expect(a, 201, ""))
		}
		a, err := s.do(ctx, http.MethodPost, "/orders", key, otherOrder)
		if err != nil {
			return err
		}
		return expect(a, http.StatusConflict, "idempotency-key-mismatch")
	}},
	{"a missing or malformed key is 400", func(ctx context.Context, s *session) error {
		missing, err := s.do(ctx, http.MethodPost, "/orders", "", seedOrder)
		if err != nil {
			return err
		}
		long, err := s.do(ctx, http.MethodPost, "/orders", strings.Repeat("k", 256), seedOrder)
		if err != nil {
			return err
		}
		return errors.Join(expect(missing, 400, "missing-idempotency-key"), expect(long, 400, "invalid-idempotency-key"))
	}},
	{"a rejected request consumes no key", func(ctx context.Context, s *session) error {
		key := s.key("rejected")
		bad, err := s.do(ctx, http.MethodPost, "/orders", key, `{"items":[],"amount":1200,"currency":"RUB"}`)
		if err != nil {
			return err
		}
		if err := expect(bad, 400, "validation-error"); err != nil {
			return err
		}
		good, err := s.do(ctx, http.MethodPost, "/orders", key, seedOrder)
		if err != nil {
			return err
		}
		if err := expect(good, 201, ""); err != nil {
			return fmt.Errorf("after fixing the body: %w", err)
		}
		if good.header.Get("Idempotent-Replayed") != "" {
			return errors.New("the fixed request was answered with a replay")
		}
		return nil
	}},
	{"a business outcome is stored and replayed", func(ctx context.Context, s *session) error {
		key := s.key("outcome")
		first, err := s.do(ctx, http.MethodPost, "/orders", key, unknownCurrncy)
		if err != nil {
			return err
		}
		if err := expect(first, http.StatusUnprocessableEntity, "unknown-currency"); err != nil {
			return err
		}
		again, err := s.do(ctx, http.MethodPost, "/orders", key, unknownCurrncy)
		if err != nil {
			return err
		}
		if err := expect(again, http.StatusUnprocessableEntity, "unknown-currency"); err != nil {
			return err
		}
		if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.body, again.body) {
			return errors.New("the 422 was not replayed byte for byte")
		}
		return nil
	}},
	{"orders read back, another id is 404", func(ctx context.Context, s *session) error {
		created, err := s.do(ctx, http.MethodPost, "/orders", s.key("read"), seedOrder)
		if err != nil {
			return err
		}
		if err := expect(created, 201, ""); err != nil {
			return err
		}
		var order struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(created.body, &order); err != nil {
			return err
		}
		got, err := s.do(ctx, http.MethodGet, "/orders/"+order.ID, "", "")
		if err != nil {
			return err
		}
		if err := expect(got, 200, ""); err != nil {
			return err
		}
		if !bytes.Equal(bytes.TrimSpace(got.body), bytes.TrimSpace(created.body)) {
			return fmt.Errorf("GET differs from the created order:\n%s\n%s", got.body, created.body)
		}
		missing, err := s.do(ctx, http.MethodGet, "/orders/00000000-0000-7000-8000-000000000000", "", "")
		if err != nil {
			return err
		}
		list, err := s.do(ctx, http.MethodGet, "/orders?limit=100", "", "")
		if err != nil {
			return err
		}
		if err := errors.Join(expect(missing, 404, "not-found"), expect(list, 200, "")); err != nil {
			return err
		}
		if !bytes.Contains(list.body, []byte(order.ID)) {
			return errors.New("the new order is not on the first page of GET /orders")
		}
		return nil
	}},
	{"concurrent duplicates run the operation once", func(ctx context.Context, s *session) error {
		const n = 20
		key := s.key("storm")
		answers := make([]answer, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { answers[i], errs[i] = s.do(ctx, http.MethodPost, "/orders", key, seedOrder) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		var body []byte
		for _, a := range answers {
			switch a.status {
			case http.StatusCreated:
				if body != nil && !bytes.Equal(body, a.body) {
					return fmt.Errorf("two different 201 bodies for one key:\n%s\n%s", body, a.body)
				}
				body = a.body
			case http.StatusAccepted:
				if a.header.Get("Retry-After") == "" {
					return errors.New("a 202 without Retry-After")
				}
			default:
				return fmt.Errorf("a duplicate got %d: %s", a.status, a.body)
			}
		}
		// Every duplicate may have got 202 while the first ran; retrying
		// must then produce the one outcome, the same for everyone.
		for try := 0; body == nil && try < 20; try++ {
			time.Sleep(250 * time.Millisecond)
			a, err := s.do(ctx, http.MethodPost, "/orders", key, seedOrder)
			if err != nil {
				return err
			}
			if a.status == http.StatusCreated {
				body = a.body
			}
		}
		if body == nil {
			return errors.New("no request of the storm ever got the 201")
		}
		again, err := s.do(ctx, http.MethodPost, "/orders", key, seedOrder)
		if err != nil {
			return err
		}
		if again.status != http.StatusCreated || !bytes.Equal(again.body, body) {
			return fmt.Errorf("after the storm the key replays %d %s, want the storm's 201", again.status, again.body)
		}
		return nil
	}},
}
