package pgstore_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
	"github.com/oncekey/oncekey/idempotency/storetest"
)

// The database of these tests holds two key tables and what the suite
// writes through leases, nothing of any application's.
func TestMain(m *testing.M) {
	pgstoretest.Main(m, pgstoretest.Options{Migrate: func(ctx context.Context, pool *pgxpool.Pool) error {
		return pgstoretest.MigrateSuite(ctx, pool, keyTables...)
	}})
}

// renamedTable is a key table of another name, beside the default one.
const renamedTable = "other_keys"

// keyTables are the package's key tables: the default, one of another
// name, and one for each other scope type.
var keyTables = []pgstore.Options{
	{},
	{Table: renamedTable},
	{Table: "uuid_keys", Scope: pgstore.ScopeUUID},
	{Table: "text_keys", Scope: pgstore.ScopeText},
}

// TestConformance runs the store suite on the real database: the
// transactional store, the deferring one, and the store joined to the
// caller's own pgx and database/sql transactions, on the default key table,
// on one of another name, and on one whose scopes are uuid and one whose
// scopes are text. The transactional store's
// "ConcurrentClaimWaitsForHolder/holder does not end within the wait"
// case is the check that a claim's wait on an open holder transaction is
// bounded by lock_timeout.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, table := range keyTables {
		t.Run(cmp.Or(table.Table, pgstore.DefaultTable), func(t *testing.T) {
			t.Parallel()
			t.Run("transactional", func(t *testing.T) {
				t.Parallel()
				storetest.Run(t, pgstoretest.TxHarness(pgstoretest.Pool(t), table))
			})
			t.Run("deferred", func(t *testing.T) {
				t.Parallel()
				storetest.Run(t, pgstoretest.DeferredHarness(pgstoretest.Pool(t), table))
			})
			t.Run("joined pgx.Tx", func(t *testing.T) {
				t.Parallel()
				storetest.Run(t, pgstoretest.JoinedHarness(pgstoretest.Pool(t), table))
			})
			t.Run("joined sql.Tx", func(t *testing.T) {
				t.Parallel()
				storetest.Run(t, pgstoretest.JoinedSQLHarness(pgstoretest.Pool(t), table))
			})
		})
	}
}

// TestMigrate checks that replicas starting together may all migrate: the
// advisory lock makes one apply the schema and the others find it done,
// and that a table of another name gets the same layout.
func TestMigrate(t *testing.T) {
	t.Parallel()
	_, pool := pgstoretest.Empty(t)
	ctx := t.Context()
	const replicas = 3
	for _, table := range []string{"", "widget_keys"} {
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		for i := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = pgstore.Migrate(ctx, pool, pgstore.Options{Table: table})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "migration %d of %d concurrent ones of table %q", i+1, replicas, table)
		}
	}
	for _, table := range []string{"idempotency_keys", "widget_keys"} {
		rows, err := pool.Query(ctx, "SELECT version FROM "+table+"_schema_version ORDER BY version")
		require.NoError(t, err, "read %s's version table", table)
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err, "read %s's version table", table)
		require.Equal(t, []int{1, 2, 3, 4, 5}, versions, "versions applied to %s, each once", table)
		var guard bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT "+table+"_guard()").Scan(&guard), "%s's guard is named after it", table)
		require.False(t, guard, "%s's guard is false outside pgstore's statements", table)
		var audit bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table+"_audit").Scan(&audit))
		require.True(t, audit, "%s's audit trail is named after it", table)
		var pieces bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table+"_pieces").Scan(&pieces))
		require.True(t, pieces, "%s's pieces table is named after it", table)
	}
	require.Equal(t, tableLayout(t, pool, "idempotency_keys"), tableLayout(t, pool, "widget_keys"), "layout of the renamed table")
	require.Equal(t, tableLayout(t, pool, "idempotency_keys_pieces"), tableLayout(t, pool, "widget_keys_pieces"), "layout of the renamed table's pieces")

	_, err := pgstore.New(pool, pgstore.Options{Table: "Robert'); DROP TABLE students;--"})
	require.Error(t, err, "a table name that is no plain identifier")
}

// TestMigrateAdoptsGooseVersions: a key table that an earlier pgstore
// migrated with goose keeps its rows, its applied versions move to pgstore's
// own version table, and goose's table is dropped, so the engine has one.
func TestMigrateAdoptsGooseVersions(t *testing.T) {
	t.Parallel()
	_, pool := pgstoretest.Empty(t)
	ctx := t.Context()
	// What goose left: the table version 1 made, with a key in it, and
	// goose's version table in place of pgstore's.
	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{Table: "old_keys"}), "the first migration, to make the table")
	_, err := pool.Exec(ctx, `DROP TABLE old_keys_schema_version;
		CREATE TABLE old_keys_migrations (id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
		INSERT INTO old_keys_migrations (version_id, is_applied) VALUES (0, true), (1, true);
		INSERT INTO old_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, response_status, response_body, completed_at, expires_at)
		VALUES ('s', 'k', decode(repeat('ab', 32), 'hex'), 'POST', '/w', 'completed', 201, 'kept', now(), now() + interval '1 hour')`)
	require.NoError(t, err, "back to goose's state, with a key")

	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{Table: "old_keys"}), "migrate a goose-migrated table")
	var gooseLeft bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('old_keys_migrations') IS NOT NULL").Scan(&gooseLeft))
	require.False(t, gooseLeft, "goose's version table is dropped")
	var versions, keys int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM old_keys_schema_version WHERE version = 1").Scan(&versions))
	require.Equal(t, 1, versions, "version 1 recorded as applied")
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM old_keys WHERE response_body = 'kept'").Scan(&keys))
	require.Equal(t, 1, keys, "the key row survives")
	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{Table: "old_keys"}), "migrating again does nothing")
}

// TestMigrateRunsOnANewerTable: a key table that a newer pgstore migrated
// further (a version this one does not know, and the column it added) is
// left as it is, and this pgstore still stores and replays keys in it: an
// operator may roll a release back after its migrations ran.
func TestMigrateRunsOnANewerTable(t *testing.T) {
	t.Parallel()
	_, pool := pgstoretest.Empty(t)
	ctx := t.Context()
	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{}))
	var known int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version) FROM idempotency_keys_schema_version").Scan(&known))
	_, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE idempotency_keys ADD COLUMN from_a_newer_release text;
		INSERT INTO idempotency_keys_schema_version (version, name) VALUES (%d, 'from_a_newer_release')`, known+1))
	require.NoError(t, err, "migrate as a newer pgstore would")

	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{}), "migrate the newer table: a rollback")
	rows, err := pool.Query(ctx, "SELECT name FROM idempotency_keys_schema_version WHERE version > $1", known)
	require.NoError(t, err)
	newer, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"from_a_newer_release"}, newer, "the newer version stays recorded, and nothing else is applied")

	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	claim := idempotency.ClaimRequest{Scope: "rollback", Key: rand.Text(), Method: http.MethodPost, Route: "/rollback", TTL: time.Hour, Wait: time.Second}
	lease, rec, err := store.Claim(ctx, claim)
	require.NoError(t, err)
	require.Nil(t, rec, "a new key is claimed")
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte("stored")}))
	_, rec, err = store.Claim(ctx, claim)
	require.NoError(t, err)
	require.NotNil(t, rec, "the key is stored on the newer table")
	require.Equal(t, "stored", string(rec.Response.Body))
}

// tableLayout describes a table's columns, constraints and indexes with its
// own name taken out.
func tableLayout(t *testing.T, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `
		SELECT format('column %s %s %s %s', column_name, data_type, is_nullable, coalesce(column_default, ''))
		FROM information_schema.columns WHERE table_name = $1
		UNION ALL
		SELECT format('constraint %s %s', replace(conname, $1, 'T'), pg_get_constraintdef(oid))
		FROM pg_constraint WHERE conrelid = $1::regclass
		UNION ALL
		SELECT format('index %s', replace(indexdef, $1, 'T')) FROM pg_indexes WHERE tablename = $1
		ORDER BY 1`, table)
	require.NoError(t, err, "describe %s", table)
	layout, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err, "describe %s", table)
	return layout
}

// TestKeyStatsDoNotCountALargeTable checks that the statistics a metrics
// scrape reads do not count a large key table row by row, even when it was
// never analyzed (autovacuum off: PostgreSQL then knows no row estimate,
// reltuples = -1): the total comes from the statistics system's live-row
// count instead.
func TestKeyStatsDoNotCountALargeTable(t *testing.T) {
	t.Parallel()
	// Above the 100,000 below which the total is counted.
	const rows = 120_000
	// One session: the statistics of the one that runs KeyStats are flushed below.
	pool := oneSessionDatabase(t)
	ctx := t.Context()
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, "%s", sql)
	}
	// Makes this session report its statistics now rather than within
	// the second: at the end of the statement after this one.
	flushStats := func() {
		t.Helper()
		exec("SELECT pg_stat_force_next_flush()")
		exec("SELECT 1")
	}
	exec("ALTER TABLE idempotency_keys SET (autovacuum_enabled = false)")
	exec(fmt.Sprintf(`INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route,
		status, response_status, response_headers, response_body, completed_at, expires_at)
		SELECT uuid_send(gen_random_uuid()), g::text, sha256(g::text::bytea), 'POST', '/orders',
		       'completed', 201, '{}', '\x7b7d', now(), now() + interval '1 hour'
		FROM generate_series(1, %d) g`, rows))
	flushStats()
	var reltuples float64
	require.NoError(t, pool.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = 'idempotency_keys'::regclass").Scan(&reltuples), "reltuples")
	require.Equal(t, float64(-1), reltuples, "the table was never analyzed")
	tuplesRead := func() (read, live int64) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0), n_live_tup
			FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'`).Scan(&read, &live), "table statistics")
		return read, live
	}
	before, live := tuplesRead()
	require.EqualValues(t, rows, live, "live rows in the statistics system")

	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err, "open the store")
	stats, err := store.KeyStats(ctx)
	require.NoError(t, err, "key statistics")
	flushStats()
	after, _ := tuplesRead()
	require.EqualValues(t, rows, stats.Completed, "completed keys")
	require.Less(t, after-before, int64(rows/10), "rows of the key table read to compute its statistics")
}

// oneSessionDatabase creates a migrated database of the test's own and
// returns a pool of one connection on it, for tests that look at what a
// session keeps (its prepared statements, its statistics), and drops it
// when the test ends.
func oneSessionDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	dbURL, _ := pgstoretest.Fresh(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err, "parse %s", dbURL)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err, "pool")
	t.Cleanup(pool.Close) // registered after the drop, so it runs before
	return pool
}

// TestTranslate: every failure that means "the database cannot serve this
// now, and nothing was done" is idempotency.ErrUnavailable, so that every
// caller answers 503 with Retry-After and a retry with the same key; a
// failure of the request itself is not.
func TestTranslate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code        string
		why         string
		unavailable bool
	}{
		{"25006", "read-only: a standby, or a full disk's protection mode", true},
		{"53300", "too many connections", true},
		{"53100", "disk full", true},
		{"57014", "statement timeout", true},
		{"55P03", "lock timeout on the operation's own rows", true},
		{"40001", "serialization failure", true},
		{"40P01", "deadlock", true},
		{"57P01", "administrator shutdown", true},
		{"08006", "connection failure", true},
		{"23505", "unique violation: the request's own", false},
		{"22003", "numeric value out of range: the request's own", false},
		{"42P01", "undefined table: a bug", false},
	} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			err := pgstore.Translate(fmt.Errorf("a statement: %w", &pgconn.PgError{Code: tc.code}))
			require.Equal(t, tc.unavailable, errors.Is(err, idempotency.ErrUnavailable), "%s (%s)", tc.code, tc.why)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, "the driver's error stays in the chain for the log")
		})
	}
}

// TestGuardIsTheClaimsOwn checks that the guard relation a pipeline sends
// a deferred write with holds a row only for the key row of its very
// claim. xmin, the inserting transaction's id, is 32 bits and comes round
// again after about four billion transactions, so a key row left by an
// older transaction can carry this transaction's xid; no test can wait for
// that, so the row here is one that this very transaction inserted for the
// key, at another time than the claim's.
func TestGuardIsTheClaimsOwn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgstoretest.Pool(t)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err, "open the store")
	scope, key, claimedAt := "guard-"+rand.Text(), rand.Text(), time.Now().Truncate(time.Microsecond)
	guard := pgstore.Guarded(store, "SELECT "+store.Guard(), 0)

	for _, tc := range []struct {
		name      string
		createdAt time.Time
		holds     bool
	}{
		{"the claim's own row", claimedAt, true},
		{"a row of the key from another time", claimedAt.Add(-time.Hour), false},
	} {
		var holds bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, created_at, expires_at)
				VALUES ($1, $2, sha256('x'), 'POST', '/widgets', 'processing', $3, $3::timestamptz + interval '1 hour')`,
				[]byte(scope), key, tc.createdAt); err != nil {
				return fmt.Errorf("insert the key row: %w", err)
			}
			if err := tx.QueryRow(ctx, guard, []byte(scope), key, claimedAt).Scan(&holds); err != nil {
				return fmt.Errorf("evaluate the guard: %w", err)
			}
			return errRollBack
		})
		require.ErrorIs(t, err, errRollBack, "%s", tc.name)
		require.Equal(t, tc.holds, holds, "%s: the guard holds", tc.name)
	}
	var outside bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT "+store.Guard()).Scan(&outside), "the guard's function")
	require.False(t, outside, "the guard is false outside pgstore's statements")
}

// TestClaimAtCommitRefusesWhatItCannotGuard: ClaimAtCommit refuses, when the
// operation is bound, a write that pgstore could not send with its guard;
// and a Batch refuses a statement ClaimAtCommit did not take, so that the
// lease's Commit fails with that error and writes nothing, even when the
// operation ignored the error of its Exec.
func TestClaimAtCommitRefusesWhatItCannotGuard(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, err := pgstore.New(pgstoretest.Pool(t), pgstore.Options{})
	require.NoError(t, err)
	for _, tc := range []struct{ name, sql, why string }{
		{"a SELECT", "SELECT idempotency_keys_guard()", "starts with something else"},
		{"a WITH before the write", "WITH v AS (SELECT 1) INSERT INTO writes (id, scope) SELECT 'a', 'b' FROM v WHERE idempotency_keys_guard()", "starts with something else"},
		{"a semicolon", "INSERT INTO writes (id, scope) SELECT $1, $2 WHERE idempotency_keys_guard();", "semicolon"},
		{"no guard", "INSERT INTO writes (id, scope) VALUES ($1, $2)", "does not call the guard"},
		{"the guard's relation", "INSERT INTO writes (id, scope) SELECT $1, $2 WHERE idempotency_keys_guard() AND EXISTS (SELECT FROM idempotency_keys_claimed)", "pgstore's own"},
		{"pgstore's names", "INSERT INTO writes AS pgstore_claim (id, scope) SELECT $1, $2 WHERE idempotency_keys_guard()", "pgstore_"},
	} {
		_, err := store.ClaimAtCommit(pgstoretest.GuardedWrite(store), tc.sql)
		require.ErrorContains(t, err, tc.why, tc.name)
		require.ErrorContains(t, err, store.Guard(), "%s: the error names the guard", tc.name)
	}

	deferred, err := store.ClaimAtCommit(pgstoretest.GuardedWrite(store))
	require.NoError(t, err)
	req := idempotency.ClaimRequest{Scope: "refused-" + rand.Text(), Key: rand.Text(), Method: "POST", Route: "/r", TTL: time.Hour, Wait: time.Second}
	lease, _, err := deferred.Claim(ctx, req)
	require.NoError(t, err)
	_, err = lease.Unit().Exec(ctx, "INSERT INTO writes (id, scope) VALUES ($1, $2)", rand.Text(), []byte(req.Scope))
	require.ErrorContains(t, err, "ClaimAtCommit did not take", "an undeclared statement")
	err = lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}})
	require.ErrorContains(t, err, "ClaimAtCommit did not take", "the commit fails with the refusal")
	var keys, rows int
	require.NoError(t, pgstoretest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM idempotency_keys WHERE scope = $1", []byte(req.Scope)).Scan(&keys))
	require.NoError(t, pgstoretest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM writes WHERE scope = $1", []byte(req.Scope)).Scan(&rows))
	require.Zero(t, keys+rows, "nothing sent")
}

// errRollBack ends a pgx.BeginFunc in a rollback.
var errRollBack = errors.New("roll back")

// TestPartitionNamesAreQuoted checks the operator's statements, which run
// partition by partition, on a key table whose partitions have names that
// are no plain identifiers, one of them in another schema: the names come
// from the catalog and go into SQL quoted.
func TestPartitionNamesAreQuoted(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, pool := pgstoretest.Empty(t)
	const table = "quoted_keys"
	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{Table: table}), "migrate")
	for _, sql := range []string{
		`ALTER TABLE quoted_keys RENAME TO quoted_keys_plain`,
		`CREATE TABLE quoted_keys (LIKE quoted_keys_plain INCLUDING ALL) PARTITION BY HASH (scope)`,
		`DROP TABLE quoted_keys_plain`,
		`CREATE TABLE "Keys ""0""; DROP TABLE quoted_keys; --" PARTITION OF quoted_keys FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
		`CREATE SCHEMA "odd schema"`,
		`CREATE TABLE "odd schema"."keys 1" PARTITION OF quoted_keys FOR VALUES WITH (MODULUS 2, REMAINDER 1)`,
		// Expired, processing for an hour, and fresh keys, in both partitions.
		`INSERT INTO quoted_keys (scope, idempotency_key, fingerprint, request_method, request_route, status,
		                          response_status, response_body, created_at, completed_at, expires_at)
		 SELECT uuid_send(gen_random_uuid()), g::text, sha256(g::text::bytea), 'POST', '/widgets', s.status,
		        CASE WHEN s.status = 'completed' THEN 201 END, CASE WHEN s.status = 'completed' THEN '\x7b7d'::bytea END,
		        now() - interval '1 hour', CASE WHEN s.status = 'completed' THEN now() END,
		        CASE WHEN g % 3 = 2 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
		 FROM generate_series(1, 30) g, LATERAL (SELECT CASE WHEN g % 3 = 1 THEN 'processing' ELSE 'completed' END AS status) s`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, "%s", sql)
	}
	var parts []int
	rows, err := pool.Query(ctx, `SELECT count(*) FROM quoted_keys GROUP BY tableoid ORDER BY tableoid`)
	require.NoError(t, err, "rows per partition")
	parts, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err, "rows per partition")
	require.Len(t, parts, 2, "partitions holding keys")

	store, err := pgstore.New(pool, pgstore.Options{Table: table})
	require.NoError(t, err, "open the store")
	stats, err := store.KeyStats(ctx)
	require.NoError(t, err, "key statistics")
	require.Equal(t, int64(10), stats.Processing, "processing keys")
	require.Equal(t, int64(20), stats.Completed, "completed keys")
	stuck, err := keyadmin.Stuck(ctx, store, time.Minute, 100)
	require.NoError(t, err, "stuck keys")
	require.Len(t, stuck, 10, "keys processing for an hour")
	expired, err := keyadmin.CountExpired(ctx, store)
	require.NoError(t, err, "count expired keys")
	require.Equal(t, int64(10), expired, "expired keys")
	purged, err := store.PurgeExpired(ctx, 3)
	require.NoError(t, err, "purge")
	require.Equal(t, int64(10), purged, "keys purged")
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM quoted_keys").Scan(&left), "count keys left")
	require.Equal(t, 20, left, "keys left")
}

// TestNotMigrated: a store on a database that Migrate never ran on, or ran
// on with fewer versions than this pgstore has, fails its first claim,
// transactional, deferred or joined, with ErrNotMigrated, which names the
// table and what to run, instead of an error about a missing relation on
// every request. Once migrated, the same store claims.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, pool := pgstoretest.Empty(t)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err, "New does not touch the database")
	req := idempotency.ClaimRequest{Scope: "s", Key: "k", Method: "POST", Route: "/r", TTL: time.Hour, Wait: time.Second}

	_, _, err = store.Claim(ctx, req)
	require.ErrorIs(t, err, pgstore.ErrNotMigrated)
	require.ErrorContains(t, err, "run pgstore.Migrate")
	require.ErrorContains(t, err, "idempotency_keys_schema_version does not exist")
	deferred, err := store.ClaimAtCommit()
	require.NoError(t, err)
	_, _, err = deferred.Claim(ctx, req)
	require.ErrorIs(t, err, pgstore.ErrNotMigrated, "deferred")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, _, err = store.Join(ctx, tx, req)
	require.ErrorIs(t, err, pgstore.ErrNotMigrated, "joined")
	require.NoError(t, tx.Rollback(ctx))

	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{}))
	_, err = pool.Exec(ctx, "DELETE FROM idempotency_keys_schema_version WHERE version = (SELECT max(version) FROM idempotency_keys_schema_version)")
	require.NoError(t, err)
	_, _, err = store.Claim(ctx, req)
	require.ErrorIs(t, err, pgstore.ErrNotMigrated, "one version behind")
	require.ErrorContains(t, err, "this pgstore needs")

	require.NoError(t, pgstore.Migrate(ctx, pool, pgstore.Options{}))
	lease, rec, err := store.Claim(ctx, req)
	require.NoError(t, err, "migrated")
	require.Nil(t, rec)
	require.NoError(t, lease.Rollback(ctx))
}

// TestTableNames: a key table's name goes into pgstore's statements
// unquoted, so only a plain lower-case identifier short enough for its
// suffixes is taken.
func TestTableNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"widget_keys", true}, {"_keys2", true}, {strings.Repeat("k", 48), true},
		{strings.Repeat("k", 49), false}, {"2keys", false}, {"Keys", false}, {"keys; DROP TABLE x", false}, {`"keys"`, false}, {"clés", false},
	} {
		_, err := pgstore.New(nil, pgstore.Options{Table: tc.name})
		require.Equal(t, tc.ok, err == nil, "%q: %v", tc.name, err)
	}
}

// TestScopeTypes checks what a key table's scope type promises: Migrate
// creates the column of that type, and its pieces table's; a scope the
// column cannot hold is refused before anything is sent; a UUID's 16 bytes and its text form
// name one key, which the operator reads back as the 16 bytes; and a store
// or a migration whose Options.Scope is not the table's fails with
// ErrScopeType rather than on every statement.
func TestScopeTypes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgstoretest.Pool(t)
	for _, o := range keyTables {
		for _, table := range []string{cmp.Or(o.Table, pgstore.DefaultTable), cmp.Or(o.Table, pgstore.DefaultTable) + "_pieces"} {
			var have string
			require.NoError(t, pool.QueryRow(ctx, `SELECT format_type(atttypid, NULL) FROM pg_attribute
				WHERE attrelid = to_regclass($1) AND attname = 'scope'`, table).Scan(&have))
			require.Equal(t, string(cmp.Or(o.Scope, pgstore.ScopeBytea)), have, "the scope column of %s", table)
		}
	}

	uuids, err := pgstore.New(pool, pgstore.Options{Table: "uuid_keys", Scope: pgstore.ScopeUUID})
	require.NoError(t, err)
	var id [16]byte
	_, _ = rand.Read(id[:])
	text := strings.ToUpper(fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16]))
	req := idempotency.ClaimRequest{Scope: string(id[:]), Key: rand.Text(), Method: "POST", Route: "/r", TTL: time.Hour, Wait: time.Second}
	lease, _, err := uuids.Claim(ctx, req)
	require.NoError(t, err, "a UUID's bytes")
	require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Body: []byte("first")}))
	byText := req
	byText.Scope = text
	_, rec, err := uuids.Claim(ctx, byText)
	require.NoError(t, err, "the UUID's text form")
	require.NotNil(t, rec, "the text form names the key the bytes claimed")
	require.Equal(t, "first", string(rec.Response.Body))
	info, err := keyadmin.Inspect(ctx, uuids, text, req.Key)
	require.NoError(t, err)
	require.Equal(t, string(id[:]), info.Scope, "read back as the UUID's bytes")
	var keys int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM uuid_keys WHERE scope = $1::uuid", text).Scan(&keys))
	require.Equal(t, 1, keys, "one row for both forms")

	texts, err := pgstore.New(pool, pgstore.Options{Table: "text_keys", Scope: pgstore.ScopeText})
	require.NoError(t, err)
	for _, tc := range []struct {
		store *pgstore.Store
		scope string
	}{
		{uuids, "not-a-uuid"}, {uuids, text[:35] + "g"}, {uuids, string(id[:15])},
		{texts, "\xff\xfe"}, {texts, "a\x00b"},
	} {
		_, _, err := tc.store.Claim(ctx, idempotency.ClaimRequest{Scope: tc.scope, Key: "k", Method: "POST", Route: "/r", TTL: time.Hour, Wait: time.Second})
		require.ErrorContains(t, err, "the key table's scopes are", "scope %q", tc.scope)
		var pgErr *pgconn.PgError
		require.False(t, errors.As(err, &pgErr), "refused before anything is sent: %v", err)
	}

	bytea, err := pgstore.New(pool, pgstore.Options{Table: "uuid_keys"})
	require.NoError(t, err)
	_, _, err = bytea.Claim(ctx, req)
	require.ErrorIs(t, err, pgstore.ErrScopeType, "a bytea store on a uuid table")
	require.ErrorContains(t, err, "uuid_keys.scope is uuid, Options.Scope says bytea")
	require.ErrorIs(t, pgstore.Migrate(ctx, pool, pgstore.Options{Table: "text_keys", Scope: pgstore.ScopeUUID}), pgstore.ErrScopeType,
		"Migrate does not change a table's scope type")
	_, err = pgstore.New(pool, pgstore.Options{Scope: "int8"})
	require.ErrorContains(t, err, "none of bytea, uuid and text")
}
