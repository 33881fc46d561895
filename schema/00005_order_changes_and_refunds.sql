-- +goose Up

-- An order can be cancelled (for good) while it has no pending or succeeded
-- payment; changing, cancelling and paying an order each lock its row first,
-- so that of a cancel and a payment sent together exactly one succeeds.
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN ('created', 'cancelled'));
ALTER TABLE orders ADD COLUMN cancelled_at timestamptz;
ALTER TABLE orders ADD CONSTRAINT orders_cancelled_check CHECK ((status = 'cancelled') = (cancelled_at IS NOT NULL));

-- A refund of a succeeded payment through the provider: a long operation
-- like the payment itself. It is created 'pending' in the transaction that
-- claims the client's key, locks the payment's row and enqueues its River
-- job; the worker makes it final in the transaction that replaces the key's
-- stored 202 with the final response. The refunds of a payment that have
-- not failed never add up to more than its amount: each is created under
-- the payment's row lock, after summing the others.
CREATE TABLE refunds (
    account_id         uuid        NOT NULL,
    id                 uuid        NOT NULL,
    payment_id         uuid        NOT NULL,
    amount             bigint      NOT NULL CHECK (amount > 0),
    currency           char(3)     NOT NULL,
    reason             text        NOT NULL CHECK (reason <> ''),
    status             text        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    failure_reason     text        CHECK (failure_reason IN ('refund_declined', 'provider_unavailable', 'provider_rejected')),
    provider_refund_id text,
    -- As for payments: the exact key row this refund answers for.
    idempotency_key    text        NOT NULL,
    key_created_at     timestamptz NOT NULL,
    created_at         timestamptz NOT NULL,
    completed_at       timestamptz,
    PRIMARY KEY (account_id, id),
    FOREIGN KEY (account_id, payment_id) REFERENCES payments (account_id, id),
    CHECK ((status = 'pending') = (completed_at IS NULL)),
    CHECK ((status = 'failed') = (failure_reason IS NOT NULL)),
    CHECK ((status = 'succeeded') = (provider_refund_id IS NOT NULL))
);
CREATE INDEX refunds_account_payment_idx ON refunds (account_id, payment_id, created_at, id);

-- +goose Down
DROP TABLE refunds;
ALTER TABLE orders DROP CONSTRAINT orders_cancelled_check;
ALTER TABLE orders DROP COLUMN cancelled_at;
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check CHECK (status IN ('created'));
