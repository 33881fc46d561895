-- The operators' audit trail: one row per attempt to settle (resolve) or
-- free (release) a held key by hand (package keyadmin). A change and its
-- row commit in one transaction, so the table lists every change that was
-- made and none that was not; an attempt that was refused (no such key, a
-- key that holds an outcome, one still running on its holder) has a row of
-- its own, written after the refusal.
--
-- Rows are only ever inserted; nothing of pgstore updates or deletes them
-- (the key table's cleanup does not touch this table), so the trail
-- outlives the keys it names. The scope is kept as pgstore sends it to the
-- key table, bytes whatever the key table's scope type.
CREATE TABLE IF NOT EXISTS idempotency_keys_audit (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at               timestamptz NOT NULL DEFAULT now(),
    -- Who, as the operator's tool names them (self-declared), and the
    -- database role that wrote the row (authenticated by PostgreSQL).
    actor            text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 255),
    database_user    text        NOT NULL DEFAULT session_user,
    action           text        NOT NULL CHECK (action IN ('resolve', 'release')),
    scope            bytea       NOT NULL,
    idempotency_key  text        NOT NULL,
    -- The key's state when the attempt read it, under a row lock:
    -- absent, processing, completed, held (running within its lease),
    -- unknown, not-stored.
    previous_state   text        NOT NULL,
    outcome          text        NOT NULL CHECK (outcome IN ('done', 'refused')),
    -- Why a refused attempt was refused; empty when done.
    refusal          text        NOT NULL DEFAULT '',
    reason           text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    -- resolve: the status given. release: none.
    response_status  integer,
    -- SHA-256 of the body a resolve stores (or would have), or of the held
    -- record a release deletes (or found); none when there was none.
    body_sha256      bytea       CHECK (length(body_sha256) = 32),
    CHECK ((outcome = 'done') = (refusal = ''))
);
-- `oncekey keys audit` lists the newest rows first, filtered by time.
CREATE INDEX IF NOT EXISTS idempotency_keys_audit_at_idx ON idempotency_keys_audit (at);
-- … or by key.
CREATE INDEX IF NOT EXISTS idempotency_keys_audit_key_idx ON idempotency_keys_audit (scope, idempotency_key);
