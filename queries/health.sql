-- name: HealthReadOnly :one
-- Whether a write would fail here with SQLSTATE 25006: on a standby (a
-- primary demoted by a failover), or while default_transaction_read_only
-- is on (the protection mode of a full disk on several managed services).
SELECT current_setting('transaction_read_only')::bool AS read_only;

-- name: HealthReplicaLagSeconds :one
-- How far a replica's replay is behind what it has received (0: caught up,
-- or not a replica): the age of the last transaction it replayed while WAL
-- waits to be applied (recovery_min_apply_delay, or a paused replay).
SELECT (CASE
    WHEN NOT pg_is_in_recovery() THEN 0
    WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0
    ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0)
END)::float8 AS lag_seconds;
