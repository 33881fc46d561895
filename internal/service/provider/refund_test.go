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

// charged makes a succeeded charge of amount (RUB minor units) through b,
// for refunds to be made of.
func charged(t *testing.T, b *testBundle, amount int64) provider.Charge {
	t.Helper()
	ch, err := b.client.Charge(t.Context(), unique("charge-key"), provider.ChargeRequest{Amount: amount, Currency: "RUB", Reference: unique("pay")})
	require.NoError(t, err)
	require.Equal(t, provider.StatusSucceeded, ch.Status)
	return ch
}

func refundOf(ch provider.Charge, amount int64, reference string) provider.RefundRequest {
	return provider.RefundRequest{ChargeID: ch.ID, Amount: amount, Reference: reference}
}

// faultyBeside starts a server with faults beside a healthy one over one
// memory store, and charges 1000 through the healthy one: the faulty one
// then refunds a charge its own faults would not have let it make.
func faultyBeside(t *testing.T, faults provider.Faults) (healthy, faulty *testBundle, ch provider.Charge) {
	t.Helper()
	store := provider.NewMemoryStore()
	healthy, faulty = setup(t, store, provider.Faults{}), setup(t, store, faults)
	return healthy, faulty, charged(t, healthy, 1000)
}

// refusalSentinels are the errors a refused refund may wrap; a test checks
// that exactly the one it expects is there.
var refusalSentinels = []error{provider.ErrChargeNotFound, provider.ErrChargeNotRefundable, provider.ErrRefundExceedsCharge}

func TestNewRefundThenReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	ch := charged(t, b, 1200)
	key, ref := unique("key"), unique("refund")
	body := jsonBody(t, refundOf(ch, 500, ref))

	before := time.Now().Add(-time.Second)
	first := postRefund(t, b.url, key, body)
	require.Equal(t, http.StatusCreated, first.status, "a new key refunds: %s", first.body)
	require.Equal(t, "application/json", first.header.Get("Content-Type"))
	require.Empty(t, first.header.Get(provider.ReplayedHeader), "a new refund is not a replay")
	re := first.refund(t)
	require.True(t, strings.HasPrefix(re.ID, "re_"), "id %q", re.ID)
	require.Equal(t, provider.StatusSucceeded, re.Status)
	require.Empty(t, re.DeclineReason)
	require.Equal(t, refundOf(ch, 500, ref), provider.RefundRequest{ChargeID: re.ChargeID, Amount: re.Amount, Reference: re.Reference})
	require.Equal(t, "RUB", re.Currency, "a refund is in its charge's currency")
	require.WithinRange(t, re.CreatedAt, before, time.Now().Add(time.Second))
	require.Equal(t, time.UTC, re.CreatedAt.Location())
	require.NotContains(t, string(first.body), "decline_reason", "only declined refunds carry a reason")

	replay := postRefund(t, b.url, key, body)
	require.Equal(t, http.StatusOK, replay.status, "the same key and body replays: %s", replay.body)
	require.Equal(t, "true", replay.header.Get(provider.ReplayedHeader))
	require.Equal(t, re, replay.refund(t), "the replay is the stored refund")

	viaClient, err := b.client.Refund(t.Context(), key, refundOf(ch, 500, ref))
	require.NoError(t, err)
	require.Equal(t, re, viaClient, "the client replays it too")

	list, err := b.client.RefundsByReference(t.Context(), ref)
	require.NoError(t, err)
	require.Equal(t, []provider.Refund{re}, list, "one refund however many requests")
	require.Equal(t, provider.Stats{Requests: 1, Charges: 1, RefundRequests: 3, Refunds: 1, RefundReplays: 2}, b.srv.Stats(),
		"refunds have counters of their own; the charge counters count charges only")
}

func TestRefundKeyReusedWithAnotherBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(req *provider.RefundRequest, other provider.Charge)
	}{
		{"charge", func(r *provider.RefundRequest, other provider.Charge) { r.ChargeID = other.ID }},
		{"amount", func(r *provider.RefundRequest, _ provider.Charge) { r.Amount++ }},
		{"reference", func(r *provider.RefundRequest, _ provider.Charge) { r.Reference += "-other" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, provider.Faults{})
			ch, otherCharge := charged(t, b, 1000), charged(t, b, 1000)
			key, req := unique("key"), refundOf(ch, 100, unique("refund"))
			first, err := b.client.Refund(t.Context(), key, req)
			require.NoError(t, err)

			other := req
			tt.change(&other, otherCharge)
			a := postRefund(t, b.url, key, jsonBody(t, other))
			require.Equal(t, http.StatusConflict, a.status, "another %s under a used key: %s", tt.name, a.body)
			require.Contains(t, a.problem(t).Type, idempotency.ProblemOf(idempotency.ErrKeyMismatch).Slug)

			_, err = b.client.Refund(t.Context(), key, other)
			require.ErrorIs(t, err, provider.ErrRejected, "the client reports key reuse as permanent")
			for _, sentinel := range refusalSentinels {
				require.NotErrorIs(t, err, sentinel, "key reuse is no refusal of the refund itself")
			}

			got, err := b.client.LookupRefund(t.Context(), key)
			require.NoError(t, err)
			require.Equal(t, first, got, "the key still holds the first refund")
			st := b.srv.Stats()
			require.Equal(t, int64(1), st.Refunds)
			require.Zero(t, st.RefundReplays, "a refused reuse is no replay")
		})
	}
}

func TestInvalidRefundRequests(t *testing.T) {
	t.Parallel()
	valid := `{"charge_id":"ch_1","amount":100,"reference":"refund-1"}`
	tests := []struct {
		name     string
		headers  []string
		body     string
		wantType string
	}{
		{"no key", nil, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"key too long", []string{"Idempotency-Key", strings.Repeat("k", 256)}, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"key not ASCII", []string{"Idempotency-Key", "ключ"}, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"two keys", []string{"Idempotency-Key", "a", "Idempotency-Key", "b"}, valid, idempotency.ProblemOf(idempotency.ErrInvalidKey).Slug},
		{"not JSON", []string{"Idempotency-Key", "k"}, `amount=100`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"empty body", []string{"Idempotency-Key", "k"}, ``, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"fractional amount", []string{"Idempotency-Key", "k"}, `{"charge_id":"ch_1","amount":1.5,"reference":"r"}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"charge id as a number", []string{"Idempotency-Key", "k"}, `{"charge_id":1,"amount":100,"reference":"r"}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"a currency is not the caller's to give", []string{"Idempotency-Key", "k"}, `{"charge_id":"ch_1","amount":100,"currency":"RUB","reference":"r"}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"a charge's body", []string{"Idempotency-Key", "k"}, `{"amount":100,"currency":"RUB","reference":"r"}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"trailing data", []string{"Idempotency-Key", "k"}, valid + `{}`, idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug},
		{"missing charge id", []string{"Idempotency-Key", "k"}, `{"amount":100,"reference":"r"}`, "validation-error"},
		{"zero amount", []string{"Idempotency-Key", "k"}, `{"charge_id":"ch_1","amount":0,"reference":"r"}`, "validation-error"},
		{"negative amount", []string{"Idempotency-Key", "k"}, `{"charge_id":"ch_1","amount":-5,"reference":"r"}`, "validation-error"},
		{"empty reference", []string{"Idempotency-Key", "k"}, `{"charge_id":"ch_1","amount":1,"reference":""}`, "validation-error"},
		{"reference too long", []string{"Idempotency-Key", "k"}, `{"charge_id":"ch_1","amount":1,"reference":"` + strings.Repeat("я", 256) + `"}`, "validation-error"},
		{"body too large", []string{"Idempotency-Key", "k"}, `{"reference":"` + strings.Repeat("x", 70<<10) + `"}`, idempotency.ProblemOf(idempotency.ErrBodyTooLarge).Slug},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// FailRate=1 too: a malformed request is refused the same way
			// whatever the faults, before any is rolled.
			b := setup(t, nil, provider.Faults{FailRate: 1})
			headers := append([]string{"Content-Type", "application/json"}, tt.headers...)
			p := requireInvalid(t, send(t, http.MethodPost, b.url+"/v1/refunds", tt.body, headers...), tt.wantType)
			if tt.wantType == idempotency.ProblemOf(idempotency.ErrMalformedBody).Slug && strings.Contains(tt.body, "currency") {
				require.Contains(t, p.Detail, `want {"charge_id": string, "amount": integer, "reference": string}`, "the detail shows a refund's shape")
			}
			require.Equal(t, provider.Stats{RefundRequests: 1}, b.srv.Stats(), "nothing refunded, no fault rolled")
		})
	}
}

// TestRefundRefusals covers the refunds the provider refuses for what is
// stored: each is its own problem type and its own error in the client, it
// stores nothing, and the key may then be sent again with a fitting body.
func TestRefundRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		charge     func(t *testing.T, b *testBundle) provider.Charge
		amount     int64
		wantStatus int
		wantType   string
		want       error
	}{
		{"unknown charge", func(*testing.T, *testBundle) provider.Charge { return provider.Charge{ID: "ch_unknown"} }, 1,
			http.StatusNotFound, "charge-not-found", provider.ErrChargeNotFound},
		{"declined charge", func(t *testing.T, b *testBundle) provider.Charge {
			decliner := setup(t, b.store, provider.Faults{DeclineRate: 1})
			ch, err := decliner.client.Charge(t.Context(), unique("key"), rub(unique("pay")))
			require.NoError(t, err)
			require.Equal(t, provider.StatusDeclined, ch.Status)
			return ch
		}, 1, http.StatusConflict, "charge-not-refundable", provider.ErrChargeNotRefundable},
		{"more than the charge", func(t *testing.T, b *testBundle) provider.Charge { return charged(t, b, 1000) }, 1001,
			http.StatusUnprocessableEntity, "refund-exceeds-charge", provider.ErrRefundExceedsCharge},
		{"more than is left", func(t *testing.T, b *testBundle) provider.Charge {
			ch := charged(t, b, 1000)
			_, err := b.client.Refund(t.Context(), unique("key"), refundOf(ch, 990, unique("refund")))
			require.NoError(t, err)
			return ch
		}, 11, http.StatusUnprocessableEntity, "refund-exceeds-charge", provider.ErrRefundExceedsCharge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil, provider.Faults{})
			ch := tt.charge(t, b)
			before := b.srv.Stats()
			key, req := unique("key"), refundOf(ch, tt.amount, unique("refund"))

			a := postRefund(t, b.url, key, jsonBody(t, req))
			require.Equal(t, tt.wantStatus, a.status, "body %s", a.body)
			p := a.problem(t)
			require.Equal(t, "https://oncekey.dev/problems/fakeprovider/"+tt.wantType, p.Type)
			require.Contains(t, p.Detail, ch.ID, "the detail names the charge")

			_, err := b.client.Refund(t.Context(), key, req)
			require.ErrorIs(t, err, provider.ErrRejected, "a refusal is permanent")
			require.ErrorIs(t, err, tt.want, "and says which refusal")
			for _, sentinel := range refusalSentinels {
				if sentinel != tt.want {
					require.NotErrorIs(t, err, sentinel)
				}
			}
			require.NotErrorIs(t, err, provider.ErrNotFound, "no such charge is not nothing under the key")
			require.Contains(t, err.Error(), tt.wantType)
			require.NotContains(t, err.Error(), "\n", "one line")

			_, err = b.client.LookupRefund(t.Context(), key)
			require.ErrorIs(t, err, provider.ErrNotFound, "a refusal stores nothing")
			list, err := b.client.RefundsByReference(t.Context(), req.Reference)
			require.NoError(t, err)
			require.Empty(t, list)
			st := b.srv.Stats()
			require.Equal(t, before.Refunds, st.Refunds)
			require.Equal(t, before.RefundReplays, st.RefundReplays, "a refusal is no replay")

			fitting := refundOf(charged(t, b, 1000), 1, req.Reference)
			re, err := b.client.Refund(t.Context(), key, fitting)
			require.NoError(t, err, "the refused key is free for a corrected request")
			require.Equal(t, provider.StatusSucceeded, re.Status)
		})
	}
}

// TestConcurrentRefundsOfOneCharge sends 50 refunds of 30 under different
// keys at once against a charge of 1000: exactly 33 fit, on either store.
func TestConcurrentRefundsOfOneCharge(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, store provider.Store) {
		b := setup(t, store, provider.Faults{})
		ch := charged(t, b, 1000)
		ref := unique("refund")
		body := jsonBody(t, refundOf(ch, 30, ref))
		const n = 50
		answers := together(n, func() answer { return postRefund(t, b.url, unique("key"), body) })

		created, refused := 0, 0
		for _, a := range answers {
			switch a.status {
			case http.StatusCreated:
				created++
			case http.StatusUnprocessableEntity:
				require.Contains(t, a.problem(t).Type, "refund-exceeds-charge")
				refused++
			default:
				require.Failf(t, "unexpected answer", "%d %s", a.status, a.body)
			}
		}
		require.Equal(t, 33, created, "as many as fit in the charge")
		require.Equal(t, n-33, refused, "the rest are refused")

		list, err := b.client.RefundsByReference(t.Context(), ref)
		require.NoError(t, err)
		var total int64
		for _, re := range list {
			total += re.Amount
		}
		require.Len(t, list, 33)
		require.Equal(t, int64(990), total, "never more than the charge")
		require.Equal(t, provider.Stats{Requests: 1, Charges: 1, RefundRequests: n, Refunds: 33}, b.srv.Stats())
	})
}

// TestConcurrentRefundsWithOneKey sends 20 refunds of the whole charge with
// one key at once: one refunds, the others replay it rather than being
// refused for exceeding the charge that refund used up.
func TestConcurrentRefundsWithOneKey(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, store provider.Store) {
		b := setup(t, store, provider.Faults{})
		ch := charged(t, b, 1000)
		key, ref := unique("key"), unique("refund")
		body := jsonBody(t, refundOf(ch, 1000, ref))
		answers := together(20, func() answer { return postRefund(t, b.url, key, body) })
		requireOneCreated(t, answers, func(a answer) string { return a.refund(t).ID })

		list, err := b.client.RefundsByReference(t.Context(), ref)
		require.NoError(t, err)
		require.Len(t, list, 1, "one refund stored")
	})
}

func TestRefundFailFault(t *testing.T) {
	t.Parallel()
	healthy, failing, ch := faultyBeside(t, provider.Faults{FailRate: 1})
	key, req := unique("key"), refundOf(ch, 100, unique("refund"))

	a := postRefund(t, failing.url, key, jsonBody(t, req))
	require.Equal(t, http.StatusInternalServerError, a.status)
	require.Contains(t, a.problem(t).Detail, "nothing was refunded")
	_, err := failing.client.Refund(t.Context(), key, req)
	require.ErrorIs(t, err, provider.ErrUnavailable, "a 500 is transient")
	unknown := postRefund(t, failing.url, unique("key"), jsonBody(t, provider.RefundRequest{ChargeID: "ch_unknown", Amount: 1, Reference: "r"}))
	require.Equal(t, http.StatusInternalServerError, unknown.status, "the fail fault fires before the charge is looked at")

	_, err = healthy.client.LookupRefund(t.Context(), key)
	require.ErrorIs(t, err, provider.ErrNotFound, "a failed request refunds nothing")
	require.Equal(t, provider.Stats{RefundRequests: 3, Faults: provider.FaultStats{Fail: 3}}, failing.srv.Stats())

	re, err := healthy.client.Refund(t.Context(), key, req)
	require.NoError(t, err, "the retry once the provider recovers refunds")
	require.Equal(t, provider.StatusSucceeded, re.Status)
}

// TestRefundTimeoutFault is the dangerous case for refunds: the client
// hears nothing, yet the refund was made; retrying with the same key
// replays it rather than refunding twice.
func TestRefundTimeoutFault(t *testing.T) {
	t.Parallel()
	healthy, hung, ch := faultyBeside(t, provider.Faults{TimeoutRate: 1})
	impatient := provider.NewClient(hung.url, &http.Client{Timeout: 200 * time.Millisecond})
	key, req := unique("key"), refundOf(ch, 600, unique("refund"))

	_, err := impatient.Refund(t.Context(), key, req)
	require.ErrorIs(t, err, provider.ErrUnavailable, "no answer is transient")
	refunded, err := hung.client.LookupRefund(t.Context(), key)
	require.NoError(t, err, "the refund was stored before the answer was lost")
	require.Equal(t, provider.StatusSucceeded, refunded.Status)
	require.Equal(t, provider.Stats{RefundRequests: 1, Refunds: 1, Faults: provider.FaultStats{Timeout: 1}}, hung.srv.Stats())

	_, err = impatient.Refund(t.Context(), key, req)
	require.ErrorIs(t, err, provider.ErrUnavailable, "a replay can time out too")
	require.Equal(t, provider.Stats{RefundRequests: 2, Refunds: 1, RefundReplays: 1, Faults: provider.FaultStats{Timeout: 2}}, hung.srv.Stats())

	a := postRefund(t, healthy.url, key, jsonBody(t, req))
	require.Equal(t, http.StatusOK, a.status, "the retry once the provider recovers replays, not refused for exceeding: %s", a.body)
	require.Equal(t, refunded.ID, a.refund(t).ID, "the same refund, not a second one")
	list, err := healthy.client.RefundsByReference(t.Context(), req.Reference)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

func TestRefundDeclineFault(t *testing.T) {
	t.Parallel()
	healthy, decliner, ch := faultyBeside(t, provider.Faults{DeclineRate: 1})
	key, req := unique("key"), refundOf(ch, 1000, unique("refund"))

	a := postRefund(t, decliner.url, key, jsonBody(t, req))
	require.Equal(t, http.StatusCreated, a.status, "a decline is an answer, not an error: %s", a.body)
	declined := a.refund(t)
	require.Equal(t, provider.StatusDeclined, declined.Status)
	require.Equal(t, provider.DeclineRefundDeclined, declined.DeclineReason)
	require.Equal(t, "RUB", declined.Currency)

	replay, err := decliner.client.Refund(t.Context(), key, req)
	require.NoError(t, err, "a declined refund is not an error")
	require.Equal(t, declined, replay, "the replay is the same declined refund")
	require.Equal(t, provider.Stats{RefundRequests: 2, Refunds: 1, RefundReplays: 1, Faults: provider.FaultStats{Decline: 1}}, decliner.srv.Stats())

	whole, err := healthy.client.Refund(t.Context(), unique("key"), req)
	require.NoError(t, err, "a declined refund takes nothing from the charge")
	require.Equal(t, provider.StatusSucceeded, whole.Status)
	require.Equal(t, int64(1000), whole.Amount)
}

func TestRefundLatency(t *testing.T) {
	t.Parallel()
	const latency = 150 * time.Millisecond
	healthy, slow, ch := faultyBeside(t, provider.Faults{Latency: latency})

	start := time.Now()
	_, err := slow.client.Refund(t.Context(), unique("key"), refundOf(ch, 1, unique("refund")))
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), latency, "a refund takes at least the latency")

	t.Run("a client that gives up during the latency refunds nothing", func(t *testing.T) {
		t.Parallel()
		stalled := setup(t, healthy.store, provider.Faults{Latency: time.Hour})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		t.Cleanup(cancel)
		key := unique("key")
		_, err := stalled.client.Refund(ctx, key, refundOf(ch, 1, unique("refund")))
		require.ErrorIs(t, err, provider.ErrUnavailable)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		_, err = healthy.client.LookupRefund(t.Context(), key)
		require.ErrorIs(t, err, provider.ErrNotFound)
		require.Zero(t, stalled.srv.Stats().Refunds)
	})
}

func TestLookupRefund(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	ch := charged(t, b, 1000)
	key := unique("key")

	_, err := b.client.LookupRefund(t.Context(), key)
	require.ErrorIs(t, err, provider.ErrNotFound, "nothing under a fresh key")
	a := send(t, http.MethodGet, b.url+"/v1/refunds?idempotency_key="+key, "")
	require.Equal(t, http.StatusNotFound, a.status)
	require.Equal(t, "no refund under this idempotency key", a.problem(t).Detail)

	re, err := b.client.Refund(t.Context(), key, refundOf(ch, 100, unique("refund")))
	require.NoError(t, err)
	got, err := b.client.LookupRefund(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, re, got)
	_, err = b.client.Lookup(t.Context(), key)
	require.ErrorIs(t, err, provider.ErrNotFound, "a refund's key holds no charge")
	require.Equal(t, int64(1), b.srv.Stats().RefundRequests, "lookups are not refund requests")
}

func TestRefundsByReferenceListsEveryKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, provider.Faults{})
	ch := charged(t, b, 1000)
	ref := unique("refund")
	var want []provider.Refund
	for i := range 3 {
		re, err := b.client.Refund(t.Context(), fmt.Sprintf("%s-%d", ref, i), refundOf(ch, 10, ref))
		require.NoError(t, err)
		want = append(want, re)
	}
	_, err := b.client.Refund(t.Context(), unique("key"), refundOf(ch, 10, unique("other")))
	require.NoError(t, err)

	got, err := b.client.RefundsByReference(t.Context(), ref)
	require.NoError(t, err)
	require.ElementsMatch(t, want, got, "every key's refund for the reference, and no other")
	charges, err := b.client.ChargesByReference(t.Context(), ref)
	require.NoError(t, err)
	require.Empty(t, charges, "refunds are not listed as charges")

	none, err := b.client.RefundsByReference(t.Context(), unique("unused"))
	require.NoError(t, err)
	require.NotNil(t, none)
	require.Empty(t, none)
	a := send(t, http.MethodGet, b.url+"/v1/refunds?reference="+unique("unused"), "")
	require.JSONEq(t, `{"refunds":[]}`, string(a.body), "no refunds is an empty array, not null")
}

// TestSeedReproducesRefundDeclines runs the same refunds through two
// servers with the same seed: the same refunds are declined.
func TestSeedReproducesRefundDeclines(t *testing.T) {
	t.Parallel()
	outcomes := func(seed int64) []string {
		store := provider.NewMemoryStore()
		ch := charged(t, setup(t, store, provider.Faults{}), 1000)
		b := setup(t, store, provider.Faults{DeclineRate: 0.5, Seed: seed})
		var got []string
		for i := range 40 {
			re, err := b.client.Refund(t.Context(), fmt.Sprintf("key-%d", i), refundOf(ch, 10, "refund"))
			require.NoError(t, err)
			got = append(got, re.Status)
		}
		return got
	}
	first := outcomes(42)
	require.Equal(t, first, outcomes(42), "one seed, one sequence")
	require.Contains(t, first, provider.StatusDeclined)
	require.Contains(t, first, provider.StatusSucceeded)
}
