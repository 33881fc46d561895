package idempotency_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// cause is what a reverse proxy reports of an upstream that reset the
// connection: it names the upstream's internal address.
const cause = "read tcp 127.0.0.1:55234->127.0.0.1:42681: read: connection reset by peer"

// TestUnknownOutcomeKeepsItsCauseFromTheClient: a held operation marked
// unknown hands its error writer ErrOutcomeUnknown alone, and the default
// writer's detail is fixed, so that no client reads the cause; the held
// record keeps it as its Reason.
func TestUnknownOutcomeKeepsItsCauseFromTheClient(t *testing.T) {
	t.Parallel()
	var written []string
	e := idempotency.New(idempotency.Config{
		Scope: func(*http.Request) (string, error) { return "tenant", nil },
		WriteError: func(w http.ResponseWriter, r *http.Request, err error) {
			written = append(written, err.Error())
			idempotency.ProblemWriter("")(w, r, err)
		},
	})
	store := memstore.New()
	h := idempotency.NewOperation(e, store, idempotency.OperationConfig{Held: &idempotency.HeldConfig{}}).Handler(
		http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			idempotency.MarkUnknown(r, errors.New(cause))
		}))
	for _, attempt := range []string{"first", "retry"} {
		rec := heldPost(h, "k")
		require.Equal(t, http.StatusConflict, rec.Code, "%s: %s", attempt, rec.Body)
		require.NotContains(t, rec.Body.String(), "127.0.0.1", attempt)
		require.Contains(t, rec.Body.String(), idempotency.ErrOutcomeUnknown.Error(), attempt)
	}
	require.Len(t, written, 2)
	for _, err := range written {
		require.Equal(t, idempotency.ErrOutcomeUnknown.Error(), err, "the error writer is handed no cause")
	}
	lease, stored, err := store.Claim(t.Context(), idempotency.ClaimRequest{Scope: "tenant", Key: "k", TTL: time.Minute, Wait: time.Second})
	require.NoError(t, err)
	require.Nil(t, lease, "the key is held")
	held, ok := idempotency.ParseHeld(stored.Response, time.Time{})
	require.True(t, ok)
	require.Equal(t, idempotency.HeldUnknown, held.State)
	require.Equal(t, cause, held.Reason, "the held record keeps the cause")

	for _, err := range []error{
		idempotency.ErrOutcomeUnknown,
		fmt.Errorf("%w: %w", idempotency.ErrOutcomeUnknown, errors.New(cause)),
	} {
		require.Equal(t, idempotency.ErrOutcomeUnknown.Error(), idempotency.ProblemOf(err).Detail, "a fixed detail, whatever the error wraps")
	}
}
