-- Held records (response_status 102: a gateway's operation running
-- upstream, or one whose outcome is unknown) are counted on every metrics
-- scrape and looked at by operators; this partial index keeps that cheap
-- however large the table grows, since almost no row is held.
CREATE INDEX IF NOT EXISTS idempotency_keys_held_idx ON idempotency_keys (created_at) WHERE response_status = 102;
