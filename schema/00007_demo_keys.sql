-- +goose Up

-- The demo account's keys (ONCEKEY_DEMO_API_KEY), told apart from every
-- other account's: `oncekey serve` disables them whenever it starts without
-- the setting, so that a demo key never outlives the setting that made it
-- (the README's ok_local_demo, once given to a database, used to work on
-- it for good).
ALTER TABLE api_keys ADD COLUMN demo boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE api_keys DROP COLUMN demo;
