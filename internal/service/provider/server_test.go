package provider_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/service/provider"

	"github.com/oncekey/oncekey/idempotency"
)

func rub(reference string) provider.ChargeRequest {
	return provider.ChargeRequest{Amount: 1200, Currency: "RUB", Reference: reference}
}

func TestNewChargeThenReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	key, ref := unique("key"), unique("pay")
	body := jsonBody(t, rub(ref))

	before := time.Now().Add(-time.Second)
	first := postCharge(t, b.url, key, body)
	require.Equal(t, http.StatusCreated, first.status, "a new key charges: %s", first.body)
	require.Equal(t, "application/json", first.header.Get("Content-Type"))
	require.Empty(t, first.header.Get(provider.ReplayedHeader), "a new charge is not a replay")
	ch := first.charge(t)
	require.True(t, strings.HasPrefix(ch.ID, "ch_"), "id %q", ch.ID)
	require.Equal(t, provider.StatusSucceeded, ch.Status)
	require.Empty(t, ch.DeclineReason)
	require.Equal(t, rub(ref), provider.ChargeRequest{Amount: ch.Amount, Currency: ch.Currency, Reference: ch.Reference})
	require.WithinRange(t, ch.CreatedAt, before, time.Now().Add(time.Second))
	require.NotContains(t, string(first.body), "decline_reason", "only declined charges carry a reason")

	replay := postCharge(t, b.url, key, body)
	require.Equal(t, http.StatusOK, replay.status, "the same key and body replays: %s", replay.body)
	require.Equal(t, "true", replay.header.Get(provider.ReplayedHeader))
	require.Equal(t, ch, replay.charge(t), "the replay is the stored charge")

	list, err := b.client.ChargesByReference(t.Context(), ref)
	require.NoError(t, err)
	require.Equal(t, []provider.Charge{ch}, list, "one charge however many requests")
	require.Equal(t, provider.Stats{Requests: 2, Charges: 1, Replays: 1}, b.srv.Stats())
}

func TestKeyReusedWithAnotherBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*provider.ChargeRequest)
	}{
		{"amount", func(r *provider.ChargeRequest) { r.Amount++ }},
		{"currency", func(r *provider.ChargeRequest) { r.Currency = "USD" }},
		{"reference", func(r *provider.ChargeRequest) { r.Reference += "-other" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, provider.Faults{})
			key, req := unique("key"), rub(unique("pay"))
			first, err := b.client.Charge(t.Context(), key, req)
			require.NoError(t, err)

			other := req
			tt.change(&other)
			a := postCharge(t, b.url, key, jsonBody(t, other))
			require.Equal(t, http.StatusConflict, a.status, "another %s under a used key: %s", tt.name, a.body)
			require.Contains(t, a.problem(t).Type, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug)

			_, err = b.client.Charge(t.Context(), key, other)
			require.ErrorIs(t, err, provider.ErrRejected, "the client reports key reuse as permanent")
			require.Contains(t, err.Error(), "409")

			got, err := b.client.Lookup(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, first, got, "the key still holds the first charge")
			require.Equal(t, int64(1), b.srv.Stats().Charges)
			require.Zero(t, b.srv.Stats().Replays, "a refused reuse is no replay")
		})
	}
}

func TestInvalidChargeRequests(t *testing.T) {
	t.Parallel()
	valid := `{"amount":1200,"currency":"RUB","reference":"pay-1"}`
	tests := []struct {
		name     string
		headers  []string
		body     string
		wantType string
	}{
		{"no key", nil, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"key too long", []string{"Idempotency-Key", strings.Repeat("k", 256)}, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"key not ASCII", []string{"Idempotency-Key", "ключ"}, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"key with a tab", []string{"Idempotency-Key", "a\tb"}, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"two keys", []string{"Idempotency-Key", "a", "Idempotency-Key", "b"}, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"not JSON", []string{"Idempotency-Key", "k"}, `amount=1200`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"empty body", []string{"Idempotency-Key", "k"}, ``, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"fractional amount", []string{"Idempotency-Key", "k"}, `{"amount":12.5,"currency":"RUB","reference":"p"}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"amount as a string", []string{"Idempotency-Key", "k"}, `{"amount":"1200","currency":"RUB","reference":"p"}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"unknown field", []string{"Idempotency-Key", "k"}, `{"ammount":1200,"currency":"RUB","reference":"p"}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"trailing data", []string{"Idempotency-Key", "k"}, valid + `{}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"zero amount", []string{"Idempotency-Key", "k"}, `{"amount":0,"currency":"RUB","reference":"p"}`, "validation-error"},
		{"missing amount", []string{"Idempotency-Key", "k"}, `{"currency":"RUB","reference":"p"}`, "validation-error"},
		{"negative amount", []string{"Idempotency-Key", "k"}, `{"amount":-5,"currency":"RUB","reference":"p"}`, "validation-error"},
		{"lower-case currency", []string{"Idempotency-Key", "k"}, `{"amount":1,"currency":"rub","reference":"p"}`, "validation-error"},
		{"four-letter currency", []string{"Idempotency-Key", "k"}, `{"amount":1,"currency":"RUBL","reference":"p"}`, "validation-error"},
		{"empty reference", []string{"Idempotency-Key", "k"}, `{"amount":1,"currency":"RUB","reference":""}`, "validation-error"},
		{"reference too long", []string{"Idempotency-Key", "k"}, `{"amount":1,"currency":"RUB","reference":"` + strings.Repeat("я", 256) + `"}`, "validation-error"},
		{"body too large", []string{"Idempotency-Key", "k"}, `{"reference":"` + strings.Repeat("x", 70<<10) + `"}`, idempotency.ProblemOf(idempotency.ErrBodyTooLarge).Slug},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// FailRate=1 too: a malformed request is refused the same way
			// whatever the faults, before any is rolled.
			b := setup(t, nil, provider.Faults{FailRate: 1})
			headers := append([]string{"Content-Type", "application/json"}, tt.headers...)
			requireInvalid(t, send(t, http.MethodPost, b.url+"/v1/charges", tt.body, headers...), tt.wantType)
			st := b.srv.Stats()
			require.Equal(t, provider.Stats{Requests: 1}, st, "nothing charged, no fault rolled")
		})
	}

	t.Run("the longest key and reference are fine", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, provider.Faults{})
		key := "~ " + strings.Repeat("k", provider.MaxKeyLength-2) // every printable character is allowed
		ref := strings.Repeat("я", provider.MaxReferenceLength)
		ch, err := b.client.Charge(t.Context(), key, rub(ref))
		require.NoError(t, err)
		require.Equal(t, ref, ch.Reference)
	})
}

func TestLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	key := unique("key")

	_, err := b.client.Lookup(t.Context(), key)
	require.ErrorIs(t, err, provider.ErrNotFound, "nothing under a fresh key")
	a := send(t, http.MethodGet, b.url+"/v1/charges?idempotency_key="+key, "")
	require.Equal(t, http.StatusNotFound, a.status)
	a.problem(t)

	ch, err := b.client.Charge(t.Context(), key, rub(unique("pay")))
	require.NoError(t, err)
	got, err := b.client.Lookup(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, ch, got)
	require.Equal(t, int64(1), b.srv.Stats().Requests, "lookups are not charge requests")
}

func TestChargesByReferenceListsEveryKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	ref := unique("pay")
	var want []provider.Charge
	for i := range 3 {
		ch, err := b.client.Charge(t.Context(), fmt.Sprintf("%s-%d", ref, i), rub(ref))
		require.NoError(t, err)
		want = append(want, ch)
	}
	_, err := b.client.Charge(t.Context(), unique("key"), rub(unique("other")))
	require.NoError(t, err)

	got, err := b.client.ChargesByReference(t.Context(), ref)
	require.NoError(t, err)
	require.ElementsMatch(t, want, got, "every key's charge for the reference, and no other")

	none, err := b.client.ChargesByReference(t.Context(), unique("unused"))
	require.NoError(t, err)
	require.Empty(t, none)
	a := send(t, http.MethodGet, b.url+"/v1/charges?reference="+unique("unused"), "")
	require.JSONEq(t, `{"charges":[]}`, string(a.body), "no charges is an empty array, not null")
}

func TestReadEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	tests := []struct {
		name       string
		method     string
		path       string
		wantStatus int
		wantType   string
	}{
		{"health", http.MethodGet, "/healthz", http.StatusOK, ""},
		{"stats", http.MethodGet, "/v1/stats", http.StatusOK, ""},
		{"list without a filter", http.MethodGet, "/v1/charges", http.StatusBadRequest, "validation-error"},
		{"list with both filters", http.MethodGet, "/v1/charges?idempotency_key=k&reference=r", http.StatusBadRequest, "validation-error"},
		{"empty reference", http.MethodGet, "/v1/charges?reference=", http.StatusBadRequest, "validation-error"},
		{"invalid key", http.MethodGet, "/v1/charges?idempotency_key=", http.StatusBadRequest, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"refunds without a filter", http.MethodGet, "/v1/refunds", http.StatusBadRequest, "validation-error"},
		{"refunds with both filters", http.MethodGet, "/v1/refunds?idempotency_key=k&reference=r", http.StatusBadRequest, "validation-error"},
		{"refunds by an empty reference", http.MethodGet, "/v1/refunds?reference=", http.StatusBadRequest, "validation-error"},
		{"refund under an invalid key", http.MethodGet, "/v1/refunds?idempotency_key=", http.StatusBadRequest, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"refund under an unknown key", http.MethodGet, "/v1/refunds?idempotency_key=nobody", http.StatusNotFound, "not-found"},
		{"unknown path", http.MethodGet, "/v1/payouts", http.StatusNotFound, "not-found"},
		{"wrong method", http.MethodDelete, "/v1/charges", http.StatusMethodNotAllowed, "method-not-allowed"},
		{"wrong method on refunds", http.MethodPut, "/v1/refunds", http.StatusMethodNotAllowed, "method-not-allowed"},
		{"post to stats", http.MethodPost, "/v1/stats", http.StatusMethodNotAllowed, "method-not-allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := send(t, tt.method, b.url+tt.path, "")
			require.Equal(t, tt.wantStatus, a.status, "body %s", a.body)
			if tt.wantType != "" {
				require.Contains(t, a.problem(t).Type, tt.wantType)
			}
			if tt.wantStatus == http.StatusMethodNotAllowed {
				require.NotEmpty(t, a.header.Get("Allow"), "a 405 lists the methods allowed (RFC 9110 §15.5.6)")
			}
		})
	}
}

// TestConcurrentRequestsWithOneKey is the sandbox's reason to exist: 50
// requests with one key at once make exactly one charge, on either store.
func TestConcurrentRequestsWithOneKey(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, store provider.Store) {
		b := setup(t, store, provider.Faults{})
		key, ref := unique("key"), unique("pay")
		body := jsonBody(t, rub(ref))
		const n = 50
		answers := together(n, func() answer { return postCharge(t, b.url, key, body) })
		requireOneCreated(t, answers, func(a answer) string { return a.charge(t).ID })

		list, err := b.client.ChargesByReference(t.Context(), ref)
		require.NoError(t, err)
		require.Len(t, list, 1, "one charge stored")
		require.Equal(t, provider.Stats{Requests: n, Charges: 1, Replays: n - 1}, b.srv.Stats())
	})
}

func TestFailFault(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{FailRate: 1})
	key, ref := unique("key"), unique("pay")

	a := postCharge(t, b.url, key, jsonBody(t, rub(ref)))
	require.Equal(t, http.StatusInternalServerError, a.status)
	a.problem(t)
	_, err := b.client.Charge(t.Context(), key, rub(ref))
	require.ErrorIs(t, err, provider.ErrUnavailable, "a 500 is transient")

	_, err = b.client.Lookup(t.Context(), key)
	require.ErrorIs(t, err, provider.ErrNotFound, "a failed request charges nothing")
	list, err := b.client.ChargesByReference(t.Context(), ref)
	require.NoError(t, err)
	require.Empty(t, list)
	st, err := b.client.Stats(t.Context())
	require.NoError(t, err)
	require.Equal(t, provider.Stats{Requests: 2, Faults: provider.FaultStats{Fail: 2}}, st)
}

// TestTimeoutFault shows the dangerous case: the client hears nothing, yet
// the charge was made; retrying with the same key replays it.
func TestTimeoutFault(t *testing.T) {
	t.Parallel()
	store := provider.NewMemoryStore()
	hung := setup(t, store, provider.Faults{TimeoutRate: 1})
	healthy := setup(t, store, provider.Faults{})
	impatient := provider.NewClient(hung.url, &http.Client{Timeout: 200 * time.Millisecond})
	key, ref := unique("key"), unique("pay")

	_, err := impatient.Charge(t.Context(), key, rub(ref))
	require.ErrorIs(t, err, provider.ErrUnavailable, "no answer is transient")

	charged, err := hung.client.Lookup(t.Context(), key)
	require.NoError(t, err, "the charge was stored before the answer was lost")
	require.Equal(t, provider.StatusSucceeded, charged.Status)
	require.Equal(t, provider.Stats{Requests: 1, Charges: 1, Faults: provider.FaultStats{Timeout: 1}}, hung.srv.Stats())

	_, err = impatient.Charge(t.Context(), key, rub(ref))
	require.ErrorIs(t, err, provider.ErrUnavailable, "a replay can time out too")
	require.Equal(t, provider.Stats{Requests: 2, Charges: 1, Replays: 1, Faults: provider.FaultStats{Timeout: 2}}, hung.srv.Stats())

	a := postCharge(t, healthy.url, key, jsonBody(t, rub(ref)))
	require.Equal(t, http.StatusOK, a.status, "the retry once the provider recovers replays: %s", a.body)
	require.Equal(t, charged.ID, a.charge(t).ID, "the same charge, not a second one")
	list, err := healthy.client.ChargesByReference(t.Context(), ref)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

func TestTimeoutFaultHoldsAtMostTimeoutHold(t *testing.T) {
	t.Parallel()
	const hold = 100 * time.Millisecond
	b := setup(t, nil, provider.Faults{TimeoutRate: 1, TimeoutHold: hold})
	key := unique("key")
	start := time.Now()
	_, err := b.client.Charge(t.Context(), key, rub(unique("pay")))
	require.ErrorIs(t, err, provider.ErrUnavailable, "a patient client gets a dropped connection")
	require.GreaterOrEqual(t, time.Since(start), hold, "the answer is held first")
	_, err = b.client.Lookup(t.Context(), key)
	require.NoError(t, err, "and the charge was made")
}

func TestDeclineFault(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{DeclineRate: 1})
	key, ref := unique("key"), unique("pay")

	a := postCharge(t, b.url, key, jsonBody(t, rub(ref)))
	require.Equal(t, http.StatusCreated, a.status, "a decline is an answer, not an error: %s", a.body)
	declined := a.charge(t)
	require.Equal(t, provider.StatusDeclined, declined.Status)
	require.Equal(t, provider.DeclineCardDeclined, declined.DeclineReason)

	replay, err := b.client.Charge(t.Context(), key, rub(ref))
	require.NoError(t, err)
	require.Equal(t, declined, replay, "the replay is the same declined charge")
	got, err := b.client.Lookup(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, declined, got)
	require.Equal(t, provider.Stats{Requests: 2, Charges: 1, Replays: 1, Faults: provider.FaultStats{Decline: 1}}, b.srv.Stats())
}

func TestLatency(t *testing.T) {
	t.Parallel()
	const latency = 150 * time.Millisecond
	b := setup(t, nil, provider.Faults{Latency: latency})

	start := time.Now()
	_, err := b.client.Charge(t.Context(), unique("key"), rub(unique("pay")))
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), latency, "a charge takes at least the latency")

	t.Run("a client that gives up during the latency charges nothing", func(t *testing.T) {
		t.Parallel()
		slow := setup(t, nil, provider.Faults{Latency: time.Hour})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		t.Cleanup(cancel)
		key := unique("key")
		_, err := slow.client.Charge(ctx, key, rub(unique("pay")))
		require.ErrorIs(t, err, provider.ErrUnavailable)
		require.ErrorIs(t, err, context.DeadlineExceeded, "the caller's own deadline shows through")
		// The GET endpoints have no latency: with an hour of it, this
		// would time out.
		fast := provider.NewClient(slow.url, &http.Client{Timeout: 5 * time.Second})
		_, err = fast.Lookup(t.Context(), key)
		require.ErrorIs(t, err, provider.ErrNotFound)
		require.Zero(t, slow.srv.Stats().Charges)
	})
}

// TestSeedReproducesFaults runs the same requests through two servers with
// the same seed: the same charges are declined.
func TestSeedReproducesFaults(t *testing.T) {
	t.Parallel()
	outcomes := func(seed int64) []string {
		b := setup(t, nil, provider.Faults{DeclineRate: 0.5, Seed: seed})
		var got []string
		for i := range 40 {
			ch, err := b.client.Charge(t.Context(), fmt.Sprintf("key-%d", i), rub("pay"))
			require.NoError(t, err)
			got = append(got, ch.Status)
		}
		return got
	}
	first := outcomes(42)
	require.Equal(t, first, outcomes(42), "one seed, one sequence")
	require.Contains(t, first, provider.StatusDeclined, "a rate of one half declines some")
	require.Contains(t, first, provider.StatusSucceeded, "and lets some through")
}

func TestNewServerRefusesInvalidFaults(t *testing.T) {
	t.Parallel()
	require.PanicsWithValue(t, "provider.NewServer: fail rate 2 is outside [0, 1]", func() {
		provider.NewServer(provider.NewMemoryStore(), provider.Faults{FailRate: 2}, nil)
	})
}
