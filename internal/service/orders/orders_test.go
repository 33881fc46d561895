package orders_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/orders"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

func setup(t *testing.T) (*orders.Service, *memory.Store, uuid.UUID) {
	t.Helper()
	store := memory.New()
	return orders.NewService(store), store, uuid.New()
}

func TestCreateValidatesCurrency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		currency string
		wantErr  error
	}{
		{"RUB", nil},
		{"USD", nil},
		{"EUR", nil},
		{"XYZ", orders.ErrUnknownCurrency},
		{"rub", orders.ErrUnknownCurrency},
		{"RU", orders.ErrUnknownCurrency},
	}
	for _, tt := range tests {
		t.Run(tt.currency, func(t *testing.T) {
			t.Parallel()
			svc, store, account := setup(t)
			o, err := svc.Create(context.Background(), store, account, orders.NewOrder{
				Items: []orders.Item{{SKU: "SKU-1", Qty: 2}}, Amount: 1200, Currency: tt.currency,
			})
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, orders.StatusCreated, o.Status)
			require.Equal(t, o.CreatedAt, o.CreatedAt.Truncate(time.Microsecond), "created_at is kept to PostgreSQL's precision")
			got, err := svc.Get(context.Background(), account, o.ID.String())
			require.NoError(t, err)
			require.Equal(t, o, got)
		})
	}
}

func TestGetUnknownOrMalformedIDIsNotFound(t *testing.T) {
	t.Parallel()
	svc, _, account := setup(t)
	for _, id := range []string{uuid.NewString(), "not-a-uuid", ""} {
		_, err := svc.Get(context.Background(), account, id)
		require.ErrorIs(t, err, orders.ErrNotFound, "id %q", id)
	}
}

func TestListPagesThroughEveryOrderOnce(t *testing.T) {
	t.Parallel()
	svc, store, account := setup(t)
	created := map[uuid.UUID]bool{}
	for range 7 {
		o, err := svc.Create(context.Background(), store, account, orders.NewOrder{
			Items: []orders.Item{{SKU: "S", Qty: 1}}, Amount: 1, Currency: "RUB",
		})
		require.NoError(t, err)
		created[o.ID] = true
	}
	seen := map[uuid.UUID]bool{}
	var last *orders.Order
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "pagination does not terminate")
		page, err := svc.List(context.Background(), account, cursor, 3)
		require.NoError(t, err)
		for _, o := range page.Orders {
			require.False(t, seen[o.ID], "order %s listed twice", o.ID)
			seen[o.ID] = true
			if last != nil {
				require.False(t, o.CreatedAt.After(last.CreatedAt), "newest first")
			}
			o := o
			last = &o
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	require.Equal(t, created, seen)
}

func TestListRejectsForeignCursors(t *testing.T) {
	t.Parallel()
	svc, _, account := setup(t)
	for _, c := range []string{"garbage!", "bm90LWEtY3Vyc29y", "MTIzYWJjLnh5eg"} {
		_, err := svc.List(context.Background(), account, c, 10)
		require.ErrorIs(t, err, orders.ErrInvalidCursor, "cursor %q", c)
	}
}
