-- +goose Up
-- This migration used to add the key table's partial index on keys in
-- 'processing'. The key table is pgstore's now, and its migrations create
-- that index (IF NOT EXISTS, so a database that has it keeps it).
SELECT 1;

-- +goose Down
SELECT 1;
