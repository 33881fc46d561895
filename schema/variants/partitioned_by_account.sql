-- A variant of the schema for tests, never a migration: every table that
-- grows per account hash-partitioned on its account (8 partitions), as a
-- distributed database would shard it. Applied after the migrations, to an
-- empty database (testdb.FreshPartitioned). Each table is recreated as a
-- partitioned table LIKE the original (columns, defaults, checks, indexes,
-- the primary key, which begins with the account already), and the foreign
-- keys between them are made again.
DO $$
DECLARE
    partitions CONSTANT int := 8;
    t record;
    fk record;
BEGIN
    CREATE TEMP TABLE per_account (tbl text, col text) ON COMMIT DROP;
    INSERT INTO per_account VALUES
        ('idempotency_keys', 'scope'), -- the account's id: its bytes, or the uuid itself
        ('orders', 'account_id'), ('payments', 'account_id'), ('refunds', 'account_id'),
        ('bonus_entries', 'account_id'), ('bonus_balances', 'account_id');

    CREATE TEMP TABLE foreign_keys ON COMMIT DROP AS
        SELECT conrelid::regclass::text AS tbl, conname, pg_get_constraintdef(oid) AS def
        FROM pg_constraint
        WHERE contype = 'f' AND conrelid::regclass::text IN (SELECT tbl FROM per_account);
    FOR fk IN SELECT * FROM foreign_keys LOOP
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', fk.tbl, fk.conname);
    END LOOP;

    FOR t IN SELECT * FROM per_account LOOP
        EXECUTE format('ALTER TABLE %I RENAME TO %I', t.tbl, t.tbl || '_unpartitioned');
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING ALL) PARTITION BY HASH (%I)',
                       t.tbl, t.tbl || '_unpartitioned', t.col);
        FOR i IN 0 .. partitions - 1 LOOP
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
                           t.tbl || '_p' || i, t.tbl, partitions, i);
        END LOOP;
        EXECUTE format('INSERT INTO %I SELECT * FROM %I', t.tbl, t.tbl || '_unpartitioned');
        EXECUTE format('DROP TABLE %I', t.tbl || '_unpartitioned');
    END LOOP;

    FOR fk IN SELECT * FROM foreign_keys LOOP
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I %s', fk.tbl, fk.conname, fk.def);
    END LOOP;
END $$;
