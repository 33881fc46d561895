// Package provider is a sandbox payment provider that is itself idempotent,
// the way real card processors are: a charge or a refund is stored under the
// caller's Idempotency-Key, and repeating the key replays it instead of
// making a second one. Oncekey's background worker charges through it, and
// the tests use its faults (errors, lost answers, declines, latency) to prove
// that an ambiguous failure never turns into a double charge or refund, and
// that refunds never add up to more than was charged.
//
// The package holds the HTTP server, its two stores (memory and PostgreSQL,
// kept in step by one conformance suite) and the client the worker uses.
package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// The statuses a charge or a refund ends in. Neither is ever pending: the
// sandbox decides at once, so the caller only has to handle these two.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
)

// The decline reasons the sandbox gives, one for charges and one for
// refunds; a real provider has many, and a caller should treat any of them
// as final.
const (
	DeclineCardDeclined   = "card_declined"
	DeclineRefundDeclined = "refund_declined"
)

// MaxKeyLength and MaxReferenceLength bound what the sandbox stores, as a
// real provider's column widths would.
const (
	MaxKeyLength       = 255
	MaxReferenceLength = 255
)

// ChargeRequest is what a caller asks to be charged. Its three fields make
// up the request's fingerprint: the same key with any other value is a
// different request and is refused (409), never silently replayed.
type ChargeRequest struct {
	// Amount is in minor units (kopecks, cents), always positive.
	Amount int64 `json:"amount"`
	// Currency is an ISO 4217 code: three upper-case letters.
	Currency string `json:"currency"`
	// Reference is free text, typically the caller's payment id, so that
	// every charge made for one payment can be listed (ChargesByReference).
	Reference string `json:"reference"`
}

// Validate reports the first thing wrong with r, in words fit for a 400.
func (r ChargeRequest) Validate() error {
	switch {
	case r.Amount <= 0:
		return errors.New("amount must be a positive integer (minor units)")
	case !isCurrency(r.Currency):
		return errors.New("currency must be three upper-case letters (ISO 4217)")
	}
	return validateReference(r.Reference)
}

// Fingerprint identifies the request's content (see fingerprint).
func (r ChargeRequest) Fingerprint() string { return fingerprint(r) }

// fingerprint hashes the JSON encoding of a request struct rather than a
// joined string, so that no two different requests ("a|b" + "c" vs "a" +
// "b|c") can share one.
func fingerprint(req any) string {
	b, err := json.Marshal(req)
	if err != nil { // cannot happen: requests hold only strings and integers
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// validateReference checks a charge's or refund's reference: the same rule
// for both, so one payment's charges and refunds can share a reference.
func validateReference(ref string) error {
	switch {
	case ref == "":
		return errors.New("reference must not be empty")
	case utf8.RuneCountInString(ref) > MaxReferenceLength:
		return fmt.Errorf("reference must be at most %d characters", MaxReferenceLength)
	}
	return nil
}

// RefundRequest is what a caller asks to be refunded. Like a charge's, its
// three fields make up the fingerprint: the same key with another charge,
// amount or reference is refused (409), never replayed. It has no currency:
// a refund is always in its charge's.
type RefundRequest struct {
	// ChargeID is the charge to refund ("ch_…"); it must exist and have
	// succeeded.
	ChargeID string `json:"charge_id"`
	// Amount is in minor units, always positive; the refunds of one charge
	// never add up to more than its amount.
	Amount int64 `json:"amount"`
	// Reference is free text, typically the caller's refund or payment id,
	// so that every refund made for it can be listed (RefundsByReference).
	Reference string `json:"reference"`
}

// Validate reports the first thing wrong with r, in words fit for a 400.
// Whether the charge exists and has enough left is the store's to say: it
// is a fact about the stored charges, not about the request.
func (r RefundRequest) Validate() error {
	switch {
	case r.ChargeID == "":
		return errors.New("charge_id must not be empty")
	case r.Amount <= 0:
		return errors.New("amount must be a positive integer (minor units)")
	}
	return validateReference(r.Reference)
}

// Fingerprint identifies the request's content (see fingerprint).
func (r RefundRequest) Fingerprint() string { return fingerprint(r) }

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range len(s) {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// ValidateKey checks an Idempotency-Key: 1 to MaxKeyLength printable ASCII
// characters. Keeping to ASCII means the key survives every header, log and
// database column unchanged, so the caller can look it up byte for byte.
func ValidateKey(key string) error {
	if key == "" {
		return errors.New("Idempotency-Key header is required")
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("Idempotency-Key must be at most %d characters", MaxKeyLength)
	}
	for i := range len(key) {
		if key[i] < 0x20 || key[i] > 0x7e {
			return errors.New("Idempotency-Key must be printable ASCII")
		}
	}
	return nil
}

// Charge is the provider's record of one charge, as the API returns it.
type Charge struct {
	// ID is "ch_" and a UUID, made by the provider.
	ID string `json:"id"`
	// Status is StatusSucceeded or StatusDeclined.
	Status string `json:"status"`
	// DeclineReason says why a declined charge was declined; empty otherwise.
	DeclineReason string `json:"decline_reason,omitempty"`
	Amount        int64  `json:"amount"`
	Currency      string `json:"currency"`
	Reference     string `json:"reference"`
	// CreatedAt is when the charge was made, in UTC to the microsecond
	// (PostgreSQL's precision, so both stores answer the same instant).
	CreatedAt time.Time `json:"created_at"`
}

// Refund is the provider's record of one refund, as the API returns it.
type Refund struct {
	// ID is "re_" and a UUID, made by the provider.
	ID string `json:"id"`
	// Status is StatusSucceeded or StatusDeclined. Only a succeeded refund
	// counts against its charge's amount.
	Status string `json:"status"`
	// DeclineReason says why a declined refund was declined; empty otherwise.
	DeclineReason string `json:"decline_reason,omitempty"`
	// ChargeID is the charge refunded.
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
	// Currency is the charge's: the provider fills it in, the caller never
	// gives it.
	Currency  string `json:"currency"`
	Reference string `json:"reference"`
	// CreatedAt is when the refund was made, in UTC to the microsecond, as
	// a charge's is.
	CreatedAt time.Time `json:"created_at"`
}

// The reasons the provider refuses a refund that is well formed. Both stores
// return them (wrapped, with the detail) from InsertRefund, the server turns
// each into its own problem type (see refusals), and the client's Refund
// returns them again, wrapped together with ErrRejected, so a caller can
// tell them apart with errors.Is. Nothing is stored for a refused refund, so
// its key stays free: the caller may send it again, with the same body or a
// corrected one, without the reuse being refused as a mismatch.
var (
	// ErrChargeNotFound: no charge has the refund's charge_id (404
	// charge-not-found).
	ErrChargeNotFound = errors.New("no such charge")
	// ErrChargeNotRefundable: the charge was declined, so nothing was taken
	// that could be given back (409 charge-not-refundable).
	ErrChargeNotRefundable = errors.New("the charge cannot be refunded")
	// ErrRefundExceedsCharge: the refund's amount is more than what the
	// charge's succeeded refunds have left of it (422 refund-exceeds-charge).
	ErrRefundExceedsCharge = errors.New("the refund exceeds what is left of the charge")
)

// chargeNotFound is ErrChargeNotFound with the id asked for.
func chargeNotFound(chargeID string) error {
	return fmt.Errorf("%w: %s", ErrChargeNotFound, chargeID)
}

// checkRefundable reports whether a refund of amount may be made of ch, of
// which refunded is already refunded by succeeded refunds. Both stores
// decide by it, under their lock, so they refuse alike and in the same
// words. It applies to a refund the decline fault is about to decline too:
// whether a refund asks for too much must not depend on the dice.
func checkRefundable(ch Charge, refunded, amount int64) error {
	if ch.Status != StatusSucceeded {
		return fmt.Errorf("%w: charge %s was %s", ErrChargeNotRefundable, ch.ID, ch.Status)
	}
	if left := ch.Amount - refunded; amount > left {
		return fmt.Errorf("%w: %d asked, charge %s has %d of its %d left", ErrRefundExceedsCharge, amount, ch.ID, left, ch.Amount)
	}
	return nil
}

// Stats counts what the server did since it started, so that tests can
// assert a fault really fired instead of guessing from timings. The charge
// counters kept their names and meanings when refunds came; refunds have
// counters of their own.
type Stats struct {
	// Requests is every POST /v1/charges received, whatever its outcome.
	Requests int64 `json:"requests"`
	// Charges is new charges stored, declined ones included.
	Charges int64 `json:"charges"`
	// Replays is answers that returned a stored charge for a repeated key
	// (including replays whose answer a timeout fault then lost).
	Replays int64 `json:"replays"`
	// RefundRequests is every POST /v1/refunds received, whatever its
	// outcome.
	RefundRequests int64 `json:"refund_requests"`
	// Refunds is new refunds stored, declined ones included.
	Refunds int64 `json:"refunds"`
	// RefundReplays is answers that returned a stored refund for a repeated
	// key (including replays whose answer a timeout fault then lost).
	RefundReplays int64 `json:"refund_replays"`
	// Faults counts the faults that fired, on charges and refunds alike.
	Faults FaultStats `json:"faults"`
}

// FaultStats counts fired faults, one counter per kind; each counts both
// POST endpoints.
type FaultStats struct {
	// Fail is requests answered 500 before anything was stored.
	Fail int64 `json:"fail"`
	// Timeout is answers withheld and aborted after the charge or refund
	// was stored (or found, for a replay).
	Timeout int64 `json:"timeout"`
	// Decline is new charges and refunds declined.
	Decline int64 `json:"decline"`
}
