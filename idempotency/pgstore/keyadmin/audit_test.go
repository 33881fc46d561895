package keyadmin_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, pgstoretest.Options{}) }

// testBundle is what an audit test works on: a store on a migrated
// database, and a scope of the test's own.
type testBundle struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	scope string
}

// setup opens the store on the shared database, or with own on a
// database of the test's own (for tests that add triggers).
func setup(t *testing.T, own bool) testBundle {
	t.Helper()
	pool := pgstoretest.Pool(t)
	if own {
		_, pool = pgstoretest.Fresh(t)
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	return testBundle{pool: pool, store: store, scope: "ns:gw|" + rand.Text()}
}

// hold stores held under key, as a gateway holds a key, then settles it
// with next if given; or, held nil, stores an operation's outcome.
func (b testBundle) hold(t *testing.T, key string, held *idempotency.Held, next *idempotency.Held) {
	t.Helper()
	ctx := context.Background()
	lease, rec, err := b.store.Claim(ctx, idempotency.ClaimRequest{Scope: b.scope, Key: key, Fingerprint: idempotency.Fingerprint{7},
		Method: "POST", Route: "/transfers", TTL: time.Hour, Wait: time.Second})
	require.NoError(t, err)
	require.Nil(t, rec, "a fresh key")
	resp := idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"ok":true}`)}
	if held != nil {
		resp = held.Response()
	}
	require.NoError(t, lease.Commit(ctx, resp))
	if next != nil {
		settled, err := b.store.Settle(ctx, lease.Ref(), next.Response())
		require.NoError(t, err)
		require.True(t, settled)
	}
}

// audit is every audit row of the bundle's scope, newest first.
func (b testBundle) audit(t *testing.T) []keyadmin.AuditEntry {
	t.Helper()
	rows, err := keyadmin.Audit(context.Background(), b.store, keyadmin.AuditFilter{Scope: b.scope, Limit: 1000})
	require.NoError(t, err)
	return rows
}

// storedBody is the key's stored body now.
func (b testBundle) storedBody(t *testing.T, key string) []byte {
	t.Helper()
	var body []byte
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT response_body FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2`, []byte(b.scope), key).Scan(&body))
	return body
}

func sha(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

var (
	unknown = &idempotency.Held{State: idempotency.HeldUnknown, Reason: "the upstream did not answer", Holder: "gw-1:7"}
	lapsed  = &idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(-time.Minute), Holder: "gw-1:8"}
	running = &idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Hour), Holder: "gw-1:9"}
)

// TestResolveAndReleaseAreAudited: each resolve and release of a key of
// unknown outcome makes its change and leaves exactly one audit row: when
// (the database's clock), who (the actor given and the database role),
// the action, the scope and key, the state the key was in, done, the
// reason, and the SHA-256 of the body resolved with or of the held record
// released.
func TestResolveAndReleaseAreAudited(t *testing.T) {
	t.Parallel()
	answer := []byte(`{"id":"found-by-hand"}`)
	for _, tc := range []struct {
		name                 string
		held, next           *idempotency.Held
		resolve              bool
		wantPrevious, wantIs string
	}{
		{name: "resolve a key marked unknown", held: running, next: unknown, resolve: true, wantPrevious: "unknown"},
		{name: "resolve a key whose lease ended", held: lapsed, resolve: true, wantPrevious: "unknown"},
		{name: "release a key marked unknown", held: running, next: unknown, wantPrevious: "unknown"},
		{name: "release a key whose response was not stored", held: running,
			next: &idempotency.Held{State: idempotency.HeldNotStored, Reason: "too large"}, wantPrevious: "not-stored"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, false)
			b.hold(t, "k1", tc.held, tc.next)
			heldBody := b.storedBody(t, "k1")
			change := keyadmin.Change{Scope: b.scope, Key: "k1", Actor: "alice", Reason: "TICKET-7: checked the upstream"}
			var (
				entry keyadmin.AuditEntry
				err   error
			)
			before := time.Now()
			if tc.resolve {
				entry, err = keyadmin.Resolve(ctx, b.store, change, idempotency.Response{Status: http.StatusCreated, Body: answer})
			} else {
				entry, err = keyadmin.Release(ctx, b.store, change)
			}
			require.NoError(t, err)

			rows := b.audit(t)
			require.Len(t, rows, 1, "one row per change: %+v", rows)
			row := rows[0]
			require.Equal(t, entry, row, "what the change returned is what the trail holds")
			require.WithinDuration(t, before, row.At, 5*time.Second, "when, on the database's clock")
			require.Equal(t, "alice", row.Actor)
			require.Equal(t, "postgres", row.DatabaseUser, "the role that wrote the row")
			require.Equal(t, b.scope, row.Scope)
			require.Equal(t, "k1", row.Key)
			require.Equal(t, tc.wantPrevious, row.PreviousState)
			require.Equal(t, keyadmin.OutcomeDone, row.Outcome)
			require.Empty(t, row.Refusal)
			require.Equal(t, change.Reason, row.Reason)

			info, inspectErr := keyadmin.Inspect(ctx, b.store, b.scope, "k1")
			if tc.resolve {
				require.Equal(t, keyadmin.ActionResolve, row.Action)
				require.Equal(t, http.StatusCreated, row.ResponseStatus)
				require.Equal(t, sha(answer), row.BodySHA256, "the hash of the body resolved with")
				require.NoError(t, inspectErr)
				require.Equal(t, "completed", info.Status, "resolved")
				require.Equal(t, answer, b.storedBody(t, "k1"))
				return
			}
			require.Equal(t, keyadmin.ActionRelease, row.Action)
			require.Zero(t, row.ResponseStatus)
			require.Equal(t, sha(heldBody), row.BodySHA256, "the hash of the held record released")
			require.ErrorIs(t, inspectErr, keyadmin.ErrKeyNotFound, "released")
		})
	}
}

// TestRefusedAttemptsAreAudited: an attempt on a key that is not there,
// that holds an outcome, or whose operation still runs within its lease
// changes nothing, says why, and leaves one refused row that says why.
func TestRefusedAttemptsAreAudited(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		stored       bool
		held         *idempotency.Held
		resolve      bool
		wantErr      error
		wantPrevious string
		wantBodyHash bool
	}{
		{name: "resolve an absent key", resolve: true, wantErr: keyadmin.ErrKeyNotFound, wantPrevious: "absent", wantBodyHash: true},
		{name: "release an absent key", wantErr: keyadmin.ErrKeyNotFound, wantPrevious: "absent"},
		{name: "resolve a key holding an outcome", stored: true, resolve: true, wantErr: keyadmin.ErrNotHeld, wantPrevious: "completed", wantBodyHash: true},
		{name: "release a key holding an outcome", stored: true, wantErr: keyadmin.ErrNotHeld, wantPrevious: "completed", wantBodyHash: true},
		{name: "resolve a key still running", stored: true, held: running, resolve: true, wantErr: keyadmin.ErrStillRunning, wantPrevious: "held", wantBodyHash: true},
		{name: "release a key still running", stored: true, held: running, wantErr: keyadmin.ErrStillRunning, wantPrevious: "held", wantBodyHash: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, false)
			var before []byte
			if tc.stored {
				b.hold(t, "k1", tc.held, nil)
				before = b.storedBody(t, "k1")
			}
			change := keyadmin.Change{Scope: b.scope, Key: "k1", Actor: "bob", Reason: "TICKET-8"}
			var err error
			if tc.resolve {
				_, err = keyadmin.Resolve(ctx, b.store, change, idempotency.Response{Status: http.StatusOK, Body: []byte("x")})
			} else {
				_, err = keyadmin.Release(ctx, b.store, change)
			}
			require.ErrorIs(t, err, tc.wantErr)

			rows := b.audit(t)
			require.Len(t, rows, 1, "one row per refused attempt: %+v", rows)
			row := rows[0]
			require.Equal(t, keyadmin.OutcomeRefused, row.Outcome)
			require.Equal(t, err.Error(), row.Refusal, "the row says why, as the error does")
			require.Equal(t, tc.wantPrevious, row.PreviousState)
			require.Equal(t, "bob", row.Actor)
			require.Equal(t, "TICKET-8", row.Reason)
			require.Equal(t, tc.wantBodyHash, row.BodySHA256 != "", "a body hash where there is a body: %+v", row)
			if tc.stored {
				require.Equal(t, before, b.storedBody(t, "k1"), "nothing changed")
			}
		})
	}
}

// TestAuditRowCommitsWithTheChange: the change and its audit row commit
// together. When the audit row cannot be written, the key is not changed;
// when the change fails, no audit row says it was made. (Triggers make
// each write fail, on a database of the test's own.)
func TestAuditRowCommitsWithTheChange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, table, event string
	}{
		{"the audit row fails", "idempotency_keys_audit", "INSERT"},
		{"the change fails", "idempotency_keys", "UPDATE OR DELETE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, true)
			b.hold(t, "resolved", running, unknown)
			b.hold(t, "released", running, unknown)
			for _, q := range []string{
				`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$`,
				`CREATE TRIGGER refuse BEFORE ` + tc.event + ` ON ` + tc.table + ` FOR EACH ROW EXECUTE FUNCTION refuse()`,
			} {
				_, err := b.pool.Exec(ctx, q)
				require.NoError(t, err, q)
			}
			held := b.storedBody(t, "resolved")
			change := keyadmin.Change{Scope: b.scope, Key: "resolved", Actor: "carol", Reason: "TICKET-9"}
			_, err := keyadmin.Resolve(ctx, b.store, change, idempotency.Response{Status: http.StatusCreated, Body: []byte(`{}`)})
			require.ErrorContains(t, err, "refused by the test")
			change.Key = "released"
			_, err = keyadmin.Release(ctx, b.store, change)
			require.ErrorContains(t, err, "refused by the test")

			_, err = b.pool.Exec(ctx, `DROP TRIGGER refuse ON `+tc.table)
			require.NoError(t, err)
			require.Empty(t, b.audit(t), "no audit row of a change that was not made")
			require.Equal(t, held, b.storedBody(t, "resolved"), "no change without its audit row")
			info, err := keyadmin.Inspect(ctx, b.store, b.scope, "released")
			require.NoError(t, err, "no release without its audit row")
			require.Equal(t, "unknown", info.Status)
		})
	}
}

// TestAuditFilters: Audit lists the newest rows first, and keeps those of
// a scope, a scope prefix or suffix, a key, a time, up to a limit.
func TestAuditFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false)
	other := testBundle{pool: b.pool, store: b.store, scope: b.scope + "-other"}
	release := func(scope, key string) {
		t.Helper()
		_, err := keyadmin.Release(ctx, b.store, keyadmin.Change{Scope: scope, Key: key, Actor: "dave", Reason: "r"})
		require.ErrorIs(t, err, keyadmin.ErrKeyNotFound)
	}
	release(b.scope, "a")
	release(b.scope, "b")
	release(other.scope, "a")
	keys := func(f keyadmin.AuditFilter) []string {
		t.Helper()
		rows, err := keyadmin.Audit(ctx, b.store, f)
		require.NoError(t, err)
		var out []string
		for _, r := range rows {
			out = append(out, r.Scope[len(b.scope):]+"/"+r.Key)
		}
		return out
	}
	require.Equal(t, []string{"-other/a", "/b", "/a"}, keys(keyadmin.AuditFilter{ScopePrefix: b.scope}), "newest first")
	require.Equal(t, []string{"/b", "/a"}, keys(keyadmin.AuditFilter{Scope: b.scope}))
	require.Equal(t, []string{"-other/a"}, keys(keyadmin.AuditFilter{ScopeSuffix: other.scope[3:]}))
	require.Equal(t, []string{"-other/a", "/a"}, keys(keyadmin.AuditFilter{ScopePrefix: b.scope, Key: "a"}))
	require.Equal(t, []string{"-other/a"}, keys(keyadmin.AuditFilter{ScopePrefix: b.scope, Limit: 1}))
	require.Empty(t, keys(keyadmin.AuditFilter{ScopePrefix: b.scope, Since: time.Now().Add(time.Hour)}))
}

// TestChangesNameTheirActorAndReason: a change without an actor or a
// reason is refused before anything is read or written.
func TestChangesNameTheirActorAndReason(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	for _, c := range []keyadmin.Change{
		{Scope: b.scope, Key: "k", Reason: "r"},
		{Scope: b.scope, Key: "k", Actor: "erin", Reason: " "},
	} {
		_, err := keyadmin.Release(context.Background(), b.store, c)
		require.Error(t, err, "%+v", c)
		require.NotErrorIs(t, err, keyadmin.ErrKeyNotFound, "refused before the key is read")
	}
	require.Empty(t, b.audit(t))
}

// TestAuditOfAnotherTable: a key table of another name and a uuid scope
// column has its own audit trail, named after it, whose rows read back the
// scope as Inspect does (a UUID's 16 bytes).
func TestAuditOfAnotherTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := pgstoretest.Empty(t)
	opts := pgstore.Options{Table: "tenant_keys", Scope: pgstore.ScopeUUID}
	require.NoError(t, pgstore.Migrate(ctx, pool, opts))
	store, err := pgstore.New(pool, opts)
	require.NoError(t, err)
	scope := string([]byte{0x01, 0x9d, 0x2f, 0x4a, 0x5b, 0x6c, 0x7d, 0x8e, 0x9f, 0xa0, 0xb1, 0xc2, 0xd3, 0xe4, 0xf5, 0x06})
	b := testBundle{pool: pool, store: store, scope: scope}
	b.hold(t, "k1", running, unknown)

	_, err = keyadmin.Release(ctx, store, keyadmin.Change{Scope: scope, Key: "k1", Actor: "frank", Reason: "TICKET-10"})
	require.NoError(t, err)
	rows := b.audit(t)
	require.Len(t, rows, 1)
	require.Equal(t, scope, rows[0].Scope, "the scope as Inspect reads it")
	require.Equal(t, "unknown", rows[0].PreviousState)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM tenant_keys_audit`).Scan(&n))
	require.Equal(t, 1, n, "the row is in the table's own trail")
}
