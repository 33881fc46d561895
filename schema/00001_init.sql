-- +goose Up

-- An account owns API keys, idempotency keys and orders. Every other table is
-- keyed by account_id first, so that each one can be distributed by account.
CREATE TABLE accounts (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL CHECK (name <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored only as SHA-256 hashes: a leaked table grants nothing,
-- and a lookup by hash needs no constant-time comparison of secrets.
CREATE TABLE api_keys (
    key_hash   bytea       PRIMARY KEY CHECK (length(key_hash) = 32),
    account_id uuid        NOT NULL REFERENCES accounts (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX api_keys_account_id_idx ON api_keys (account_id);

-- The idempotency keys' table is pgstore's (idempotency/pgstore/migrations),
-- applied before these; databases created before it moved there have it from
-- an earlier version of this file, which 00004 brings to pgstore's layout.

CREATE TABLE orders (
    account_id uuid        NOT NULL REFERENCES accounts (id),
    id         uuid        NOT NULL,
    status     text        NOT NULL CHECK (status IN ('created')),
    amount     bigint      NOT NULL CHECK (amount > 0),
    currency   char(3)     NOT NULL,
    items      jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (account_id, id)
);
-- Newest-first listing with a (created_at, id) cursor.
CREATE INDEX orders_account_created_idx ON orders (account_id, created_at DESC, id DESC);

-- +goose Down
DROP TABLE orders;
DROP TABLE api_keys;
DROP TABLE accounts;
