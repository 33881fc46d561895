package pgstore_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// commitProbe records, at the commit of every transaction that writes a
// key row or a piece of a body, the synchronous_commit that commit runs
// with: a deferred constraint trigger fires at commit, just before the
// commit record is written, with the transaction's settings still in
// force.
const commitProbe = `
CREATE TABLE commit_settings (idempotency_key text NOT NULL, op text NOT NULL, setting text NOT NULL);
CREATE FUNCTION record_commit_setting() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO commit_settings VALUES (coalesce(NEW.idempotency_key, OLD.idempotency_key), TG_OP, current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER record_commit_setting AFTER INSERT OR UPDATE OR DELETE ON idempotency_keys
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION record_commit_setting();
CREATE CONSTRAINT TRIGGER record_commit_setting AFTER INSERT OR UPDATE OR DELETE ON idempotency_keys_pieces
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION record_commit_setting()`

// TestDurableCommits: every commit the protocol answers on runs with
// synchronous_commit on, whatever the session says (here through the
// connection's own setting, as a server or database default would): the
// claim with its outcome of every path (a lone deferred commit, lone
// statements in one pipeline, a merged pipeline, a pipeline of one, the
// transactional claim, the contended deferred one, a claim joined to the
// caller's transaction), a hold, its settle and its release, a piece of a
// held record's body written and written again (Store.WritePiece, each
// piece acknowledged as it passes), and a provisional response replaced in
// the caller's transaction. remote_apply,
// stronger, is kept. A write of the key table's own, outside pgstore,
// commits with the session's setting: the probe reads what the commit
// runs with. (The crash test, cmd/oncekey's
// TestGatewayHoldsSurviveAPostgreSQLCrash, is the proof that it matters.)
func TestDurableCommits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ session, want string }{
		{"off", "on"},
		{"local", "on"},
		{"remote_apply", "remote_apply"},
	} {
		t.Run("session "+tc.session, func(t *testing.T) {
			t.Parallel()
			dbURL, admin := pgstoretest.Fresh(t)
			_, err := admin.Exec(t.Context(), commitProbe)
			require.NoError(t, err, "create the probe")
			cfg, err := pgxpool.ParseConfig(dbURL)
			require.NoError(t, err)
			cfg.MaxConns = 4
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = tc.session
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			require.NoError(t, err, "open a pool")
			t.Cleanup(pool.Close) // registered after the drop, so it runs before

			want := map[string]string{}
			for path, commit := range durablePaths(t, pool) {
				commit()
				want[path] = tc.want
			}
			var direct string
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT idempotency_key FROM idempotency_keys WHERE starts_with(idempotency_key, 'lone-')").Scan(&direct))
			_, err = pool.Exec(t.Context(), "UPDATE idempotency_keys SET expires_at = expires_at WHERE idempotency_key = $1", direct)
			require.NoError(t, err, "a write outside pgstore")
			require.Equal(t, []string{tc.session}, commitSettings(t, admin, direct, "UPDATE"),
				"a write outside pgstore commits with the session's setting")
			for path, setting := range want {
				name, op := pathOp(path)
				got := commitSettings(t, admin, name+"-", op)
				require.NotEmpty(t, got, "%s: no %s commit recorded", name, op)
				for _, g := range got {
					require.Equal(t, setting, g, "%s: the %s commit's synchronous_commit", name, op)
				}
			}
		})
	}
}

// pathOp splits a durable path's name, "key prefix/operation".
func pathOp(path string) (prefix, op string) {
	for i := range path {
		if path[i] == '/' {
			return path[:i], path[i+1:]
		}
	}
	return path, "INSERT"
}

// commitSettings is the synchronous_commit of each recorded commit of op
// on the keys that start with prefix, sorted.
func commitSettings(t *testing.T, admin *pgxpool.Pool, prefix, op string) []string {
	t.Helper()
	rows, err := admin.Query(t.Context(), "SELECT setting FROM commit_settings WHERE starts_with(idempotency_key, $1) AND op = $2", prefix, op)
	require.NoError(t, err)
	settings, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	sort.Strings(settings)
	return settings
}

// durablePaths are the commits that pgstore answers on, by "key
// prefix/operation" (INSERT when none is said): each commits its keys,
// which start with the prefix, on pool.
func durablePaths(t *testing.T, pool *pgxpool.Pool) map[string]func() {
	t.Helper()
	ctx := t.Context()
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	b := newGroupBundle(t, pool, pgstore.Options{})
	created := idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte(`{"id":"w"}`)}
	request := func(key string) idempotency.ClaimRequest {
		return b.request("", key+"-"+rand.Text(), 5*time.Second)
	}
	// hold commits a held record on the deferred store, as the gateway
	// does, and returns its claim.
	hold := func(key string) idempotency.Ref {
		lease, _, err := b.deferred.Claim(ctx, request(key))
		require.NoError(t, err, "claim %s", key)
		require.NoError(t, lease.Commit(ctx, idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}.Response()), "hold %s", key)
		return lease.Ref()
	}
	merged := func(prefix string, members []member) {
		g := newGroupBundle(t, pool, pgstore.Options{})
		g.holdBack()
		for i, res := range g.run(t, members) {
			require.NoError(t, res.err, "%s member %d", prefix, i)
		}
		require.Equal(t, []int{len(members)}, g.sent(), "%s: the members went as one pipeline", prefix)
	}
	return map[string]func(){
		"lone": func() {
			require.NoError(t, b.attempt(member{key: "lone-" + rand.Text()}).err)
		},
		"lones": func() {
			merged("lones", []member{{key: "lones-" + rand.Text()}, {key: "lones-" + rand.Text()}, {key: "lones-" + rand.Text()}})
		},
		"merged": func() {
			var members []member
			for range pgstore.MaxLoneMembers + 2 {
				// Of scopes of their own: the claims read many scopes.
				members = append(members, member{scope: "merged-" + rand.Text(), key: "merged-" + rand.Text()})
			}
			merged("merged", members)
		},
		"pipeline": func() {
			// Two writes do not fit a lone statement: a pipeline of one.
			lease, _, err := b.deferred.Claim(ctx, request("pipeline"))
			require.NoError(t, err)
			for range 2 {
				_, err := lease.Unit().Exec(ctx, b.writeN, rand.Text(), []byte(lease.Ref().Scope), 1)
				require.NoError(t, err)
			}
			require.NoError(t, lease.Commit(ctx, created))
		},
		"tx": func() {
			lease, _, err := store.Claim(ctx, request("tx"))
			require.NoError(t, err)
			require.NoError(t, lease.Commit(ctx, created))
		},
		"contended": func() {
			req := request("contended")
			req.AtOnce = true
			lease, _, err := b.deferred.Claim(ctx, req)
			require.NoError(t, err)
			require.NoError(t, lease.Commit(ctx, created))
		},
		"joined": func() {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			lease, _, err := store.Join(ctx, tx, request("joined"))
			require.NoError(t, err)
			require.NoError(t, lease.Commit(ctx, created))
			require.NoError(t, tx.Commit(ctx))
		},
		"hold": func() { hold("hold") },
		"settle/UPDATE": func() {
			settled, err := store.Settle(ctx, hold("settle"), created)
			require.NoError(t, err)
			require.True(t, settled)
		},
		"piece": func() {
			// The hold's key row and the piece, both INSERTs of keys
			// "piece-…".
			written, err := store.WritePiece(ctx, hold("piece"), 0, []byte("piece"))
			require.NoError(t, err)
			require.True(t, written)
		},
		"rewritten/UPDATE": func() {
			ref := hold("rewritten")
			for range 2 { // the second replaces the first: an UPDATE
				written, err := store.WritePiece(ctx, ref, 0, []byte("piece"))
				require.NoError(t, err)
				require.True(t, written)
			}
		},
		"release/DELETE": func() {
			released, err := store.Release(ctx, hold("release"))
			require.NoError(t, err)
			require.True(t, released)
		},
		"replace/UPDATE": func() {
			lease, _, err := store.Claim(ctx, request("replace"))
			require.NoError(t, err)
			require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: http.StatusAccepted, Header: http.Header{}, Body: []byte(`{}`)}))
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				replaced, err := store.ReplaceProvisional(ctx, tx, lease.Ref(), created)
				require.True(t, replaced)
				return err
			}))
		},
	}
}
