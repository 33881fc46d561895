-- +goose Up
-- The key table takes the layout of the idempotency engine (package pgstore,
-- schema/idempotency): a key's scope is opaque bytes, which Oncekey fills
-- with the 16 bytes of the account id, as uuid stored them. The type change
-- rewrites the table once, under an exclusive lock: on a large table, run
-- the upgrade in a quiet hour.
ALTER TABLE idempotency_keys RENAME COLUMN account_id TO scope;
ALTER TABLE idempotency_keys ALTER COLUMN scope TYPE bytea USING uuid_send(scope);
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_scope_check CHECK (length(scope) <= 255);

-- +goose Down
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_scope_check;
ALTER TABLE idempotency_keys ALTER COLUMN scope TYPE uuid USING encode(scope, 'hex')::uuid;
ALTER TABLE idempotency_keys RENAME COLUMN scope TO account_id;
