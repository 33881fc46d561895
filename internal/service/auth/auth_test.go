package auth_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

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
