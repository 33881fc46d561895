-- The guard of writes claimed at commit (pgstore.Store.Guard): a write that
-- Store.ClaimAtCommit takes calls this function in its WHERE clause to make
-- no change unless its own claim inserted the key row. pgstore replaces
-- each call, as it sends the write, with a test of that claim; outside
-- pgstore's statements the function is false, so a guarded write run
-- anywhere else changes nothing. It is a function, not a relation, so that
-- the application's SQL names pgstore's public guard and none of its
-- relations; the application's SQL tools (sqlc) read it here.
--
-- Created or replaced by every Migrate, with no version of its own (see
-- migrate.go's functions), so that the previous release, which refuses a
-- key table at a version it does not know, still runs on this one. The
-- view of the earlier guard (0002) stays, for the previous release's
-- writes.
CREATE OR REPLACE FUNCTION idempotency_keys_guard() RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT false';
