-- +goose Up

-- An order is paid at most once: of its payments, at most one is pending
-- or succeeded. POST /payments checks it under the order's row lock and
-- answers a second payment with a stored 409 (payment-in-progress,
-- order-already-paid); this index is the database's own guarantee, should
-- any path ever skip that check. A failed payment does not count: the
-- order can be paid again after it.
--
-- A database that already holds an order paid twice cannot take the index:
-- the migration stops and says so, rather than choose which payment counts.
-- +goose StatementBegin
DO $$
DECLARE
    twice bigint;
BEGIN
    SELECT count(*) INTO twice FROM (
        SELECT 1 FROM payments WHERE status IN ('pending', 'succeeded')
        GROUP BY account_id, order_id HAVING count(*) > 1
    ) d;
    IF twice > 0 THEN
        RAISE EXCEPTION '% orders have more than one pending or succeeded payment; refund the extra charges and mark those payments failed, then migrate again', twice
            USING HINT = 'SELECT account_id, order_id, array_agg(id) FROM payments WHERE status IN (''pending'', ''succeeded'') GROUP BY 1, 2 HAVING count(*) > 1';
    END IF;
END $$;
-- +goose StatementEnd
CREATE UNIQUE INDEX payments_one_active_per_order ON payments (account_id, order_id)
    WHERE status IN ('pending', 'succeeded');

-- Pending payments and refunds, for the metrics every scrape reads and for
-- `oncekey payments stuck`: small, since work leaves them within minutes.
CREATE INDEX payments_pending_idx ON payments (created_at) WHERE status = 'pending';
CREATE INDEX refunds_pending_idx ON refunds (created_at) WHERE status = 'pending';

-- +goose Down
DROP INDEX refunds_pending_idx;
DROP INDEX payments_pending_idx;
DROP INDEX payments_one_active_per_order;
