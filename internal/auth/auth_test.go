package auth_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/auth"
	"github.com/oncekey/oncekey/internal/store/memory"
)

func TestBearerToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header string
		want   string
		ok     bool
	}{
		{"Bearer ok_abc", "ok_abc", true},
		{"bearer ok_abc", "ok_abc", true},
		{"BEARER  ok_abc ", "ok_abc", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Basic b2s6YWJj", "", false},
		{"ok_abc", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.header, func(t *testing.T) {
			t.Parallel()
			got, ok := auth.BearerToken(tt.header)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestNewKeyIsRandomAndPrefixed(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 100 {
		k, err := auth.NewKey()
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(k, auth.KeyPrefix), "key %q", k)
		require.Len(t, k, len(auth.KeyPrefix)+43, "256 bits in unpadded base64url")
		require.False(t, seen[k], "duplicate key")
		seen[k] = true
	}
}

func TestCreateAccountStoresOnlyTheHash(t *testing.T) {
	t.Parallel()
	store := memory.New()
	creds, err := auth.CreateAccount(context.Background(), store, "acme", "")
	require.NoError(t, err)
	require.NotEqual(t, uuid.UUID{}, creds.AccountID)

	id, err := store.AccountByKeyHash(context.Background(), auth.HashKey(creds.APIKey))
	require.NoError(t, err)
	require.Equal(t, creds.AccountID, id)

	_, err = store.AccountByKeyHash(context.Background(), auth.HashKey(creds.APIKey+"x"))
	require.ErrorIs(t, err, auth.ErrUnknownKey)

	_, err = auth.CreateAccount(context.Background(), store, "  ", "")
	require.Error(t, err, "an empty name is refused")
}
