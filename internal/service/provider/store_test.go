package provider_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/provider"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
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
	eachStore(t, func(t *testing.T, store provider.Store) {
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
			requireOneWinner(t, together(50, func() insertResult {
				stored, inserted, err := store.Insert(ctx, newRecord(key, ref, time.Now()))
				return insertResult{stored.Charge.ID, inserted, err}
			}))
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

// TestNewPostgresStoreConcurrently starts stores together on a database
// without the tables, as replicas booting at once would: the advisory lock
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
	for _, name := range []string{"fakeprovider_charges_reference_idx", "fakeprovider_refunds", "fakeprovider_refunds_reference_idx", "fakeprovider_refunds_charge_id_idx"} {
		var got *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, name).Scan(&got))
		require.NotNil(t, got, "%s is created with the charges table", name)
		require.Equal(t, name, *got)
	}
}

// TestNewPostgresStoreAddsRefundsToAnOlderDatabase starts a store on a
// database that an older sandbox made, with the charges table alone and a
// charge in it: the refunds table is added, and the charge can be refunded.
func TestNewPostgresStoreAddsRefundsToAnOlderDatabase(t *testing.T) {
	t.Parallel()
	_, pool := testdb.Fresh(t)
	ctx := context.Background()
	older, err := provider.NewPostgresStore(ctx, pool)
	require.NoError(t, err)
	ch := storeCharge(t, older, 1000, "EUR", provider.StatusSucceeded)
	_, err = pool.Exec(ctx, `DROP TABLE fakeprovider_refunds`)
	require.NoError(t, err, "back to the schema before refunds")

	store, err := provider.NewPostgresStore(ctx, pool)
	require.NoError(t, err)
	stored, inserted, err := store.InsertRefund(ctx, newRefundRecord(unique("key"), ch.ID, 1000, unique("ref"), time.Now()))
	require.NoError(t, err)
	require.True(t, inserted)
	require.Equal(t, "EUR", stored.Refund.Currency)
}

func newRefundRecord(key, chargeID string, amount int64, reference string, created time.Time) provider.RefundRecord {
	req := provider.RefundRequest{ChargeID: chargeID, Amount: amount, Reference: reference}
	return provider.RefundRecord{Key: key, Fingerprint: req.Fingerprint(), Refund: provider.Refund{
		ID: "re_" + uuid.NewString(), Status: provider.StatusSucceeded,
		ChargeID: req.ChargeID, Amount: req.Amount, Reference: req.Reference,
		CreatedAt: created.UTC().Truncate(time.Microsecond),
	}}
}

// storeCharge stores a charge of amount in currency with status, for
// refunds to be made of.
func storeCharge(t *testing.T, store provider.Store, amount int64, currency, status string) provider.Charge {
	t.Helper()
	rec := newRecord(unique("charge-key"), unique("pay"), time.Now())
	rec.Charge.Amount, rec.Charge.Currency, rec.Charge.Status = amount, currency, status
	if status == provider.StatusDeclined {
		rec.Charge.DeclineReason = provider.DeclineCardDeclined
	}
	_, inserted, err := store.Insert(context.Background(), rec)
	require.NoError(t, err)
	require.True(t, inserted)
	return rec.Charge
}

// TestRefundStoreConformance holds both stores to the same refund
// semantics, the over-refund check under concurrency above all.
func TestRefundStoreConformance(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, store provider.Store) {
		ctx := context.Background()
		now := time.Now()

		t.Run("insert then get round-trips every field, in the charge's currency", func(t *testing.T) {
			t.Parallel()
			ch := storeCharge(t, store, 1000, "USD", provider.StatusSucceeded)
			rec := newRefundRecord(unique("key"), ch.ID, 250, unique("ref"), now)
			rec.Refund.Status = provider.StatusDeclined
			rec.Refund.DeclineReason = provider.DeclineRefundDeclined
			stored, inserted, err := store.InsertRefund(ctx, rec)
			require.NoError(t, err)
			require.True(t, inserted, "a new key is inserted")
			want := rec
			want.Refund.Currency = "USD"
			require.Equal(t, want, stored, "insert returns the record it stored, with the currency filled in")

			got, err := store.GetRefund(ctx, rec.Key)
			require.NoError(t, err)
			require.Equal(t, want, got, "get returns the record as inserted (UTC, microseconds)")
		})

		t.Run("refund keys are apart from charge keys", func(t *testing.T) {
			t.Parallel()
			ch := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			chargeKey := unique("shared-key")
			_, inserted, err := store.Insert(ctx, newRecord(chargeKey, unique("ref"), now))
			require.NoError(t, err)
			require.True(t, inserted)
			_, inserted, err = store.InsertRefund(ctx, newRefundRecord(chargeKey, ch.ID, 100, unique("ref"), now))
			require.NoError(t, err)
			require.True(t, inserted, "a key that made a charge may make a refund")
		})

		t.Run("a taken key keeps its first refund, even once the charge is used up", func(t *testing.T) {
			t.Parallel()
			ch := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			key := unique("key")
			first, inserted, err := store.InsertRefund(ctx, newRefundRecord(key, ch.ID, 1000, unique("ref"), now))
			require.NoError(t, err)
			require.True(t, inserted)

			same := newRefundRecord(key, ch.ID, 1000, first.Refund.Reference, now.Add(time.Second)) // same fingerprint, new id
			other := newRefundRecord(key, "ch_unknown-"+uuid.NewString(), 5, unique("other-ref"), now)
			for _, rec := range []provider.RefundRecord{same, other} {
				stored, inserted, err := store.InsertRefund(ctx, rec)
				require.NoError(t, err, "the key is answered before the charge is looked at")
				require.False(t, inserted, "a second insert under %s must not store", key)
				require.Equal(t, first, stored, "the first record, fingerprint included, so the caller can compare")
			}
			list, err := store.ListRefundsByReference(ctx, other.Refund.Reference)
			require.NoError(t, err)
			require.Empty(t, list, "the refused record left no trace")
		})

		t.Run("a refused refund stores nothing and leaves its key free", func(t *testing.T) {
			t.Parallel()
			good := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			declined := storeCharge(t, store, 1000, "RUB", provider.StatusDeclined)
			partly := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			spare := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			_, _, err := store.InsertRefund(ctx, newRefundRecord(unique("key"), partly.ID, 700, unique("ref"), now))
			require.NoError(t, err)
			tests := []struct {
				name     string
				chargeID string
				amount   int64
				status   string
				want     error
				words    string
			}{
				{"unknown charge", "ch_unknown-" + uuid.NewString(), 1, provider.StatusSucceeded, provider.ErrChargeNotFound, "no such charge: ch_unknown-"},
				{"declined charge", declined.ID, 1, provider.StatusSucceeded, provider.ErrChargeNotRefundable, "charge " + declined.ID + " was declined"},
				{"more than the charge", good.ID, 1001, provider.StatusSucceeded, provider.ErrRefundExceedsCharge, "1001 asked, charge " + good.ID + " has 1000 of its 1000 left"},
				{"more than is left", partly.ID, 301, provider.StatusSucceeded, provider.ErrRefundExceedsCharge, "301 asked, charge " + partly.ID + " has 300 of its 1000 left"},
				{"a refund to be declined asks too much all the same", partly.ID, 301, provider.StatusDeclined, provider.ErrRefundExceedsCharge, "301 asked"},
			}
			for _, tt := range tests {
				key, ref := unique("key"), unique("ref")
				rec := newRefundRecord(key, tt.chargeID, tt.amount, ref, now)
				rec.Refund.Status = tt.status
				_, inserted, err := store.InsertRefund(ctx, rec)
				require.ErrorIs(t, err, tt.want, tt.name)
				require.ErrorContains(t, err, tt.words, "%s: both stores say it in the same words", tt.name)
				require.False(t, inserted, tt.name)
				_, err = store.GetRefund(ctx, key)
				require.ErrorIs(t, err, provider.ErrNotFound, "%s: nothing stored under the key", tt.name)
				list, err := store.ListRefundsByReference(ctx, ref)
				require.NoError(t, err)
				require.Empty(t, list, tt.name)

				_, inserted, err = store.InsertRefund(ctx, newRefundRecord(key, spare.ID, 1, unique("ref"), now))
				require.NoError(t, err, "%s: the key may be used again", tt.name)
				require.True(t, inserted, tt.name)
			}
		})

		t.Run("succeeded refunds add up to the charge, declined ones take nothing", func(t *testing.T) {
			t.Parallel()
			ch := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			steps := []struct {
				amount int64
				status string
				want   error
			}{
				{600, provider.StatusSucceeded, nil},
				{400, provider.StatusDeclined, nil},
				{400, provider.StatusSucceeded, nil},
				{1, provider.StatusSucceeded, provider.ErrRefundExceedsCharge},
				{1, provider.StatusDeclined, provider.ErrRefundExceedsCharge},
			}
			for i, step := range steps {
				rec := newRefundRecord(unique("key"), ch.ID, step.amount, unique("ref"), now)
				rec.Refund.Status = step.status
				_, inserted, err := store.InsertRefund(ctx, rec)
				if step.want != nil {
					require.ErrorIs(t, err, step.want, "step %d", i)
					continue
				}
				require.NoError(t, err, "step %d: %d %s", i, step.amount, step.status)
				require.True(t, inserted)
			}
		})

		t.Run("get of an unknown key is ErrNotFound", func(t *testing.T) {
			t.Parallel()
			_, err := store.GetRefund(ctx, unique("missing"))
			require.ErrorIs(t, err, provider.ErrNotFound)
		})

		t.Run("list by reference finds every key, oldest first", func(t *testing.T) {
			t.Parallel()
			ch := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			ref := unique("ref")
			older := newRefundRecord(unique("k"), ch.ID, 10, ref, now.Add(-time.Minute))
			tieA := newRefundRecord(unique("k"), ch.ID, 10, ref, now)
			tieB := newRefundRecord(unique("k"), ch.ID, 10, ref, now)
			tieA.Refund.ID, tieB.Refund.ID = "re_a-"+uuid.NewString(), "re_b-"+uuid.NewString()
			elsewhere := newRefundRecord(unique("k"), ch.ID, 10, unique("ref"), now)
			want := map[string]provider.Refund{}
			for _, rec := range []provider.RefundRecord{tieB, elsewhere, tieA, older} {
				stored, inserted, err := store.InsertRefund(ctx, rec)
				require.NoError(t, err)
				require.True(t, inserted)
				want[stored.Refund.ID] = stored.Refund
			}
			list, err := store.ListRefundsByReference(ctx, ref)
			require.NoError(t, err)
			require.Equal(t, []provider.Refund{want[older.Refund.ID], want[tieA.Refund.ID], want[tieB.Refund.ID]}, list, "by created_at, ties by id")

			none, err := store.ListRefundsByReference(ctx, unique("unused"))
			require.NoError(t, err)
			require.NotNil(t, none, "no refunds is an empty list, which encodes as [] not null")
			require.Empty(t, none)
		})

		t.Run("concurrent refunds of one charge never exceed it", func(t *testing.T) {
			t.Parallel()
			ch := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			ref := unique("ref")
			const n, amount = 50, 30
			errs := together(n, func() error {
				_, inserted, err := store.InsertRefund(ctx, newRefundRecord(unique("key"), ch.ID, amount, ref, time.Now()))
				if err == nil && !inserted {
					err = errors.New("a fresh key was not inserted")
				}
				return err
			})
			stored, exceeded := 0, 0
			for _, err := range errs {
				switch {
				case err == nil:
					stored++
				case errors.Is(err, provider.ErrRefundExceedsCharge):
					exceeded++
				default:
					require.NoError(t, err, "concurrent refund")
				}
			}
			require.Equal(t, 1000/amount, stored, "as many as fit")
			require.Equal(t, n-1000/amount, exceeded, "the rest are refused")
			list, err := store.ListRefundsByReference(ctx, ref)
			require.NoError(t, err)
			var total int64
			for _, re := range list {
				total += re.Amount
			}
			require.Len(t, list, stored)
			require.LessOrEqual(t, total, ch.Amount, "never more than the charge")
		})

		t.Run("concurrent refunds under one key store exactly one", func(t *testing.T) {
			t.Parallel()
			// The whole charge, so that a request that did not see the
			// winner's refund as its own would be refused as exceeding it.
			ch := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			key, ref := unique("key"), unique("ref")
			requireOneWinner(t, together(20, func() insertResult {
				stored, inserted, err := store.InsertRefund(ctx, newRefundRecord(key, ch.ID, 1000, ref, time.Now()))
				return insertResult{stored.Refund.ID, inserted, err}
			}))
			list, err := store.ListRefundsByReference(ctx, ref)
			require.NoError(t, err)
			require.Len(t, list, 1, "one refund stored")
		})

		t.Run("a cancelled context is an error", func(t *testing.T) {
			t.Parallel()
			ch := storeCharge(t, store, 1000, "RUB", provider.StatusSucceeded)
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			_, _, err := store.InsertRefund(cancelled, newRefundRecord(unique("key"), ch.ID, 1, unique("ref"), now))
			require.Error(t, err, "insert")
			_, err = store.GetRefund(cancelled, unique("key"))
			require.Error(t, err, "get")
			require.NotErrorIs(t, err, provider.ErrNotFound, "a failure to look is not an absence")
			_, err = store.ListRefundsByReference(cancelled, "x")
			require.Error(t, err, "list")
		})
	})
}
