package postgres_test

import (
	"crypto/rand"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/auth"
	"github.com/oncekey/oncekey/internal/service/store/postgres"
	"github.com/oncekey/oncekey/internal/testsupport/testdb"
)

// Concurrent creates of one name through UniqueNames make exactly one
// account: the others are refused with the one that won. A check before
// the insert, outside its transaction, let several through.
func TestUniqueNamesUnderConcurrency(t *testing.T) {
	t.Parallel()
	s := postgres.New(testdb.Pool(t), nil)
	name := "acme " + rand.Text()
	const n = 16
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		made  []auth.Credentials
		taken []*postgres.NameTakenError
	)
	for range n {
		wg.Go(func() {
			creds, err := auth.CreateAccount(t.Context(), s.UniqueNames(), name, "")
			mu.Lock()
			defer mu.Unlock()
			var refused *postgres.NameTakenError
			switch {
			case err == nil:
				made = append(made, creds)
			case errors.As(err, &refused):
				taken = append(taken, refused)
			default:
				t.Errorf("create %q: %v", name, err)
			}
		})
	}
	wg.Wait()
	require.Len(t, made, 1, "one of %d concurrent creates of one name succeeds", n)
	require.Len(t, taken, n-1, "the others are refused")
	for _, refused := range taken {
		require.Equal(t, made[0].AccountID, refused.ID, "a refusal names the account that won")
	}
	ids, err := s.AccountsNamed(t.Context(), name)
	require.NoError(t, err)
	require.Len(t, ids, 1, "accounts named %q", name)

	// The Store itself still creates a second one on purpose.
	_, err = auth.CreateAccount(t.Context(), s, name, "")
	require.NoError(t, err, "a duplicate name, on purpose")
	ids, err = s.AccountsNamed(t.Context(), name)
	require.NoError(t, err)
	require.Len(t, ids, 2)
}
