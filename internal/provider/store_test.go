package provider_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/provider"
	"github.com/oncekey/oncekey/internal/testdb"
)

func newRecord(key, reference string, created time.Time) provider.Record {
	req := provider.ChargeRequest{Amount: 1200, Currency: "RUB", Reference: reference}
	return provider.Record{Key: key, Fingerprint: req.Fingerprint(), Charge: provider.Charge{
		ID: "ch_" + uuid.NewString(), Status: provider.StatusSucceeded,
		Amount: req.Amount, Currency: req.Currency, Reference: req.Reference,
		CreatedAt: created.UTC().Truncate(time.Microsecond),
	}}
}

// TestStoreConformance holds both stores to the same semantics: the server
// relies on exactly these, whichever store it runs on.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	for _, sf := range storeFactories {
		t.Run(sf.name, func(t *testing.T) {
			t.Parallel()
			store := sf.new(t)
			ctx := context.Background()
			now := time.Now()

			t.Run("insert then get round-trips every field", func(t *testing.T) {
				t.Parallel()
				rec := newRecord(unique("key"), unique("ref"), now)
				rec.Charge.Status = provider.StatusDeclined
				rec.Charge.DeclineReason = provider.DeclineCardDeclined
				stored, inserted, err := store.Insert(ctx, rec)
				require.NoError(t, err)
				require.True(t, inserted, "a new key is inserted")
				require.Equal(t, rec, stored, "insert returns the record it stored")

				got, err := store.Get(ctx, rec.Key)
				require.NoError(t, err)
				require.Equal(t, rec, got, "get returns the record as inserted (UTC, microseconds)")
			})

			t.Run("a taken key keeps its first record", func(t *testing.T) {
				t.Parallel()
				key := unique("key")
				first := newRecord(key, unique("ref"), now)
				_, inserted, err := store.Insert(ctx, first)
				require.NoError(t, err)
				require.True(t, inserted)

				same := newRecord(key, first.Charge.Reference, now.Add(time.Second)) // same fingerprint, new id
				other := newRecord(key, unique("other-ref"), now.Add(time.Second))   // another fingerprint
				for _, rec := range []provider.Record{same, other} {
					stored, inserted, err := store.Insert(ctx, rec)
					require.NoError(t, err)
					require.False(t, inserted, "a second insert under %s must not store", key)
					require.Equal(t, first, stored, "the first record, fingerprint included, so the caller can compare")
				}
				got, err := store.Get(ctx, key)
				require.NoError(t, err)
				require.Equal(t, first, got)
				list, err := store.ListByReference(ctx, other.Charge.Reference)
				require.NoError(t, err)
				require.Empty(t, list, "the refused record left no trace")
			})

			t.Run("get of an unknown key is ErrNotFound", func(t *testing.T) {
				t.Parallel()
				_, err := store.Get(ctx, unique("missing"))
				require.ErrorIs(t, err, provider.ErrNotFound)
			})

			t.Run("list by reference finds every key, oldest first", func(t *testing.T) {
				t.Parallel()
				ref := unique("ref")
				older := newRecord(unique("k"), ref, now.Add(-time.Minute))
				tieA := newRecord(unique("k"), ref, now)
				tieB := newRecord(unique("k"), ref, now)
				tieA.Charge.ID, tieB.Charge.ID = "ch_a-"+uuid.NewString(), "ch_b-"+uuid.NewString()
				elsewhere := newRecord(unique("k"), unique("ref"), now)
				for _, rec := range []provider.Record{tieB, elsewhere, tieA, older} {
					_, inserted, err := store.Insert(ctx, rec)
					require.NoError(t, err)
					require.True(t, inserted)
				}
				list, err := store.ListByReference(ctx, ref)
				require.NoError(t, err)
				require.Equal(t, []provider.Charge{older.Charge, tieA.Charge, tieB.Charge}, list, "by created_at, ties by id")

				none, err := store.ListByReference(ctx, unique("unused"))
				require.NoError(t, err)
				require.NotNil(t, none, "no charges is an empty list, which encodes as [] not null")
				require.Empty(t, none)
			})

			t.Run("concurrent inserts under one key store exactly one", func(t *testing.T) {
				t.Parallel()
				key, ref := unique("key"), unique("ref")
				const n = 50
				type result struct {
					id       string
					inserted bool
					err      error
				}
				results := make(chan result, n)
				var wg sync.WaitGroup
				for range n {
					wg.Go(func() {
						stored, inserted, err := store.Insert(ctx, newRecord(key, ref, time.Now()))
						results <- result{stored.Charge.ID, inserted, err}
					})
				}
				wg.Wait()
				close(results)
				winners, returned := 0, map[string]int{}
				for r := range results {
					require.NoError(t, r.err, "concurrent insert")
					if r.inserted {
						winners++
					}
					returned[r.id]++
				}
				require.Equal(t, 1, winners, "exactly one insert wins")
				require.Len(t, returned, 1, "every caller is answered the winner's charge: %v", returned)
				list, err := store.ListByReference(ctx, ref)
				require.NoError(t, err)
				require.Len(t, list, 1, "one charge stored")
			})

			t.Run("a cancelled context is an error", func(t *testing.T) {
				t.Parallel()
				cancelled, cancel := context.WithCancel(ctx)
				cancel()
				_, _, err := store.Insert(cancelled, newRecord(unique("key"), unique("ref"), now))
				require.Error(t, err, "insert")
				_, err = store.Get(cancelled, unique("key"))
				require.Error(t, err, "get")
				require.NotErrorIs(t, err, provider.ErrNotFound, "a failure to look is not an absence")
				_, err = store.ListByReference(cancelled, "x")
				require.Error(t, err, "list")
			})
		})
	}
}

// TestNewPostgresStoreConcurrently starts stores together on a database
// without the table, as replicas booting at once would: the advisory lock
// makes them take turns creating it.
func TestNewPostgresStoreConcurrently(t *testing.T) {
	t.Parallel()
	_, pool := testdb.Fresh(t)
	ctx := context.Background()
	const n = 8
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			_, err := provider.NewPostgresStore(ctx, pool)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "provider.NewPostgresStore beside the others")
	}
	var table string
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('fakeprovider_charges')::text`).Scan(&table))
	require.Equal(t, "fakeprovider_charges", table)
	var index string
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('fakeprovider_charges_reference_idx')::text`).Scan(&index))
	require.Equal(t, "fakeprovider_charges_reference_idx", index, "reference lookups are indexed")
}
