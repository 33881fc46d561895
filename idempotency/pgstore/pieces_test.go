package pgstore_test

import (
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/keyadmin"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// pieceScope is a new scope that a key table of scope type t holds: a
// UUID's 16 bytes for uuid, text otherwise.
func pieceScope(t pgstore.ScopeType) string {
	if t == pgstore.ScopeUUID {
		var id [16]byte
		_, _ = rand.Read(id[:])
		return string(id[:])
	}
	return "pieces-" + rand.Text()
}

// pieceRequest is a claim of a new key in scope.
func pieceRequest(scope string) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{
		Scope: scope, Key: rand.Text(), Fingerprint: sha256.Sum256([]byte("GET /large")),
		Method: http.MethodGet, Route: "/large", TTL: time.Hour, Wait: 5 * time.Second,
	}
}

// holdKey claims req's key on store and commits a held record, running,
// as a gateway does before it streams a large answer, and returns its
// claim.
func holdKey(t *testing.T, store *pgstore.Store, req idempotency.ClaimRequest) idempotency.Ref {
	t.Helper()
	lease, rec, err := store.Claim(t.Context(), req)
	require.NoError(t, err, "claim %s", req.Key)
	require.Nil(t, rec, "a new key")
	require.NoError(t, lease.Commit(t.Context(), idempotency.Held{State: idempotency.HeldRunning, Until: time.Now().Add(time.Minute)}.Response()), "hold %s", req.Key)
	return lease.Ref()
}

// storedPieces is every piece stored for key in the pieces table of
// table, by number, whatever record it belongs to.
func storedPieces(t *testing.T, pool *pgxpool.Pool, table, key string) map[int]string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT n, data FROM "+table+"_pieces WHERE idempotency_key = $1", key)
	require.NoError(t, err, "read %s_pieces", table)
	out := map[int]string{}
	var n int
	var data []byte
	_, err = pgx.ForEachRow(rows, []any{&n, &data}, func() error {
		out[n] = string(data)
		return nil
	})
	require.NoError(t, err, "read %s_pieces", table)
	return out
}

// writePieces writes pieces 0, 1, … of ref's body, each of which must be
// stored.
func writePieces(t *testing.T, store *pgstore.Store, ref idempotency.Ref, pieces ...string) {
	t.Helper()
	for n, p := range pieces {
		ok, err := store.WritePiece(t.Context(), ref, n, []byte(p))
		require.NoError(t, err, "write piece %d", n)
		require.True(t, ok, "piece %d of a held record is stored", n)
	}
}

// readPieces reads pieces 0 to n-1 of ref's body, nil for a missing one.
func readPieces(t *testing.T, store *pgstore.Store, ref idempotency.Ref, n int) []any {
	t.Helper()
	out := make([]any, n)
	for i := range n {
		p, err := store.ReadPiece(t.Context(), ref, i)
		require.NoError(t, err, "read piece %d", i)
		if p != nil {
			out[i] = string(p)
		}
	}
	return out
}

// TestPieces checks what pgstore promises of a body stored in pieces, on
// each of the package's key tables (another name, uuid and text scopes):
// a held record's pieces are written, replaced and read; a record settled
// with fewer pieces than were written (or none) loses the rest, in the
// settle's statement; a released record takes its pieces with it; and no
// piece is written beside a record that is not held, or under another
// claim of its key.
func TestPieces(t *testing.T) {
	t.Parallel()
	pool := pgstoretest.Pool(t)
	for _, opts := range keyTables {
		table := cmp.Or(opts.Table, pgstore.DefaultTable)
		t.Run(table, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			store, err := pgstore.New(pool, opts)
			require.NoError(t, err)
			hold := func() idempotency.Ref { return holdKey(t, store, pieceRequest(pieceScope(opts.Scope))) }

			t.Run("write, replace, read", func(t *testing.T) {
				ref := hold()
				writePieces(t, store, ref, "zero", "one")
				require.Equal(t, []any{"zero", "one", nil}, readPieces(t, store, ref, 3), "pieces of a held record, and none beyond")
				ok, err := store.WritePiece(ctx, ref, 1, []byte("one again"))
				require.NoError(t, err)
				require.True(t, ok, "a piece written again")
				ok, err = store.WritePiece(ctx, ref, 2, nil)
				require.NoError(t, err)
				require.True(t, ok, "an empty piece")
				require.Equal(t, []any{"zero", "one again", ""}, readPieces(t, store, ref, 3), "the piece written again replaced itself; the empty one is a piece")
				require.Len(t, storedPieces(t, pool, table, ref.Key), 3, "one row per piece")

				other := ref
				other.ClaimedAt = ref.ClaimedAt.Add(time.Microsecond)
				p, err := store.ReadPiece(ctx, other, 0)
				require.NoError(t, err)
				require.Nil(t, p, "another claim of the key has no pieces")
				ok, err = store.WritePiece(ctx, other, 0, []byte("x"))
				require.NoError(t, err)
				require.False(t, ok, "no piece under another claim of the key")
				ok, err = store.WritePiece(ctx, ref, -1, []byte("x"))
				require.NoError(t, err)
				require.False(t, ok, "no piece -1")
			})

			t.Run("settle with the pieces", func(t *testing.T) {
				req := pieceRequest(pieceScope(opts.Scope))
				ref := holdKey(t, store, req)
				writePieces(t, store, ref, "ab", "cd", "e")
				final := idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Pieces: 3, Size: 5}
				settled, err := store.Settle(ctx, ref, final)
				require.NoError(t, err)
				require.True(t, settled)
				_, rec, err := store.Claim(ctx, req)
				require.NoError(t, err)
				require.NotNil(t, rec, "the settled record")
				require.Equal(t, http.StatusCreated, rec.Response.Status, "the real status replayed, not the held one it is stored with")
				require.Equal(t, final.Header, rec.Response.Header, "headers replayed")
				require.Equal(t, 3, rec.Response.Pieces, "pieces replayed")
				require.Equal(t, int64(5), rec.Response.Size, "size replayed")
				require.Empty(t, rec.Response.Body)
				require.Equal(t, []any{"ab", "cd", "e", nil}, readPieces(t, store, ref, 4), "a settled record's pieces")
				ok, err := store.WritePiece(ctx, ref, 3, []byte("late"))
				require.NoError(t, err)
				require.False(t, ok, "no piece once the record is settled")
				require.Len(t, storedPieces(t, pool, table, ref.Key), 3, "nothing written once settled")

				// Settled, it is no held record any more, though it is
				// stored with the held status (see the rollback below).
				settled, err = store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Body: []byte("again")})
				require.NoError(t, err)
				require.False(t, settled, "a record settled with its pieces is not settled again")
				released, err := store.Release(ctx, ref)
				require.NoError(t, err)
				require.False(t, released, "a record settled with its pieces is not released")
				_, err = pool.Exec(ctx, "INSERT INTO "+table+"_pieces SELECT scope, idempotency_key, key_created_at, 3, 'stray' FROM "+table+"_pieces WHERE idempotency_key = $1 AND n = 0", ref.Key)
				require.NoError(t, err, "a stray piece beyond the count")
				require.Equal(t, []any{"ab", "cd", "e", nil}, readPieces(t, store, ref, 4), "the pieces of a settled record, none beyond its count")
				_, rec, err = store.Claim(ctx, req)
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, rec.Response.Status, "the record as it was settled")

				// The rollback: a release that knows no pieces reads the
				// row's status and body as a record, and must find that
				// the operation ran and its response was not stored (its
				// 409), never an empty 201 to replay.
				var status int
				var body []byte
				require.NoError(t, pool.QueryRow(ctx, "SELECT response_status, response_body FROM "+table+" WHERE idempotency_key = $1", req.Key).Scan(&status, &body))
				held, ok := idempotency.ParseHeld(idempotency.Response{Status: status, Body: body}, time.Time{})
				require.True(t, ok, "a previous release reads a record in pieces as held: status %d, body %s", status, body)
				require.Equal(t, idempotency.HeldNotStored, held.State, "a previous release reads it as not stored: %s", body)
				require.Contains(t, held.Reason, "stored in pieces, which this release cannot replay", "why, for the people who read the 409")

				// A previous release's operator resolves it as it would
				// any response not stored, knowing no pieces: it is the
				// response in its record from then on, its count stale.
				_, err = pool.Exec(ctx, "UPDATE "+table+" SET response_status = 200, response_body = 'resolved' WHERE idempotency_key = $1", req.Key)
				require.NoError(t, err, "resolve as a previous release")
				_, rec, err = store.Claim(ctx, req)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, rec.Response.Status, "the status resolved")
				require.Equal(t, "resolved", string(rec.Response.Body), "the body resolved, in the record")
				require.Zero(t, rec.Response.Pieces, "no pieces: the count is stale")
				require.Equal(t, []any{nil}, readPieces(t, store, ref, 1), "no piece of a record resolved in its record")
			})

			t.Run("settle with fewer pieces", func(t *testing.T) {
				for _, keep := range []int{2, 0} {
					ref := hold()
					writePieces(t, store, ref, "a", "b", "c", "d")
					settled, err := store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: keep, Size: int64(keep)})
					require.NoError(t, err)
					require.True(t, settled)
					want := map[int]string{0: "a", 1: "b"}
					if keep == 0 {
						want = map[int]string{}
					}
					require.Equal(t, want, storedPieces(t, pool, table, ref.Key), "settled with %d pieces: the rest are deleted", keep)
					require.Equal(t, []any{want[0], want[1], nil, nil}[:keep], readPieces(t, store, ref, keep), "settled with %d pieces", keep)
				}
			})

			t.Run("release", func(t *testing.T) {
				ref := hold()
				writePieces(t, store, ref, "a", "b")
				released, err := store.Release(ctx, ref)
				require.NoError(t, err)
				require.True(t, released)
				require.Empty(t, storedPieces(t, pool, table, ref.Key), "a released record's pieces go with it")
				ok, err := store.WritePiece(ctx, ref, 2, []byte("c"))
				require.NoError(t, err)
				require.False(t, ok, "no piece once the record is released")
				require.Equal(t, []any{nil}, readPieces(t, store, ref, 1))
			})

			t.Run("not held", func(t *testing.T) {
				req := pieceRequest(pieceScope(opts.Scope))
				lease, _, err := store.Claim(ctx, req)
				require.NoError(t, err)
				require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("done")}))
				ok, err := store.WritePiece(ctx, lease.Ref(), 0, []byte("x"))
				require.NoError(t, err)
				require.False(t, ok, "no piece beside a record that holds an outcome")
				absent := idempotency.Ref{Scope: req.Scope, Key: rand.Text(), ClaimedAt: time.Now()}
				ok, err = store.WritePiece(ctx, absent, 0, []byte("x"))
				require.NoError(t, err)
				require.False(t, ok, "no piece beside no record")
				require.Empty(t, storedPieces(t, pool, table, req.Key))
				require.Empty(t, storedPieces(t, pool, table, absent.Key))
			})

			t.Run("commit in pieces", func(t *testing.T) {
				// An operation's large body, written through its lease in
				// the claim's transaction: nothing of it is seen before the
				// commit, all of it after.
				req := pieceRequest(pieceScope(opts.Scope))
				lease, _, err := store.Claim(ctx, req)
				require.NoError(t, err)
				require.NoError(t, lease.WritePiece(ctx, 1, []byte("abc")))
				require.NoError(t, lease.WritePiece(ctx, 2, []byte("dx")))
				require.NoError(t, lease.WritePiece(ctx, 2, []byte("de")), "a piece written again replaces itself")
				require.Empty(t, storedPieces(t, pool, table, req.Key), "no piece is seen before its claim commits")
				require.NoError(t, lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}}, Pieces: 3, Size: 5}))
				_, rec, err := store.Claim(ctx, req)
				require.NoError(t, err)
				require.Equal(t, http.StatusCreated, rec.Response.Status)
				require.Equal(t, 3, rec.Response.Pieces)
				require.EqualValues(t, 5, rec.Response.Size)
				require.Equal(t, []any{nil, "abc", "de", nil}, readPieces(t, store, lease.Ref(), 4), "the committed pieces, from 1")

				// Rolled back, a claim's pieces go with its writes.
				req = pieceRequest(pieceScope(opts.Scope))
				lease, _, err = store.Claim(ctx, req)
				require.NoError(t, err)
				require.NoError(t, lease.WritePiece(ctx, 1, []byte("gone")))
				require.NoError(t, lease.Rollback(ctx))
				require.Empty(t, storedPieces(t, pool, table, req.Key), "a rolled-back claim's pieces")
				require.ErrorContains(t, lease.WritePiece(ctx, 1, []byte("late")), "already committed or rolled back")
			})
		})
	}
}

// TestPiecesAreRead checks that every path that reads a record gives its
// real status and its pieces' count and size (the row holds the held
// status, for releases that know no pieces): the transactional claim, a
// claim joined to the caller's transaction, a deferred claim's lone
// statement and its pipeline, and the operator's Inspect; and that the
// operator's tools take it for the outcome it is: not of unknown outcome,
// neither resolved nor released.
func TestPiecesAreRead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgstoretest.Pool(t)
	b := newGroupBundle(t, pool, pgstore.Options{})
	req := b.request("", "pieces-"+rand.Text(), 5*time.Second)
	ref := holdKey(t, b.store, req)
	writePieces(t, b.store, ref, "0123", "45")
	settled, err := b.store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 2, Size: 6})
	require.NoError(t, err)
	require.True(t, settled)
	check := func(path string, rec *idempotency.Record) {
		t.Helper()
		require.NotNil(t, rec, "%s: the record", path)
		require.Equal(t, http.StatusOK, rec.Response.Status, path)
		require.Equal(t, 2, rec.Response.Pieces, "%s: pieces", path)
		require.Equal(t, int64(6), rec.Response.Size, "%s: size", path)
		require.Empty(t, rec.Response.Body, path)
	}

	_, rec, err := b.store.Claim(ctx, req)
	require.NoError(t, err)
	check("transactional", rec)

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, rec, err := b.store.Join(ctx, tx, req)
		require.NoError(t, err)
		check("joined", rec)
		return nil
	}))

	taken := func(path string, writes int) {
		t.Helper()
		lease, _, err := b.deferred.Claim(ctx, req)
		require.NoError(t, err)
		for range writes {
			_, err := lease.Unit().Exec(ctx, b.writeN, rand.Text(), []byte(req.Scope), 1)
			require.NoError(t, err)
		}
		err = lease.Commit(ctx, idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte("again")})
		var takenErr *idempotency.TakenError
		require.True(t, errors.As(err, &takenErr), "%s: the key is taken: %v", path, err)
		check(path, takenErr.Record)
	}
	taken("deferred, lone", 0)
	taken("deferred, pipeline", 2) // two writes do not fit a lone statement

	info, err := keyadmin.Inspect(ctx, b.store, req.Scope, req.Key)
	require.NoError(t, err)
	require.Equal(t, 2, info.ResponsePieces, "inspect: pieces")
	require.Equal(t, 6, info.ResponseBytes, "inspect: the body's size")
	require.Equal(t, http.StatusOK, info.ResponseStatus, "inspect: the real status")
	require.Equal(t, "completed", info.Status, "inspect: an outcome")
	require.Nil(t, info.Held, "inspect: not held")

	unknown, err := keyadmin.Unknown(ctx, b.store, keyadmin.UnknownFilter{ScopePrefix: req.Scope})
	require.NoError(t, err)
	require.Empty(t, unknown, "a record in pieces is of no unknown outcome")
	change := keyadmin.Change{Scope: req.Scope, Key: req.Key, Actor: "ops", Reason: "TICKET-59"}
	_, err = keyadmin.Resolve(ctx, b.store, change, idempotency.Response{Status: http.StatusAccepted, Header: http.Header{}, Body: []byte("by hand")})
	require.ErrorIs(t, err, keyadmin.ErrNotHeld, "a record in pieces holds an outcome: no resolve")
	require.ErrorContains(t, err, "status 200", "the refusal names the real status")
	_, err = keyadmin.Release(ctx, b.store, change)
	require.ErrorIs(t, err, keyadmin.ErrNotHeld, "a record in pieces holds an outcome: no release")
	_, rec, err = b.store.Claim(ctx, req)
	require.NoError(t, err)
	check("after the operator's attempts", rec)
	require.Equal(t, []any{"0123", "45"}, readPieces(t, b.store, ref, 2), "the pieces, after the operator's attempts")
}

// TestPiecesAreNoHeldRecord: KeyStats counts a record settled with its
// body in pieces neither held nor of unknown outcome, though its row has
// the held status (for releases that know no pieces), on a key table of
// the test's own.
func TestPiecesAreNoHeldRecord(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, pool := pgstoretest.Fresh(t)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	ref := holdKey(t, store, pieceRequest(pieceScope(pgstore.ScopeBytea)))
	writePieces(t, store, ref, "ab", "c")
	st, err := store.KeyStats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Held, "the record held while its pieces are written")
	settled, err := store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 2, Size: 3})
	require.NoError(t, err)
	require.True(t, settled)
	st, err = store.KeyStats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Held, "a record settled in pieces is not held")
	require.Zero(t, st.Unknown, "a record settled in pieces is of no unknown outcome")
	require.Equal(t, int64(1), st.Completed, "it is an outcome")
}

// TestKeyStatsSizeThePieces: KeyStats.PiecesBytes is the size of the
// key table's pieces table, its TOAST table (where large pieces' bytes
// are) and indexes included: above its empty size by at least the bytes of
// the pieces written, and back near it once cleanup has deleted them and a
// vacuum has given their space back. On a plain key table, one partitioned
// by scope (whose statements per partition cannot name the pieces table)
// and one of another name (whose pieces table is named after it).
func TestKeyStatsSizeThePieces(t *testing.T) {
	t.Parallel()
	const piece = 300 << 10 // random bytes, which do not compress
	for _, tc := range []struct {
		name  string
		table string
		setup []string // run on a migrated database before the store opens
	}{
		{name: "plain", table: pgstore.DefaultTable},
		{name: "partitioned", table: pgstore.DefaultTable, setup: []string{
			`ALTER TABLE idempotency_keys RENAME TO idempotency_keys_plain`,
			`CREATE TABLE idempotency_keys (LIKE idempotency_keys_plain INCLUDING ALL) PARTITION BY HASH (scope)`,
			`DROP TABLE idempotency_keys_plain`,
			`CREATE TABLE idempotency_keys_p0 PARTITION OF idempotency_keys FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
			`CREATE TABLE idempotency_keys_p1 PARTITION OF idempotency_keys FOR VALUES WITH (MODULUS 2, REMAINDER 1)`,
		}},
		{name: "renamed", table: "sized_keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			_, pool := pgstoretest.Empty(t) // the only pieces table: its size is the test's
			opts := pgstore.Options{Table: tc.table}
			require.NoError(t, pgstore.Migrate(ctx, pool, opts), "migrate")
			for _, sql := range tc.setup {
				_, err := pool.Exec(ctx, sql)
				require.NoError(t, err, "%s", sql)
			}
			store, err := pgstore.New(pool, opts)
			require.NoError(t, err)
			stats := func() idempotency.Stats {
				t.Helper()
				st, err := store.KeyStats(ctx)
				require.NoError(t, err, "key statistics")
				return st
			}
			empty := stats().PiecesBytes
			require.Positive(t, empty, "the empty pieces table's indexes take their first pages")

			ref := holdKey(t, store, pieceRequest(pieceScope(pgstore.ScopeBytea)))
			for n := range 3 {
				p := make([]byte, piece)
				_, _ = rand.Read(p)
				ok, err := store.WritePiece(ctx, ref, n, p)
				require.NoError(t, err, "write piece %d", n)
				require.True(t, ok, "piece %d of a held record is stored", n)
			}
			written := stats().PiecesBytes
			require.GreaterOrEqual(t, written, empty+3*piece, "the pieces table with 3 pieces of %d bytes (empty: %d bytes)", piece, empty)
			settled, err := store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 3, Size: 3 * piece})
			require.NoError(t, err)
			require.True(t, settled)

			_, err = pool.Exec(ctx, "UPDATE "+tc.table+" SET expires_at = now() - interval '1 minute' WHERE idempotency_key = $1", ref.Key)
			require.NoError(t, err, "expire the record")
			purged, err := store.PurgeExpired(ctx, 100)
			require.NoError(t, err, "purge")
			require.Equal(t, int64(1), purged, "the record purged")
			require.Empty(t, storedPieces(t, pool, tc.table, ref.Key), "its pieces swept")
			// What autovacuum does in production: the deleted pieces' space
			// is given back where it ends the files (all of it here). The
			// indexes keep their pages, and vacuum adds its maps of free
			// space and of visibility: a few pages.
			_, err = pool.Exec(ctx, "VACUUM "+tc.table+"_pieces")
			require.NoError(t, err, "vacuum the pieces table")
			require.Less(t, stats().PiecesBytes, empty+128<<10, "the pieces table after cleanup and vacuum, near its empty size of %d bytes (with the pieces: %d)", empty, written)
		})
	}
}

// orphanPieces counts the pieces of table's pieces table that no record
// needs: whose record (the same scope, key and claim time) is gone, or is
// neither held nor settled with more pieces than the piece's number (both
// of status 102: a held record has no count).
const orphanPieces = `SELECT count(*) FROM idempotency_keys_pieces p
	WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k
	                  WHERE k.scope = p.scope AND k.idempotency_key = p.idempotency_key AND k.created_at = p.key_created_at
	                    AND k.response_status = 102 AND (k.response_pieces IS NULL OR p.n < k.response_pieces))`

// TestPurgeLeavesNoOrphanPieces: the cleanup of 10,000 expired large
// records (each settled with two small pieces) leaves no orphan piece, nor
// those of records that expired held, nor pieces that a settle by a release
// that knows no pieces left beside its record; and it keeps every piece of
// the records that are not expired, held (running) or settled, but not a
// stray piece beyond a settled record's count. On a plain
// key table, and on one partitioned by scope, whose partitions' statements
// cannot name the pieces table.
func TestPurgeLeavesNoOrphanPieces(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		name := "plain"
		if partitioned {
			name = "partitioned"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			_, pool := pgstoretest.Fresh(t)
			if partitioned {
				for _, sql := range []string{
					`ALTER TABLE idempotency_keys RENAME TO idempotency_keys_plain`,
					`CREATE TABLE idempotency_keys (LIKE idempotency_keys_plain INCLUDING ALL) PARTITION BY HASH (scope)`,
					`DROP TABLE idempotency_keys_plain`,
					`CREATE TABLE idempotency_keys_p0 PARTITION OF idempotency_keys FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
					`CREATE TABLE idempotency_keys_p1 PARTITION OF idempotency_keys FOR VALUES WITH (MODULUS 2, REMAINDER 1)`,
				} {
					_, err := pool.Exec(ctx, sql)
					require.NoError(t, err, "%s", sql)
				}
			}
			store, err := pgstore.New(pool, pgstore.Options{})
			require.NoError(t, err)

			// 10,000 expired records settled with two pieces each, as a
			// settle leaves them, written directly: the store's own writes
			// are checked by TestPieces.
			const expired = 10000
			_, err = pool.Exec(ctx, `
				WITH k AS (
					INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status,
					                              response_status, response_headers, response_body, response_pieces, response_size,
					                              created_at, completed_at, expires_at)
					SELECT ('scope-' || g % 17)::bytea, 'expired-' || g, sha256(g::text::bytea), 'GET', '/large', 'completed',
					       102, '{}', '{"state":"not-stored","reason":"stored in pieces","status":200}', 2, 6,
					       now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 hour'
					FROM generate_series(1, $1::int) g
					RETURNING scope, idempotency_key, created_at
				)
				INSERT INTO idempotency_keys_pieces (scope, idempotency_key, key_created_at, n, data)
				SELECT k.scope, k.idempotency_key, k.created_at, n, 'abc'::bytea FROM k, generate_series(0, 1) n`, expired)
			require.NoError(t, err, "insert the expired records and their pieces")

			// Through the store: records that expire held and settled with
			// their pieces, one that a release that knows no pieces settled
			// (its pieces left beside it), and live ones, held and settled,
			// whose pieces stay.
			var expire []string
			for range 3 {
				ref := holdKey(t, store, pieceRequest(pieceScope(pgstore.ScopeBytea)))
				writePieces(t, store, ref, "held", "expired")
				expire = append(expire, ref.Key)
				ref = holdKey(t, store, pieceRequest(pieceScope(pgstore.ScopeBytea)))
				writePieces(t, store, ref, "settled", "expired")
				settled, err := store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 2, Size: 14})
				require.NoError(t, err)
				require.True(t, settled)
				expire = append(expire, ref.Key)
			}
			old := holdKey(t, store, pieceRequest(pieceScope(pgstore.ScopeBytea)))
			writePieces(t, store, old, "left", "beside")
			_, err = pool.Exec(ctx, `UPDATE idempotency_keys SET response_status = 200, response_body = 'old' WHERE idempotency_key = $1`, old.Key)
			require.NoError(t, err, "settle as a release that knows no pieces")
			live := map[string]int{}
			for range 3 {
				ref := holdKey(t, store, pieceRequest(pieceScope(pgstore.ScopeBytea)))
				writePieces(t, store, ref, "held", "live", "running")
				live[ref.Key] = 3
				ref = holdKey(t, store, pieceRequest(pieceScope(pgstore.ScopeBytea)))
				writePieces(t, store, ref, "settled", "live")
				settled, err := store.Settle(ctx, ref, idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Pieces: 2, Size: 11})
				require.NoError(t, err)
				require.True(t, settled)
				live[ref.Key] = 2
				_, err = pool.Exec(ctx, `INSERT INTO idempotency_keys_pieces SELECT scope, idempotency_key, key_created_at, 2, 'stray'
					FROM idempotency_keys_pieces WHERE idempotency_key = $1 AND n = 0`, ref.Key)
				require.NoError(t, err, "a stray piece beyond a live settled record's count")
			}
			_, err = pool.Exec(ctx, `UPDATE idempotency_keys SET expires_at = now() - interval '1 minute' WHERE idempotency_key = ANY ($1)`, expire)
			require.NoError(t, err, "expire the records made through the store")

			var before int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys_pieces").Scan(&before))
			require.Equal(t, 2*expired+2*len(expire)+2+3*3+3*3, before, "pieces before the cleanup")

			purged, err := store.PurgeExpired(ctx, 1000)
			require.NoError(t, err, "purge")
			require.Equal(t, int64(expired+len(expire)), purged, "records purged")

			var orphans int
			require.NoError(t, pool.QueryRow(ctx, orphanPieces).Scan(&orphans), "count orphan pieces")
			require.Zero(t, orphans, "orphan pieces after the cleanup")
			var left int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys_pieces").Scan(&left))
			require.Equal(t, 3*3+2*3, left, "pieces left: the live records', all of them")
			for key, n := range live {
				require.Len(t, storedPieces(t, pool, pgstore.DefaultTable, key), n, "the pieces of live record %s", key)
			}
		})
	}
}

// TestWritingTheHeadRenewsTheHold: writing piece 0 again (a holder whose
// body still passes) renews a running hold's lease on the database's
// clock; another piece does not, and neither is a hold renewed that is no
// longer running.
func TestWritingTheHeadRenewsTheHold(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, err := pgstore.New(pgstoretest.Pool(t), pgstore.Options{})
	require.NoError(t, err)
	hold := func(state string) (idempotency.Ref, idempotency.ClaimRequest) {
		req := pieceRequest(pieceScope(pgstore.ScopeBytea))
		lease, _, err := store.Claim(ctx, req)
		require.NoError(t, err)
		require.NoError(t, lease.Commit(ctx, idempotency.Held{State: state, Until: time.Now().Add(time.Minute), Lease: 2 * time.Second}.Response()))
		return lease.Ref(), req
	}
	until := func(req idempotency.ClaimRequest) time.Time {
		t.Helper()
		req.AtOnce = true
		_, rec, err := store.Claim(ctx, req)
		require.NoError(t, err)
		require.NotNil(t, rec)
		h, ok := idempotency.ParseHeld(rec.Response, time.Time{})
		require.True(t, ok)
		return h.Until
	}
	later := func(after time.Time) {
		// The database's clock moves on (statement_timestamp()).
		require.Eventually(t, func() bool {
			var now time.Time
			require.NoError(t, pgstoretest.Pool(t).QueryRow(ctx, "SELECT statement_timestamp()").Scan(&now))
			return now.After(after.Add(-2*time.Second + 10*time.Millisecond))
		}, 5*time.Second, 5*time.Millisecond)
	}

	ref, req := hold(idempotency.HeldRunning)
	before := until(req)
	later(before)
	ok, err := store.WritePiece(ctx, ref, 1, []byte("body"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, before, until(req), "another piece does not renew the hold")
	ok, err = store.WritePiece(ctx, ref, 0, []byte(`{"status":200}`))
	require.NoError(t, err)
	require.True(t, ok)
	require.True(t, until(req).After(before), "the head written again renews the hold")

	ref, req = hold(idempotency.HeldUnknown)
	before = until(req)
	later(before)
	_, err = store.WritePiece(ctx, ref, 0, []byte(`{"status":200}`))
	require.NoError(t, err)
	require.Equal(t, before, until(req), "a hold of unknown outcome is not renewed")
}
