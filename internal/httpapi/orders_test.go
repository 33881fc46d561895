package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCreateOrderFirstAndReplay(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, be.open(t), options{})
			key := "8e03978e-40d5-43e8-bc93-6894a57f9324"

			first := b.createOrder(t, key, seedBody)
			require.Equal(t, http.StatusCreated, first.StatusCode(), "first attempt: %s", first.Body)
			require.NotNil(t, first.JSON201)
			require.Equal(t, "/orders/"+first.JSON201.Id, first.HTTPResponse.Header.Get("Location"))
			require.Equal(t, key, first.HTTPResponse.Header.Get("Idempotency-Key"))
			require.Empty(t, first.HTTPResponse.Header.Get("Idempotent-Replayed"), "a first response is not a replay")

			retry := b.createOrder(t, key, seedBody)
			require.Equal(t, http.StatusCreated, retry.StatusCode(), "retry: %s", retry.Body)
			require.Equal(t, first.Body, retry.Body, "the replay must be byte-identical")
			require.Equal(t, "true", retry.HTTPResponse.Header.Get("Idempotent-Replayed"))
			require.Equal(t, first.HTTPResponse.Header.Get("Location"), retry.HTTPResponse.Header.Get("Location"))
			require.Equal(t, key, retry.HTTPResponse.Header.Get("Idempotency-Key"))
			require.Equal(t, 1, b.orderCount(t), "the retry must not create a second order")
		})
	}
}
