package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// TestUpgradeFromMain: a database that Oncekey's main migrated and served,
// before the key table moved to pgstore's own migrations, is upgraded at
// start. Every key it holds still replays its response, nothing runs twice,
// and the engine is left with one version table.
//
// testdata/upgrade was made at commit 0afa431: `oncekey serve` on an empty
// database, eight orders and four bonus credits posted with the keys and
// bodies in requests.json, then `pg_dump --inserts --no-owner
// --no-privileges` (psql's \restrict lines taken out).
func TestUpgradeFromMain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL, pool := testdb.Empty(t)
	dump, err := os.ReadFile("testdata/upgrade/main-0afa431.sql")
	require.NoError(t, err)
	var fixture struct {
		APIKey   string `json:"api_key"`
		Requests []struct {
			Path     string          `json:"path"`
			Key      string          `json:"key"`
			Body     json.RawMessage `json:"body"`
			Status   int             `json:"status"`
			Response string          `json:"response"`
		} `json:"requests"`
	}
	raw, err := os.ReadFile("testdata/upgrade/requests.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &fixture))
	require.NotEmpty(t, fixture.Requests)

	// The dump sets its session's search_path to nothing: a connection of
	// its own, closed after.
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, string(dump))
	require.NoError(t, err, "restore the database of main")
	require.NoError(t, conn.Close(ctx))
	// The dump's keys expired 48 hours after it was made (2026-12-07
	// 09:33 UTC), and then every replay below ran its operation again:
	// they are given the same 48 hours from now, as if main had just
	// stored them.
	_, err = pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() + (expires_at - created_at)`)
	require.NoError(t, err, "the dump's keys, unexpired")
	counts := func() (orders, credits, keys int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM bonus_entries),
			(SELECT count(*) FROM idempotency_keys)`).Scan(&orders, &credits, &keys))
		return orders, credits, keys
	}
	orders, credits, keys := counts()

	addr, shutdown := startServe(t, map[string]string{"DATABASE_URL": dbURL, "ONCEKEY_DEMO_API_KEY": fixture.APIKey})
	t.Cleanup(func() { _ = shutdown() })
	for _, r := range fixture.Requests {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+r.Path, bytes.NewReader(r.Body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+fixture.APIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", r.Key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err, "POST %s %s", r.Path, r.Key)
		var body bytes.Buffer
		_, err = body.ReadFrom(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, r.Status, resp.StatusCode, "POST %s %s: %s", r.Path, r.Key, body.String())
		require.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "POST %s %s is a replay", r.Path, r.Key)
		require.Equal(t, r.Response, body.String(), "POST %s %s replays main's response byte for byte", r.Path, r.Key)
	}
	gotOrders, gotCredits, gotKeys := counts()
	require.Equal(t, []int{orders, credits, keys}, []int{gotOrders, gotCredits, gotKeys}, "orders, credits and keys after the replays")

	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'idempotency_keys_%' ORDER BY 1`)
	require.NoError(t, err)
	versionTables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_keys_audit", "idempotency_keys_pieces", "idempotency_keys_schema_version"}, versionTables, "the engine's tables beside the key table: its audit trail, the pieces of large answers and one version table")

	_, fresh := testdb.Fresh(t)
	require.Equal(t, keyTableLayout(t, fresh), keyTableLayout(t, pool), "the key table of a new database and of an upgraded one")
}

// keyTableLayout describes the key table's columns, constraints and indexes.
func keyTableLayout(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `
		SELECT format('column %s %s %s %s', column_name, data_type, is_nullable, coalesce(column_default, ''))
		FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'idempotency_keys'
		UNION ALL
		SELECT format('constraint %s', pg_get_constraintdef(oid)) FROM pg_constraint WHERE conrelid = 'idempotency_keys'::regclass
		UNION ALL
		SELECT format('index %s', indexdef) FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'idempotency_keys'
		ORDER BY 1`)
	require.NoError(t, err)
	layout, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return layout
}
