-- Bodies too large to keep in their record (idempotency.Response.Pieces):
-- a held operation stores its answer's body piece by piece as it passes
-- (Store.WritePiece), each piece durable before the next is read, then
-- settles its record with the count and the total size. A record whose
-- body is in pieces has response_pieces and response_size set and an
-- empty response_body; every other record has them NULL, so the columns
-- cost the key table nothing (added without a default: no rewrite, no
-- scan) and a release that does not know them runs on the table as it is.
ALTER TABLE idempotency_keys
    ADD COLUMN IF NOT EXISTS response_pieces integer,
    ADD COLUMN IF NOT EXISTS response_size   bigint;
-- The pieces, apart from the key table, so that a claim, a replay of a
-- small body and the purge of keys read nothing of them. A piece belongs
-- to one claim of its key (scope, idempotency_key and the record's
-- created_at, as idempotency.Ref names it), so a key claimed again after
-- it expired never sees the pieces of its previous claim. There is no
-- foreign key to the key table, and no trigger on it: those would cost
-- every claim and every purged key a look at this table. Instead a settle
-- with fewer pieces and a release delete the pieces they drop in their
-- own statement, and the purge sweeps the pieces whose record is gone
-- (pgstore.Store.PurgeExpired). The scope column is of the key table's
-- scope type.
CREATE TABLE IF NOT EXISTS idempotency_keys_pieces (
    scope            bytea       NOT NULL CHECK (length(scope) <= 255),
    idempotency_key  text        NOT NULL,
    key_created_at   timestamptz NOT NULL,
    n                integer     NOT NULL CHECK (n >= 0),
    data             bytea       NOT NULL,
    PRIMARY KEY (scope, idempotency_key, key_created_at, n)
);
