-- One row per (scope, Idempotency-Key). A row is inserted as 'processing'
-- inside the transaction that runs the operation and is updated to
-- 'completed' with the exact response bytes in that same transaction, so no
-- other session ever sees a half-done operation: it sees nothing, or the
-- finished record. A write-only operation's row is inserted 'completed' at
-- its commit, in the statement that claims the key.
--
-- The scope (a tenant, an account) is opaque bytes chosen by the
-- application; every look-up is by (scope, key), the primary key, so a
-- deployment sharded by tenant can distribute the table by scope.
--
-- IF NOT EXISTS: an application that created this table in its own
-- migrations before adopting pgstore keeps it as it is.
--
-- Migrate applies each file of this directory once, in order of its number,
-- in a transaction of its own; files are never edited once released.
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope            bytea       NOT NULL CHECK (length(scope) <= 255),
    idempotency_key  text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint      bytea       NOT NULL CHECK (length(fingerprint) = 32),
    request_method   text        NOT NULL,
    request_route    text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('processing', 'completed')),
    response_status  integer,
    -- Allow-listed response headers; their order carries no meaning, so jsonb is fine here.
    response_headers jsonb,
    -- The exact response body bytes: bytea, never jsonb, which would reorder keys.
    response_body    bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (scope, idempotency_key),
    CHECK (status = 'processing' OR (response_status IS NOT NULL AND response_body IS NOT NULL AND completed_at IS NOT NULL))
);
-- Cleanup deletes expired keys in bounded batches in expires_at order.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
-- Operators watch keys stuck in 'processing'; this partial index keeps that
-- look-up cheap however large the table grows, since almost every row is
-- 'completed'.
CREATE INDEX IF NOT EXISTS idempotency_keys_processing_idx ON idempotency_keys (created_at) WHERE status = 'processing';
