-- +goose Up
-- A database created before the key table moved to pgstore has it in its
-- first layout (account_id uuid); this brings it to pgstore's (scope bytea,
-- which Oncekey fills with the 16 bytes of the account id, as uuid stored
-- them). A database created since has pgstore's layout from the start, and
-- nothing happens. The type change rewrites the table once, under an
-- exclusive lock: on a large table, run the upgrade in a quiet hour.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = current_schema() AND table_name = 'idempotency_keys' AND column_name = 'account_id') THEN
        ALTER TABLE idempotency_keys RENAME COLUMN account_id TO scope;
        ALTER TABLE idempotency_keys ALTER COLUMN scope TYPE bytea USING uuid_send(scope);
        ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_scope_check CHECK (length(scope) <= 255);
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The key table is pgstore's: its layout is not this migration's to undo.
SELECT 1;
