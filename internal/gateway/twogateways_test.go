package gateway_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/internal/gateway"
	"github.com/oncekey/oncekey/internal/gateway/keyscope"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// countingUpstream answers every POST 201 with its name and the key, and
// counts its runs per key.
type countingUpstream struct {
	name string
	url  *url.URL
	mu   sync.Mutex
	runs map[string]int
}

func startCountingUpstream(t *testing.T, name string) *countingUpstream {
	t.Helper()
	u := &countingUpstream{name: name, runs: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idempotency.HeaderKey)
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.runs[key]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"upstream":%q,"key":%q}`, name, key)
	}))
	t.Cleanup(srv.Close)
	var err error
	u.url, err = url.Parse(srv.URL)
	require.NoError(t, err)
	return u
}

func (u *countingUpstream) ran(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[key]
}

// transfersGateway serves a gateway covering POST /transfers, keys
// scoped by X-Account-Id, with cfg's other fields, on store.
func transfersGateway(t *testing.T, cfg gateway.Config, store idempotency.Store[*pgstore.Batch]) *httptest.Server {
	t.Helper()
	cfg.Scope = keyscope.Header("X-Account-Id")
	cfg.Routes = []gateway.Route{{Method: http.MethodPost, Path: "/transfers"}}
	h, err := gateway.New(cfg, store)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// pgGateway is a gateway in front of up on the database at pool, with a
// store of its own (as a process of its own has): namespace "" is the
// default, the upstream's origin.
func pgGateway(t *testing.T, pool *pgxpool.Pool, up *url.URL, namespace string) *httptest.Server {
	t.Helper()
	return transfersGateway(t, gateway.Config{Upstream: up, Namespace: namespace}, deferredStoreOn(t, pool))
}

// TestTwoGatewaysOnOneDatabaseKeepTheirKeysApart: two gateways in front of
// two upstreams share one key table, and 1,000 (scope, key) pairs sent to
// both: no gateway replays the other's answer, and each upstream runs each
// key once. A replica of one gateway (the same upstream, so the same
// namespace) replays that gateway's answers. On PostgreSQL with a store
// each (as processes of their own have), and on one store of each kind
// (memory, PostgreSQL, Redis in front of PostgreSQL) shared by the three.
func TestTwoGatewaysOnOneDatabaseKeepTheirKeysApart(t *testing.T) {
	t.Parallel()
	type servers func(t *testing.T, a, b *url.URL) (gwA, gwB, replicaA string)
	variants := []struct {
		name    string
		servers servers
	}{{"postgres, a store each", func(t *testing.T, a, b *url.URL) (string, string, string) {
		_, pool := testdb.Fresh(t)
		return pgGateway(t, pool, a, "").URL, pgGateway(t, pool, b, "").URL, pgGateway(t, pool, a, "").URL
	}}}
	for _, st := range stores {
		variants = append(variants, struct {
			name    string
			servers servers
		}{st.name + ", one store", func(t *testing.T, a, b *url.URL) (string, string, string) {
			open := st.open(t)
			serve := func(up *url.URL) string {
				srv := httptest.NewServer(open(gateway.Config{Upstream: up, Scope: keyscope.Header("X-Account-Id"),
					Routes: []gateway.Route{{Method: http.MethodPost, Path: "/transfers"}}}))
				t.Cleanup(srv.Close)
				return srv.URL
			}
			return serve(a), serve(b), serve(a)
		}})
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			twoGateways(t, v.servers)
		})
	}
}

func twoGateways(t *testing.T, servers func(t *testing.T, a, b *url.URL) (gwA, gwB, replicaA string)) {
	a, b := startCountingUpstream(t, "a"), startCountingUpstream(t, "b")
	gwA, gwB, replicaA := servers(t, a.url, b.url)
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(ctx context.Context, base, scope, key string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/transfers", strings.NewReader(transfer))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Account-Id", scope)
		req.Header.Set(idempotency.HeaderKey, key)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	const pairs = 1000
	type pair struct{ scope, key string }
	all := make([]pair, pairs)
	for i := range all {
		all[i] = pair{fmt.Sprintf("acct-%d", i%37), rand.Text()}
	}
	ctx := t.Context()
	errs := make(chan error, pairs)
	slots := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			errs <- func() error {
				for _, gw := range []struct {
					base string
					up   *countingUpstream
				}{{gwA, a}, {gwB, b}, {replicaA, a}} {
					status, body, err := post(ctx, gw.base, p.scope, p.key)
					if err != nil {
						return err
					}
					want := fmt.Sprintf(`{"upstream":%q,"key":%q}`, gw.up.name, p.key)
					if status != http.StatusCreated || body != want {
						return fmt.Errorf("%s %s through %s: %d %s, want 201 %s", p.scope, p.key, gw.base, status, body, want)
					}
				}
				return nil
			}()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "no gateway answers with another upstream's answer")
	}
	for _, p := range all {
		require.Equal(t, 1, a.ran(p.key), "upstream a ran %s once, for both replicas of its gateway", p.key)
		require.Equal(t, 1, b.ran(p.key), "upstream b ran %s once", p.key)
	}
}
