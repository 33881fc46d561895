-- +goose Up
-- Operators watch keys stuck in 'processing' (metrics and `oncekey keys
-- stuck`); this partial index keeps that look-up cheap however large the
-- table grows, since almost every row is 'completed'.
CREATE INDEX idempotency_keys_processing_idx ON idempotency_keys (created_at) WHERE status = 'processing';

-- +goose Down
DROP INDEX idempotency_keys_processing_idx;
