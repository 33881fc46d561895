-- The scope column is bytea here; a key table may hold it as uuid or text
-- instead (pgstore.Options.Scope). The statements spell the scope's casts
-- in three ways of their own, each a no-op on bytea, which pgstore rewrites
-- for the other types (see scopeSQL in pgstore):
--   CAST(@scope AS bytea)         a scope as the column holds it
--   CAST(@scopes AS bytea[])      scopes as pgstore sends them
--   <scope>::bytea AS scope       a scope read back
-- Every other cast is written with ::.
--
-- Every statement whose commit the protocol answers on (a claim with its
-- outcome, a hold, a piece of its body, its settle or release) makes its
-- own transaction's commit durable, whatever the session's or the server's
-- default:
--   set_config('synchronous_commit', CASE current_setting(...) ...)
-- raises synchronous_commit to on (a commit waits for its WAL flush, and
-- for a synchronous standby where one is configured) and keeps
-- remote_apply, which is stronger. With off, a commit is acknowledged
-- before it is on disk, and a crash of PostgreSQL in the next few hundred
-- milliseconds forgets it: a key held and then forgotten runs again
-- (TestDurableCommits, TestGatewayHoldsSurviveAPostgreSQLCrash).
--
-- A held record (response_status 102, see idempotency.Held) is kept on the
-- database's clock, so that processes whose clocks disagree agree on when
-- its lease ends: each statement that stores a response sets a running
-- hold's "until" to statement_timestamp() plus its "lease_ns" (a record
-- of status 102 without it is stored as it is), and each
-- that reads a record returns now() as read_at, which the engine compares
-- that "until" with (idempotency.Record.ReadAt).
--
-- A record whose body is in pieces (response_pieces above zero) is stored
-- with response_status 102 too, and a held record of state "not-stored"
-- as its body, with its real status in it (see pgstore's stored.go): a
-- release that knows no pieces, running on this table after a rollback,
-- answers its key "ran, response not stored" rather than replay its empty
-- body. It is no held record: every statement here that takes status 102
-- for a held record asks that response_pieces be NULL as well.

-- name: IdempotencyKeyClaim :many
-- Claim-or-read in one statement. The INSERT either claims the key (one row,
-- claimed = true) or meets an existing row and does nothing, in which case the
-- second branch reads that row (claimed = false). If a concurrent transaction
-- holds an uncommitted row for the key, the INSERT waits for it (bounded by
-- lock_timeout); if it then committed, the read branch's snapshot, taken at
-- statement start, cannot see it and the statement returns no rows: the
-- caller reads again.
WITH claimed AS (
    INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status, expires_at)
    VALUES (CAST(@scope AS bytea), @idempotency_key, @fingerprint, @request_method, @request_route, 'processing',
            now() + make_interval(secs => @ttl_seconds::float8))
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING fingerprint, status, response_status, response_headers, response_body, response_pieces, response_size, created_at, completed_at, expires_at
)
SELECT true AS claimed, false AS expired, c.fingerprint, c.status, c.response_status, c.response_headers, c.response_body, c.response_pieces, c.response_size, c.created_at, c.completed_at, c.expires_at, now()::timestamptz AS read_at
FROM claimed c
UNION ALL
SELECT false AS claimed, k.expires_at <= now() AS expired, k.fingerprint, k.status, k.response_status, k.response_headers, k.response_body, k.response_pieces, k.response_size, k.created_at, k.completed_at, k.expires_at, now()::timestamptz AS read_at
FROM idempotency_keys k
WHERE k.scope = CAST(@scope AS bytea) AND k.idempotency_key = @idempotency_key
  AND NOT EXISTS (SELECT 1 FROM claimed);

-- name: IdempotencyKeyComplete :execrows
-- A running hold's "until" is set on the database's clock (see the top).
UPDATE idempotency_keys
SET status = 'completed',
    response_status = @response_status,
    response_headers = @response_headers,
    response_body = CASE WHEN @response_status::int = 102 THEN coalesce((
        SELECT convert_to(jsonb_set(h, '{until}', to_jsonb(statement_timestamp() + (h->>'lease_ns')::bigint / 1000 * interval '1 microsecond'))::text, 'UTF8')
        FROM (SELECT convert_from(@response_body::bytea, 'UTF8')::jsonb) AS held (h)), @response_body::bytea) ELSE @response_body::bytea END,
    completed_at = now()
WHERE scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key AND status = 'processing';

-- name: IdempotencyKeyCompletePieces :execrows
-- IdempotencyKeyComplete of a response whose body is in pieces, written
-- in the claim's own transaction (IdempotencyKeyWriteClaimPiece): stored
-- as its count and size with response_status 102 and the body that
-- pgstore gives it (see the top), so that the record and its pieces
-- commit together or not at all.
UPDATE idempotency_keys
SET status = 'completed',
    response_status = 102,
    response_headers = @response_headers,
    response_body = @response_body,
    response_pieces = @response_pieces::int,
    response_size = @response_size::bigint,
    completed_at = now()
WHERE scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key AND status = 'processing';

-- name: IdempotencyKeyWriteClaimPiece :exec
-- Stores piece n of the body of the response that a claim will commit
-- (see idempotency.Lease.WritePiece), in the claim's own transaction,
-- replacing a piece n written before: it commits with the claim's record
-- (IdempotencyKeyCompletePieces) or not at all, and no other transaction
-- sees it before.
INSERT INTO idempotency_keys_pieces (scope, idempotency_key, key_created_at, n, data)
VALUES (CAST(@scope AS bytea), @idempotency_key, @key_created_at, @n::int, @data::bytea)
ON CONFLICT (scope, idempotency_key, key_created_at, n) DO UPDATE SET data = EXCLUDED.data;

-- name: IdempotencyKeyDeleteIfExpired :execrows
-- Frees one expired key so it can be claimed again at once, before cleanup
-- reaches it: an expired key is treated as absent.
DELETE FROM idempotency_keys
WHERE scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key AND expires_at <= now();

-- name: IdempotencyKeyPurgeExpired :execrows
-- Deletes at most batch_size expired keys, oldest first. SKIP LOCKED lets
-- several cleaners (or a cleaner and a claim) run without waiting on each
-- other; the caller loops until a batch comes back short. It runs
-- unprepared (see replanned), planned for the table as it is at each run:
-- the generic plan that a prepared statement settles on while the table is
-- small hashes the batch and scans the whole table, and it is kept as the
-- table grows.
DELETE FROM idempotency_keys k
USING (
    SELECT scope, idempotency_key
    FROM idempotency_keys
    WHERE expires_at <= now()
    ORDER BY expires_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
) expired
WHERE k.scope = expired.scope AND k.idempotency_key = expired.idempotency_key;

-- name: IdempotencyKeyStats :one
-- Cheap enough to run on every metrics scrape: the row count is exact for
-- small tables and PostgreSQL's estimate for large ones; the other figures
-- use the expires_at index and the partial index on processing rows. It
-- runs unprepared (see replanned): a plan kept from a run on a small table
-- would go on scanning the table for the count as it grows. The estimate is
-- the planner's (reltuples) once the table has been analyzed, and until
-- then (reltuples = -1: never, where autovacuum is off) the statistics
-- system's live-row count, so that a large table never analyzed is not
-- counted row by row on every scrape (TestKeyStatsDoNotCountALargeTable).
-- key_table names the table (or the partition) the statement reads, as a
-- quoted identifier.
SELECT
    (SELECT count(*) FROM idempotency_keys WHERE status = 'processing')::bigint AS processing,
    (CASE WHEN e.rows < 100000 THEN (SELECT count(*) FROM idempotency_keys)
          ELSE e.rows END)::bigint AS total,
    pg_total_relation_size(c.oid)::bigint AS table_bytes,
    coalesce(extract(epoch FROM now() - (SELECT min(created_at) FROM idempotency_keys WHERE status = 'processing')), 0)::float8 AS oldest_processing_age_seconds,
    coalesce(extract(epoch FROM now() - (SELECT min(expires_at) FROM idempotency_keys WHERE expires_at <= now())), 0)::float8 AS cleanup_lag_seconds,
    h.held_running, h.held_unknown
FROM pg_catalog.pg_class c
CROSS JOIN LATERAL (
    -- Held records, through their partial index: running until their
    -- lease's end, of unknown outcome after it (see idempotency.Held).
    SELECT count(*) FILTER (WHERE r.held->>'state' = 'running' AND (r.held->>'until')::timestamptz > now())::bigint AS held_running,
           count(*) FILTER (WHERE r.held->>'state' = 'unknown' OR (r.held->>'state' = 'running' AND (r.held->>'until')::timestamptz <= now()))::bigint AS held_unknown
    FROM (SELECT convert_from(response_body, 'UTF8')::jsonb AS held FROM idempotency_keys
          WHERE response_status = 102 AND response_pieces IS NULL AND status = 'completed' AND expires_at > now()) r
) h
CROSS JOIN LATERAL (
    SELECT (CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint
                 ELSE pg_catalog.pg_stat_get_live_tuples(c.oid) END)::bigint AS rows
) e
WHERE c.oid = to_regclass(@key_table::text);

-- name: IdempotencyKeyGet :one
SELECT scope::bytea AS scope, idempotency_key, fingerprint, request_method, request_route, status,
       response_status, response_headers, response_body, response_pieces, response_size, created_at, completed_at, expires_at, now()::timestamptz AS read_at
FROM idempotency_keys
WHERE scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key;

-- name: IdempotencyKeyListStuck :many
-- Keys in 'processing' for longer than the given age, oldest first.
SELECT scope::bytea AS scope, idempotency_key, request_method, request_route, created_at
FROM idempotency_keys
WHERE status = 'processing' AND created_at < now() - make_interval(secs => @older_than_seconds::float8)
ORDER BY created_at
LIMIT @max_rows;

-- name: IdempotencyKeyCountExpired :one
SELECT count(*) FROM idempotency_keys WHERE expires_at <= now();

-- name: IdempotencyKeyReplaceProvisional :execrows
-- Replaces a provisional response with what became of its operation: a
-- long operation's 202 with its final response once it finished, or a
-- held record (102: an operation that runs outside the key's transaction,
-- such as a gateway's upstream call) once its outcome is known.
-- created_at pins the very key row the operation was accepted under (its
-- claim's Ref); a row that was purged, or reused after it expired, is left
-- alone, and so is a row whose response is not of provisional_status, or
-- is in pieces (stored as 102, see the top: settled already).
-- Its commit is made durable (the subquery, evaluated before a row is
-- written): the outcome it stores is what every retry replays.
-- A body in pieces (response_pieces > 0, written by
-- IdempotencyKeyWritePiece while the record was held) is stored as its
-- count and size, NULL for none, with response_status 102 and the body
-- that pgstore gives it (see the top); the pieces the new response does
-- not have (n >= response_pieces, all of them for a body kept in the
-- record) are deleted in the same statement, only when the record was
-- replaced.
-- It reports the rows replaced (0 or 1), as the UPDATE would.
WITH replaced AS (
    UPDATE idempotency_keys k
    SET response_status = @response_status,
        response_headers = @response_headers,
        response_body = @response_body,
        response_pieces = nullif(@response_pieces::int, 0),
        response_size = CASE WHEN @response_pieces::int > 0 THEN @response_size::bigint END,
        completed_at = now()
    WHERE k.scope = CAST(@scope AS bytea) AND k.idempotency_key = @idempotency_key AND k.created_at = @key_created_at
      AND k.status = 'completed' AND k.response_status = @provisional_status::int AND k.response_pieces IS NULL
      AND (SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true)) IS NOT NULL
    RETURNING k.scope, k.idempotency_key, k.created_at
), dropped AS (
    DELETE FROM idempotency_keys_pieces p
    USING replaced r
    WHERE p.scope = r.scope AND p.idempotency_key = r.idempotency_key AND p.key_created_at = r.created_at
      AND p.n >= @response_pieces::int
)
SELECT 1 FROM replaced;

-- name: IdempotencyKeyReplaceAccepted :execrows
-- IdempotencyKeyReplaceProvisional for a long operation's 202, which never
-- has pieces (only a held record gets them, IdempotencyKeyWritePiece): the
-- UPDATE alone, without the statement around it that deletes pieces, so
-- that its generic plan, like every statement of the service's request
-- path, reads one partition of a key table partitioned by scope
-- (TestPartitionedSchema).
UPDATE idempotency_keys
SET response_status = @response_status,
    response_headers = @response_headers,
    response_body = @response_body,
    completed_at = now()
WHERE scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key AND created_at = @key_created_at
  AND status = 'completed' AND response_status = 202 AND response_pieces IS NULL
  AND (SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true)) IS NOT NULL;

-- name: IdempotencyKeyRelease :execrows
-- Deletes a held record under the claim it was held under, freeing the key,
-- and the pieces written for it, in the same statement; never a record
-- settled with its body in pieces (102 too, see the top). Its commit is
-- made durable, as IdempotencyKeyReplaceProvisional's. It reports the records
-- deleted (0 or 1), as the DELETE would.
WITH released AS (
    DELETE FROM idempotency_keys k
    WHERE k.scope = CAST(@scope AS bytea) AND k.idempotency_key = @idempotency_key AND k.created_at = @key_created_at
      AND k.status = 'completed' AND k.response_status = 102 AND k.response_pieces IS NULL
      AND (SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true)) IS NOT NULL
    RETURNING k.scope, k.idempotency_key, k.created_at
), dropped AS (
    DELETE FROM idempotency_keys_pieces p
    USING released r
    WHERE p.scope = r.scope AND p.idempotency_key = r.idempotency_key AND p.key_created_at = r.created_at
)
SELECT 1 FROM released;

-- name: IdempotencyKeyWritePiece :execrows
-- Stores piece n of the body of the held record under its claim (see
-- idempotency.Store.WritePiece), replacing a piece n written before, and
-- reports 0, writing nothing, when that record is gone or no longer held.
-- The record's row is locked (FOR SHARE) until the piece commits, so
-- that a settle or release of the record waits for the piece, and a piece
-- that waited for one finds the record settled, or gone, and writes
-- nothing: no piece is ever written beside a record that is not held.
-- Its commit is made durable, as IdempotencyKeyReplaceProvisional's: a
-- piece acknowledged is on disk, whatever synchronous_commit the session
-- or the server has (TestDurableCommits).
INSERT INTO idempotency_keys_pieces (scope, idempotency_key, key_created_at, n, data)
SELECT k.scope, k.idempotency_key, k.created_at, @n::int, @data::bytea
FROM idempotency_keys k
WHERE k.scope = CAST(@scope AS bytea) AND k.idempotency_key = @idempotency_key AND k.created_at = @key_created_at
  AND k.status = 'completed' AND k.response_status = 102 AND k.response_pieces IS NULL
  AND (SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true)) IS NOT NULL
FOR SHARE OF k
ON CONFLICT (scope, idempotency_key, key_created_at, n) DO UPDATE SET data = EXCLUDED.data;

-- name: IdempotencyKeyRenewHold :execrows
-- Extends a running hold under its claim by its lease from now, on the
-- database's clock (see the top): the holder of an operation whose body
-- is still being stored says so by writing its first piece again
-- (idempotency.Store.WritePiece), so that a stream or a large body that
-- passes for longer than the lease is not taken for an operation whose
-- holder died. A hold of another state, or settled, is left as it is.
UPDATE idempotency_keys k
SET response_body = convert_to(jsonb_set(h.h, '{until}', to_jsonb(statement_timestamp() + (h.h->>'lease_ns')::bigint / 1000 * interval '1 microsecond'))::text, 'UTF8')
FROM (SELECT convert_from(response_body, 'UTF8')::jsonb AS h
      FROM idempotency_keys
      WHERE scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key AND created_at = @key_created_at
        AND status = 'completed' AND response_status = 102 AND response_pieces IS NULL) AS h
WHERE k.scope = CAST(@scope AS bytea) AND k.idempotency_key = @idempotency_key AND k.created_at = @key_created_at
  AND k.status = 'completed' AND k.response_status = 102 AND k.response_pieces IS NULL
  AND h.h->>'state' = 'running' AND (h.h->>'lease_ns') IS NOT NULL;

-- name: IdempotencyKeyReadPiece :one
-- Piece n of the body of the record under its claim: while the record is
-- held (its pieces being written: 102, response_pieces NULL), or once it
-- is settled with more than n pieces (102 too, see the top). A piece left
-- beside a record that is gone or was settled with fewer (until the purge
-- sweeps it) is not read.
SELECT p.data
FROM idempotency_keys_pieces p
JOIN idempotency_keys k ON k.scope = p.scope AND k.idempotency_key = p.idempotency_key AND k.created_at = p.key_created_at
WHERE p.scope = CAST(@scope AS bytea) AND p.idempotency_key = @idempotency_key AND p.key_created_at = @key_created_at AND p.n = @n::int
  AND k.response_status = 102 AND (k.response_pieces IS NULL OR p.n < k.response_pieces);

-- name: IdempotencyKeySweepPieces :execrows
-- Deletes at most batch_size pieces that no record needs, after the purge
-- of expired keys (pgstore.Store.PurgeExpired): those whose record (the
-- same scope, key and created_at) is gone (purged, freed when it expired,
-- released), or is neither held nor in pieces (status 102, with
-- response_pieces NULL or above n: see the top): settled with fewer, or
-- none, or by a release that does not know pieces. A held record's pieces
-- are never swept, nor a settled record's own until it is purged. The
-- caller loops until a batch comes back short; SKIP LOCKED passes over a
-- piece being written again.
-- It runs on the key table itself, never per partition: a partition's
-- statements are its name rewritten into the key table's, which would
-- rename this table too. Each piece's record is looked up by a LATERAL
-- subquery with LIMIT 1, which the planner cannot turn into a join: one
-- primary-key probe per piece, never a scan of the key table (see
-- IdempotencyKeyPeekMany). It reads the pieces table through, which is
-- cheap: the table holds few rows, each a large piece whose bytes are
-- stored apart (TOAST) and not read here. It runs unprepared (see
-- replanned).
DELETE FROM idempotency_keys_pieces p
USING (
    SELECT o.scope, o.idempotency_key, o.key_created_at, o.n
    FROM idempotency_keys_pieces o
    CROSS JOIN LATERAL (
        SELECT k.response_status, k.response_pieces
        FROM (VALUES (true)) AS one (row)
        LEFT JOIN idempotency_keys k ON k.scope = o.scope AND k.idempotency_key = o.idempotency_key AND k.created_at = o.key_created_at
        LIMIT 1
    ) k
    WHERE k.response_status IS DISTINCT FROM 102 OR k.response_pieces <= o.n
    LIMIT @batch_size
    FOR UPDATE OF o SKIP LOCKED
) orphan
WHERE p.scope = orphan.scope AND p.idempotency_key = orphan.idempotency_key AND p.key_created_at = orphan.key_created_at AND p.n = orphan.n;

-- name: IdempotencyKeyPiecesBytes :one
-- The pieces table's size for KeyStats (idempotency.Stats.PiecesBytes):
-- the table, its TOAST table, where the pieces' bytes are, and its
-- indexes, as IdempotencyKeyStats' table_bytes is for the key table; the
-- disk they take, which the pieces that cleanup deletes leave to new
-- pieces until a vacuum can give it back. It reads the catalog and the
-- files' sizes, never a row. It runs on the key table's name, never per
-- partition (see IdempotencyKeySweepPieces): the pieces table is one
-- table. 0 when the table does not exist.
SELECT coalesce(pg_total_relation_size(to_regclass('idempotency_keys_pieces')), 0)::bigint AS pieces_bytes;

-- name: IdempotencyKeyPeekMany :many
-- The first of a deferred commit's statements (write-only operations,
-- claimed at their commit, several requests' commits merged into one
-- pipeline: IdempotencyKeyPeekMany, IdempotencyKeyInsertCompletedMany, then
-- each operation's writes, guarded by its claim (see pgstore.Batch)),
-- which PostgreSQL runs as one implicit transaction. One row per key, in no
-- particular order: what holds the key, if anything, so that a replay is answered
-- in the same round trip as the attempt to claim. It also bounds the
-- statements after it as waitBudget does: each lock wait, and each
-- statement as a whole; and it makes the transaction's commit durable.
-- Each key is looked up by a LATERAL subquery with LIMIT 1, which the
-- planner cannot turn into a join: one primary-key probe per key in every
-- plan. As a plain join, the generic plan that the prepared statement
-- settles on while the table is small hashes the keys and scans the whole
-- table, and it is kept as the table grows: first requests slowed down
-- with every key stored (TestStatementsProbeTheIndex).
SELECT set_config('lock_timeout', @lock_timeout::text, true) AS lock_timeout,
       set_config('statement_timeout', @statement_timeout::text, true) AS statement_timeout,
       set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true) AS synchronous_commit,
       u.scope::bytea AS scope, u.idempotency_key::text AS idempotency_key,
       k.fingerprint, k.status, k.response_status, k.response_headers, k.response_body, k.response_pieces, k.response_size, k.created_at, k.expires_at,
       coalesce(k.expires_at <= now(), false)::boolean AS expired, now()::timestamptz AS read_at
FROM (SELECT unnest(CAST(@scopes AS bytea[])) AS scope, unnest(@idempotency_keys::text[]) AS idempotency_key) AS u
CROSS JOIN LATERAL (
    SELECT h.fingerprint, h.status, h.response_status, h.response_headers, h.response_body, h.response_pieces, h.response_size, h.created_at, h.expires_at
    FROM (VALUES (true)) AS one (row)
    LEFT JOIN idempotency_keys h ON h.scope = CAST(u.scope AS bytea) AND h.idempotency_key = u.idempotency_key
    LIMIT 1
) k;

-- name: IdempotencyKeyPeekScope :many
-- IdempotencyKeyPeekMany for a pipeline whose keys are all of one scope (a
-- lone commit, or a merge by scope): the scope is a parameter of its own,
-- so that on a key table partitioned by scope even the generic plan reads
-- one partition (an array of scopes prunes nothing before it runs). The
-- same columns, in the same order.
SELECT set_config('lock_timeout', @lock_timeout::text, true) AS lock_timeout,
       set_config('statement_timeout', @statement_timeout::text, true) AS statement_timeout,
       set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true) AS synchronous_commit,
       CAST(@scope AS bytea)::bytea AS scope, u.idempotency_key::text AS idempotency_key,
       k.fingerprint, k.status, k.response_status, k.response_headers, k.response_body, k.response_pieces, k.response_size, k.created_at, k.expires_at,
       coalesce(k.expires_at <= now(), false)::boolean AS expired, now()::timestamptz AS read_at
FROM unnest(@idempotency_keys::text[]) AS u (idempotency_key)
CROSS JOIN LATERAL (
    SELECT h.fingerprint, h.status, h.response_status, h.response_headers, h.response_body, h.response_pieces, h.response_size, h.created_at, h.expires_at
    FROM (VALUES (true)) AS one (row)
    LEFT JOIN idempotency_keys h ON h.scope = CAST(@scope AS bytea) AND h.idempotency_key = u.idempotency_key
    LIMIT 1
) k;

-- name: IdempotencyKeyInsertCompletedMany :many
-- Claims the keys and stores their outcomes at once, in the order given
-- (sorted by the caller, so that concurrent pipelines lock key rows in one
-- order; the arrays are unnested in step); returns the keys it claimed. A
-- key a row holds is not inserted, and its operation's writes, guarded by
-- the claim (see pgstore.Batch), do nothing either. An expired row is
-- not freed here (that would take a statement more on every first
-- request): the caller claims again in the transactional way, which frees
-- it.
-- A running hold's "until" is set on the database's clock (see the top),
-- and so is every key's expiry, as the transactional claim's: a process
-- whose clock is behind must not store a key already expired (a held
-- key lives at least as long as its lease). created_at is the claim's
-- time as its Ref names it, the process's.
INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status,
                              response_status, response_headers, response_body, created_at, completed_at, expires_at)
SELECT r.scope, r.idempotency_key, r.fingerprint, r.request_method, r.request_route, 'completed',
       r.response_status, r.response_headers,
       CASE WHEN r.response_status = 102 THEN coalesce((
           SELECT convert_to(jsonb_set(h, '{until}', to_jsonb(statement_timestamp() + (h->>'lease_ns')::bigint / 1000 * interval '1 microsecond'))::text, 'UTF8')
           FROM (SELECT convert_from(r.response_body, 'UTF8')::jsonb) AS held (h)), r.response_body) ELSE r.response_body END,
       r.created_at, now(), now() + make_interval(secs => r.ttl_seconds)
FROM (SELECT CAST(unnest(CAST(@scopes AS bytea[])) AS bytea) AS scope, unnest(@idempotency_keys::text[]) AS idempotency_key,
             unnest(@fingerprints::bytea[]) AS fingerprint, unnest(@request_methods::text[]) AS request_method,
             unnest(@request_routes::text[]) AS request_route, unnest(@response_statuses::integer[]) AS response_status,
             unnest(@response_headers::jsonb[]) AS response_headers, unnest(@response_bodies::bytea[]) AS response_body,
             unnest(@created_ats::timestamptz[]) AS created_at, unnest(@ttl_seconds::float8[]) AS ttl_seconds) AS r
ON CONFLICT (scope, idempotency_key) DO NOTHING
RETURNING scope::bytea AS scope, idempotency_key;

-- name: IdempotencyKeyClaimLone :one
-- A lone deferred commit of at most one write, in one statement rather
-- than a pipeline of three: the claim, the operation's write and the peek.
-- The CTE pgstore_write holds the operation's write, which pgstore puts in
-- its place at run time, as the application wrote it, with this
-- statement's own parameters numbered after the write's (see
-- pgstore.Store.Deferred). The write's guard relation,
-- idempotency_keys_claimed, is here the CTE that asks the claim itself:
-- the key row the claim inserts is invisible to the rest of the statement.
-- As written here it writes nothing. (The other CTEs are named pgstore_…,
-- which Deferred refuses in a write, so as not to hide a table the write
-- names.) The peek reads the statement's
-- snapshot, taken before the claim: what held the key, as
-- IdempotencyKeyPeekScope says; a running hold's "until" is set on the
-- database's clock (see the top). pgstore_budget sets the lock wait before
-- the claim's insert can wait, and makes the statement's commit durable. A statement timeout set here would come too
-- late (it is armed before a statement runs): pgstore bounds the statement
-- through its context instead (pgstore's loneSlack). The peek is
-- only read when the claim inserted nothing: a claimed key's answer needs
-- no peek, and the gate spares that primary-key probe.
WITH pgstore_budget AS (
    SELECT set_config('lock_timeout', @lock_timeout::text, true) AS lock_timeout,
           set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'remote_apply' THEN 'remote_apply' ELSE 'on' END, true) AS synchronous_commit
), pgstore_claim AS (
    INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, request_method, request_route, status,
                                  response_status, response_headers, response_body, created_at, completed_at, expires_at)
    SELECT CAST(@scope AS bytea), @idempotency_key::text, @fingerprint::bytea, @request_method::text, @request_route::text,
           'completed', @response_status::integer, @response_headers::jsonb,
           CASE WHEN @response_status::integer = 102 THEN coalesce((
               SELECT convert_to(jsonb_set(h, '{until}', to_jsonb(statement_timestamp() + (h->>'lease_ns')::bigint / 1000 * interval '1 microsecond'))::text, 'UTF8')
               FROM (SELECT convert_from(@response_body::bytea, 'UTF8')::jsonb) AS held (h)), @response_body::bytea) ELSE @response_body::bytea END,
           @created_at::timestamptz, now(), now() + make_interval(secs => @ttl_seconds::float8)
    FROM pgstore_budget
    ON CONFLICT (scope, idempotency_key) DO NOTHING
    RETURNING 1
), idempotency_keys_claimed AS (
    SELECT true AS claimed FROM pgstore_claim
), pgstore_write AS (
    SELECT 1
), pgstore_peek AS (
    SELECT fingerprint, status, response_status, response_headers, response_body, response_pieces, response_size, created_at, expires_at
    FROM idempotency_keys
    WHERE NOT EXISTS (SELECT 1 FROM pgstore_claim) AND scope = CAST(@scope AS bytea) AND idempotency_key = @idempotency_key::text
)
SELECT b.lock_timeout, h.fingerprint, h.status, h.response_status, h.response_headers, h.response_body,
       h.response_pieces, h.response_size, h.created_at, h.expires_at, coalesce(h.expires_at <= now(), false)::boolean AS expired,
       EXISTS (SELECT 1 FROM pgstore_claim) AS claimed, now()::timestamptz AS read_at
FROM pgstore_budget b
LEFT JOIN pgstore_peek h ON true;

-- name: IdempotencyKeyListUnknown :many
-- Held records of unknown outcome (see idempotency.Held), oldest first:
-- those marked unknown, and those still marked running whose lease has
-- ended, their holder presumed gone. The predicate is
-- IdempotencyKeyStats' held_unknown, so that the list is as long as the
-- count, and it reads the held records' partial index.
SELECT scope::bytea AS scope, idempotency_key, request_method, request_route, response_body, created_at, completed_at
FROM idempotency_keys
WHERE response_status = 102 AND response_pieces IS NULL AND status = 'completed' AND expires_at > now()
  AND (convert_from(response_body, 'UTF8')::jsonb->>'state' = 'unknown'
       OR (convert_from(response_body, 'UTF8')::jsonb->>'state' = 'running'
           AND (convert_from(response_body, 'UTF8')::jsonb->>'until')::timestamptz <= now()))
ORDER BY created_at;

-- name: IdempotencyKeyListScopes :many
-- The scopes under which a key is stored, for an operator who knows the
-- key but not its whole scope (a gateway's namespace). No index leads with
-- the key: this reads the whole table, so it is for operators' commands
-- only.
SELECT scope::bytea AS scope
FROM idempotency_keys
WHERE idempotency_key = @idempotency_key
ORDER BY scope
LIMIT @max_rows;
