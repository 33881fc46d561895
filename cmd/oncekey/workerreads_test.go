package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// The payment worker of `oncekey serve` reads the primary, never the
// replica of DATABASE_REPLICA_URL: a replica that holds a payment, but an
// older state of it (pending, before its charge), must not decide its
// refund. The replica here is a database of the test's own whose rows the
// test writes; after the payment succeeded on the primary it holds the
// payment as it was while pending. The refund settles succeeded, of the
// primary's charge, once; the API, meanwhile, does read the replica (a
// plain GET shows the stale row), so the replica was there to be misread.
func TestWorkerIsNotMisledByAStaleReplica(t *testing.T) {
	t.Parallel()
	b := startOnStandInReplica(t)
	payment := b.paid(t)

	b.writeStale(t, payment)
	got := b.get(t, "/payments/"+payment)
	require.Equal(t, http.StatusOK, got.Status, "%s", got)
	require.Contains(t, string(got.Body), `"status":"pending"`, "the API's plain reads come from the replica, which holds the stale row")

	refund := b.refund(t, payment)
	require.Equal(t, "succeeded", b.awaitFinal(t, "refunds", refund),
		"the refund settles from the primary's payment, not the replica's pending copy of it")
	refunds, err := b.provider.RefundsByReference(context.Background(), refund)
	require.NoError(t, err)
	require.Len(t, refunds, 1, "refunded once")
	var charge string
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT provider_charge_id FROM payments WHERE id = $1", payment).Scan(&charge))
	require.Equal(t, charge, refunds[0].ChargeID, "the refund is of the payment's charge")
}

// The payment worker of `oncekey serve` makes no read at all on the
// replica, counted on the wire: the replica's connections pass through a
// proxy that records each statement executed. While a payment and its
// refund settle (the test waits for them on the primary's tables, and the
// API is asked nothing that reads), the replica executes nothing; then one
// plain GET executes the payment's read there, so the proxy does see the
// replica's reads.
func TestWorkerMakesNoReplicaReads(t *testing.T) {
	t.Parallel()
	b := startOnStandInReplica(t)
	payment := b.paid(t)
	refund := b.refund(t, payment)
	require.Equal(t, "succeeded", b.awaitFinal(t, "refunds", refund), "the refund")
	require.Empty(t, b.replica.statements(), "statements executed on the replica while the worker charged and refunded")

	got := b.get(t, "/payments/"+payment)
	require.Equal(t, http.StatusOK, got.Status, "%s", got)
	require.NotEmpty(t, b.replica.statements(), "a plain GET reads the replica (the proxy counts what it runs)")
}

// standInBundle is serve on a primary of the test's own, with a database of
// its own standing in for the replica, behind a statement-counting proxy.
type standInBundle struct {
	addr, apiKey string
	pool         *pgxpool.Pool // the primary
	replicaPool  *pgxpool.Pool // the stand-in replica, for writing its rows
	replica      *statementCounter
	provider     *provider.Client
	client       *http.Client
}

func startOnStandInReplica(t *testing.T) *standInBundle {
	t.Helper()
	dbURL, pool := testdb.Fresh(t)
	replicaURL, replicaPool := testdb.Fresh(t)
	counter := countStatements(t, replicaURL)
	creds, err := auth.CreateAccount(context.Background(), postgres.New(pool, nil), "worker-reads", "")
	require.NoError(t, err)
	sandbox := httptest.NewServer(provider.NewServer(provider.NewMemoryStore(), provider.Faults{}, slog.New(slog.DiscardHandler)))
	t.Cleanup(sandbox.Close)
	env := map[string]string{
		"DATABASE_URL":               dbURL,
		"DATABASE_REPLICA_URL":       counter.url,
		"ONCEKEY_PROVIDER_URL":       sandbox.URL,
		"ONCEKEY_PAYMENT_RETRY_BASE": "10ms",
	}
	addr, _ := startServe(t, env) // its log is printed if the test fails
	return &standInBundle{
		addr: addr, apiKey: creds.APIKey, pool: pool, replicaPool: replicaPool, replica: counter,
		provider: provider.NewClient(sandbox.URL, nil), client: &http.Client{Timeout: 10 * time.Second},
	}
}

// post sends body to path under a new key and returns the id its Location
// names, requiring status.
func (b *standInBundle) post(t *testing.T, path, body string, status int) string {
	t.Helper()
	req, err := servicetest.NewRequest(http.MethodPost, "http://"+b.addr+path, b.apiKey, strings.NewReader(body), "Idempotency-Key", uuid.NewString())
	require.NoError(t, err)
	r, err := servicetest.Exchange(b.client, req)
	require.NoError(t, err)
	require.Equal(t, status, r.Status, "POST %s: %s", path, r)
	loc := r.Header.Get("Location")
	return loc[strings.LastIndex(loc, "/")+1:]
}

func (b *standInBundle) get(t *testing.T, path string) servicetest.Reply {
	t.Helper()
	req, err := servicetest.NewRequest(http.MethodGet, "http://"+b.addr+path, b.apiKey, nil)
	require.NoError(t, err)
	r, err := servicetest.Exchange(b.client, req)
	require.NoError(t, err)
	return r
}

// paid creates an order, pays it and waits, on the primary, for the
// payment to succeed.
func (b *standInBundle) paid(t *testing.T) string {
	t.Helper()
	order := b.post(t, "/orders", testOrder, http.StatusCreated)
	payment := b.post(t, "/payments", fmt.Sprintf(`{"order_id":%q,"amount":1200,"currency":"RUB"}`, order), http.StatusAccepted)
	require.Equal(t, "succeeded", b.awaitFinal(t, "payments", payment), "the payment")
	return payment
}

func (b *standInBundle) refund(t *testing.T, payment string) string {
	t.Helper()
	return b.post(t, "/payments/"+payment+"/refunds", `{"amount":1200,"reason":"returned"}`, http.StatusAccepted)
}

// awaitFinal waits until the row id of table (payments, refunds) is final
// on the primary, read there directly: never through the API, whose reads
// may go to the replica.
func (b *standInBundle) awaitFinal(t *testing.T, table, id string) string {
	t.Helper()
	var status string
	require.Eventually(t, func() bool {
		err := b.pool.QueryRow(context.Background(), "SELECT status FROM "+table+" WHERE id = $1", id).Scan(&status)
		return err == nil && status != "pending"
	}, 30*time.Second, 10*time.Millisecond, "%s %s stays pending", table, id)
	return status
}

// writeStale writes on the stand-in replica the payment as it was before
// it settled: pending, without its charge. Foreign keys are not checked
// (session_replication_role, as a replica applying WAL does not): the
// replica holds this one row.
func (b *standInBundle) writeStale(t *testing.T, payment string) {
	t.Helper()
	ctx := context.Background()
	var row []byte
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT to_jsonb(p) || '{"status":"pending","failure_reason":null,"provider_charge_id":null,"completed_at":null}'
		FROM payments p WHERE id = $1`, payment).Scan(&row))
	tx, err := b.replicaPool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL session_replication_role = replica")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO payments SELECT * FROM jsonb_populate_record(NULL::payments, $1)", row)
	require.NoError(t, err, "the stale payment on the replica")
	require.NoError(t, tx.Commit(ctx))
}

// statementCounter is a TCP proxy in front of a PostgreSQL database that
// records the first line of each statement its clients execute (a simple
// Query, or a Bind of a parsed statement), pgx's pings aside.
type statementCounter struct {
	url string // dbURL, through the proxy

	mu       sync.Mutex
	executed []string
}

// countStatements starts a statementCounter in front of dbURL's server,
// closed when the test ends.
func countStatements(t *testing.T, dbURL string) *statementCounter {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	target := u.Host
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable") // the proxy reads the protocol in clear, on loopback
	u.RawQuery = q.Encode()
	c := &statementCounter{url: u.String()}
	var wg sync.WaitGroup
	var conns sync.Map
	t.Cleanup(func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			conns.Store(client, nil)
			conns.Store(server, nil)
			wg.Go(func() { _, _ = io.Copy(client, server); client.Close() })
			wg.Go(func() { _ = c.relay(server, client); server.Close() })
		}
	})
	return c
}

// relay copies the frontend's messages from client to server, noting the
// statements executed.
func (c *statementCounter) relay(server io.Writer, client io.Reader) error {
	r := bufio.NewReader(client)
	// The startup phase: untyped messages (an SSL or GSS request, then the
	// startup message itself).
	for {
		msg, err := readMessage(r, false)
		if err != nil {
			return err
		}
		if _, err := server.Write(msg); err != nil {
			return err
		}
		code := binary.BigEndian.Uint32(msg[4:8])
		if code != 80877103 && code != 80877104 { // SSLRequest, GSSENCRequest
			break
		}
	}
	parsed := map[string]string{} // statement name → its SQL
	for {
		msg, err := readMessage(r, true)
		if err != nil {
			return err
		}
		body := msg[5:]
		switch msg[0] {
		case 'Q':
			c.note(cstring(body, 0))
		case 'P':
			name := cstring(body, 0)
			parsed[name] = cstring(body, len(name)+1)
		case 'B':
			portal := cstring(body, 0)
			c.note(parsed[cstring(body, len(portal)+1)])
		}
		if _, err := server.Write(msg); err != nil {
			return err
		}
	}
}

func (c *statementCounter) note(sql string) {
	first, _, _ := strings.Cut(strings.TrimSpace(sql), "\n")
	if first == "-- ping" || first == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.executed = append(c.executed, first)
}

// statements returns the first line of each statement executed so far.
func (c *statementCounter) statements() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.executed...)
}

// readMessage reads one frontend message whole: a type byte, if typed,
// then a length that counts itself.
func readMessage(r *bufio.Reader, typed bool) ([]byte, error) {
	head := 4
	if typed {
		head = 5
	}
	msg := make([]byte, head)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4:]))
	if n < 4 || n > 1<<26 {
		return nil, errors.New("a message of impossible length")
	}
	msg = append(msg, make([]byte, n-4)...)
	_, err := io.ReadFull(r, msg[head:])
	return msg, err
}

// cstring is the NUL-terminated string at b[from:].
func cstring(b []byte, from int) string {
	if from >= len(b) {
		return ""
	}
	s, _, _ := strings.Cut(string(b[from:]), "\x00")
	return s
}
