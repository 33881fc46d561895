-- The guard relation of deferred writes (pgstore.Store.Claimed): a write
-- that Store.Deferred takes selects from it to make no change unless its
-- own claim inserted the key row. pgstore sends each such write with a CTE
-- of this name, which holds one row exactly then. The view holds none, so
-- a guarded write run anywhere else changes nothing; it is here so that
-- the application's SQL tools (sqlc) know the relation.
CREATE OR REPLACE VIEW idempotency_keys_claimed AS SELECT true AS claimed WHERE false;
