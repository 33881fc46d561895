package caddymodule_test

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

// holdingUpstream answers 201 with a fresh id, after holding a request
// that asks for it (X-Hold) until the test lets it go, and records the
// bodies and headers it received.
type holdingUpstream struct {
	*httptest.Server
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	headers []http.Header
	bodies  []string
}

func startHoldingUpstream(t *testing.T) *holdingUpstream {
	t.Helper()
	u := &holdingUpstream{arrived: make(chan struct{}, 64), release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.headers, u.bodies = append(u.headers, r.Header), append(u.bodies, string(body))
		u.mu.Unlock()
		if r.Header.Get("X-Hold") != "" {
			u.arrived <- struct{}{}
			<-u.release
		} else {
			// pacing: an upstream slow on purpose, long enough for
			// duplicates to meet it in flight; nothing is waited for.
			time.Sleep(50 * time.Millisecond)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":%q}`, rand.Text())
	}))
	t.Cleanup(u.Close)
	t.Cleanup(u.free) // before Close: a failed test still lets a held request go
	return u
}

func (u *holdingUpstream) free() { u.once.Do(func() { close(u.release) }) }

func (u *holdingUpstream) received() ([]http.Header, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.headers...), append([]string(nil), u.bodies...)
}

// sendTo posts body to addr+path with the headers given in pairs.
func sendTo(addr, path, body string, header ...string) (*http.Response, string, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// TestCaddyProfilesTemplatesAndKeyPlaces: the module answers as oncekey
// proxy does. Under profile ietf (the default) a duplicate in flight gets
// 409 with Retry-After once wait has passed, a key reused with another
// request 422, a missing key 400; under oncekey 202 and 409. With the
// Stripe-shaped error template, its own answers are that document. A site
// keyed by X-Idempotency-Key, one by PayPal-Request-Id and one by a body
// field each run once per key under 32 concurrent duplicates, refuse a
// missing key with 400, and forward the bytes sent.
func TestCaddyProfilesTemplatesAndKeyPlaces(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	template, err := filepath.Abs(filepath.Join("..", "..", "deploy", "gateway", "stripe-error-template.json"))
	require.NoError(t, err)
	addrs := freeAddrs(t, 8)
	ietf, oncekey, shaped, dead, xkey, paypal, square, deadUpstream := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4], addrs[5], addrs[6], addrs[7]
	ups := map[string]*holdingUpstream{}
	site := func(addr, options string) string {
		up := startHoldingUpstream(t)
		ups[addr] = up
		return fmt.Sprintf("http://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t\twait 100ms\n\t\tproblem_type_base https://example.com/problems/\n%s\t}\n\treverse_proxy %s\n}\n",
			addr, options, strings.TrimPrefix(up.URL, "http://"))
	}
	startCaddy(t, bin, "{\n\tadmin off\n\tauto_https off\n}\n"+
		site(ietf, "")+site(oncekey, "\t\tprofile oncekey\n")+
		site(shaped, fmt.Sprintf("\t\terror_template %q\n", template))+
		fmt.Sprintf("http://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t\terror_template %q\n\t}\n\treverse_proxy %s\n}\n", dead, template, deadUpstream)+
		site(xkey, "\t\tkey_header X-Idempotency-Key\n")+site(paypal, "\t\tkey_header PayPal-Request-Id\n")+
		site(square, "\t\tkey_body_field /idempotency_key\n"),
		ietf, oncekey, shaped, dead, xkey, paypal, square)

	for _, tc := range []struct {
		name, addr         string
		inFlight, mismatch int
	}{
		{"ietf, the default", ietf, http.StatusConflict, http.StatusUnprocessableEntity},
		{"oncekey", oncekey, http.StatusAccepted, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up, scope, key := ups[tc.addr], "acct-"+rand.Text(), rand.Text()
			first := make(chan int, 1)
			go func() {
				resp, _, err := sendTo(tc.addr, "/charges", `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, key, "X-Hold", "1")
				if err != nil {
					first <- 0
					return
				}
				first <- resp.StatusCode
			}()
			<-up.arrived
			resp, body, err := sendTo(tc.addr, "/charges", `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, key)
			require.NoError(t, err)
			require.Equal(t, tc.inFlight, resp.StatusCode, "a duplicate in flight: %s", body)
			require.Equal(t, "1", resp.Header.Get("Retry-After"))
			require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrInFlight).Slug)
			up.free()
			require.Equal(t, http.StatusCreated, <-first)
			resp, body, err = sendTo(tc.addr, "/charges", `{"amount":2}`, "X-Account-Id", scope, idempotency.HeaderKey, key)
			require.NoError(t, err)
			require.Equal(t, tc.mismatch, resp.StatusCode, "a key reused: %s", body)
			require.Contains(t, body, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug)
			resp, body, err = sendTo(tc.addr, "/charges", `{"amount":1}`, "X-Account-Id", scope)
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "no key: %s", body)
			_, bodies := up.received()
			require.Len(t, bodies, 1, "the upstream ran the first request alone")
		})
	}

	t.Run("the error template", func(t *testing.T) {
		t.Parallel()
		scope, key := "acct-"+rand.Text(), rand.Text()
		resp, body, err := sendTo(shaped, "/charges", `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, key)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.StatusCode, body)
		for _, tc := range []struct {
			name, addr, body string
			header           []string
			status           int
			code             string
		}{
			{"mismatch", shaped, `{"amount":2}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, key}, 422, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug},
			{"missing key", shaped, `{"amount":1}`, []string{"X-Account-Id", scope}, 400, idempotency.ProblemOf(idempotency.ErrMissingKey).Slug},
			{"no credentials", shaped, `{"amount":1}`, []string{idempotency.HeaderKey, rand.Text()}, 401, idempotency.ProblemOf(idempotency.ErrNoScope).Slug},
			{"ambiguous path", shaped, `{"amount":1}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, rand.Text()}, 400, "ambiguous-path"},
			{"upstream unreachable", dead, `{"amount":1}`, []string{"X-Account-Id", scope, idempotency.HeaderKey, rand.Text()}, 502, "upstream-unreachable"},
		} {
			path := "/charges"
			if tc.name == "ambiguous path" {
				path = "/x/../charges"
			}
			resp, body, err := sendTo(tc.addr, path, tc.body, tc.header...)
			require.NoError(t, err)
			require.Equal(t, tc.status, resp.StatusCode, "%s: %s", tc.name, body)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"), tc.name)
			var doc struct {
				Error struct{ Type, Code, Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &doc), "%s: %s", tc.name, body)
			require.Equal(t, "idempotency_error", doc.Error.Type, body)
			require.Equal(t, tc.code, doc.Error.Code, body)
			require.NotEmpty(t, doc.Error.Message, body)
		}
	})

	for _, tc := range []struct{ name, addr, header string }{
		{"X-Idempotency-Key", xkey, "X-Idempotency-Key"},
		{"PayPal-Request-Id", paypal, "PayPal-Request-Id"},
		{"a body field", square, ""},
	} {
		t.Run("keyed by "+tc.name, func(t *testing.T) {
			t.Parallel()
			up, scope, key := ups[tc.addr], "acct-"+rand.Text(), rand.Text()
			body, header := `{ "amount": 100.100000000000000000001 }`, []string{"X-Account-Id", scope, tc.header, key}
			if tc.header == "" {
				body, header = `{ "amount": 100.100000000000000000001, "idempotency_key": "`+key+`" }`, header[:2]
			}
			const storm = 32
			var wg sync.WaitGroup
			answers, bodies := make([]*http.Response, storm), make([]string, storm)
			for i := range storm {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Caddy's wait is 100ms: a client retries the 409 of a
					// duplicate in flight, as SDKs do.
					for range 100 {
						answers[i], bodies[i], _ = sendTo(tc.addr, "/charges", body, header...)
						if answers[i] == nil || answers[i].StatusCode != http.StatusConflict {
							return
						}
						time.Sleep(20 * time.Millisecond) // pacing: the client's backoff before it retries
					}
				}()
			}
			wg.Wait()
			for i, resp := range answers {
				require.NotNil(t, resp, "duplicate %d got an answer", i)
				require.Equal(t, http.StatusCreated, resp.StatusCode, bodies[i])
				require.Equal(t, bodies[0], bodies[i], "every duplicate got the first answer")
				if tc.header != "" {
					require.Equal(t, key, resp.Header.Get(tc.header), "the key repeated in its header")
					require.Empty(t, resp.Header.Values(idempotency.HeaderKey), "and in no other")
				}
			}
			headers, ran := up.received()
			require.Equal(t, []string{body}, ran, "the upstream ran it once, on the bytes sent")
			if tc.header != "" {
				require.Equal(t, []string{key}, headers[0].Values(tc.header), "the key reaches the upstream in its header")
			}
			resp, got, err := sendTo(tc.addr, "/charges", `{"amount":1}`, "X-Account-Id", scope, idempotency.HeaderKey, rand.Text())
			require.NoError(t, err)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "the key elsewhere is no key: %s", got)
			require.Contains(t, got, idempotency.ProblemOf(idempotency.ErrMissingKey).Slug)
			_, ran = up.received()
			require.Len(t, ran, 1, "a request without its key never reaches the upstream")
		})
	}
}

// TestCaddyRefusesABadErrorTemplate: a template that is not JSON, or names
// a placeholder that does not exist, fails Caddy's provisioning with one
// line that says so.
func TestCaddyRefusesABadErrorTemplate(t *testing.T) {
	t.Parallel()
	bin := buildCaddy(t)
	for _, tc := range []struct{ name, template, want string }{
		{"not json", `{"error": `, "error template: not a JSON document"},
		{"unknown placeholder", `{"error": {"message": "{foo}"}}`, "error template: unknown placeholder {foo}"},
	} {
		dir := t.TempDir()
		file := filepath.Join(dir, "errors.json")
		require.NoError(t, os.WriteFile(file, []byte(tc.template), 0o600))
		caddyfile := filepath.Join(dir, "Caddyfile")
		require.NoError(t, os.WriteFile(caddyfile, []byte(fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n}\nhttp://%s {\n\tidempotency {\n\t\tscope {http.request.header.X-Account-Id}\n\t\terror_template %q\n\t}\n\treverse_proxy 127.0.0.1:1\n}\n", freeAddr(t), file)), 0o600))
		cmd := exec.Command(bin, "validate", "--config", caddyfile, "--adapter", "caddyfile")
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%s: %s", tc.name, out)
		var line string
		for l := range strings.Lines(string(out)) {
			if strings.Contains(l, tc.want) {
				line = l
			}
		}
		require.NotEmpty(t, line, "%s: the reason, in:\n%s", tc.name, out)
		require.Contains(t, line, "error_template "+file, tc.name)
	}
}
