// Package provider is a sandbox payment provider that is itself idempotent,
// the way real card processors are: a charge is stored under the caller's
// Idempotency-Key, and repeating the key replays that charge instead of
// making a second one. Oncekey's background worker charges through it, and
// the tests use its faults (errors, lost answers, declines, latency) to prove
// that an ambiguous failure never turns into a double charge.
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

// The statuses a charge ends in. A charge is never pending: the sandbox
// decides at once, so the caller only has to handle these two.
const (
	StatusSucceeded = "succeeded"
	StatusDeclined  = "declined"
)

// DeclineCardDeclined is the only decline reason the sandbox gives; a real
// provider has many, and a caller should treat any of them as final.
const DeclineCardDeclined = "card_declined"

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
	case r.Reference == "":
		return errors.New("reference must not be empty")
	case utf8.RuneCountInString(r.Reference) > MaxReferenceLength:
		return fmt.Errorf("reference must be at most %d characters", MaxReferenceLength)
	}
	return nil
}

// Fingerprint identifies the request's content. It hashes the JSON encoding
// of the struct rather than a joined string, so that no two different
// requests ("a|b" + "c" vs "a" + "b|c") can share one.
func (r ChargeRequest) Fingerprint() string {
	b, err := json.Marshal(r)
	if err != nil { // cannot happen: the struct holds only strings and an integer
		panic(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

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

// Stats counts what the server did since it started, so that tests can
// assert a fault really fired instead of guessing from timings.
type Stats struct {
	// Requests is every POST /v1/charges received, whatever its outcome.
	Requests int64 `json:"requests"`
	// Charges is new charges stored, declined ones included.
	Charges int64 `json:"charges"`
	// Replays is answers that returned a stored charge for a repeated key
	// (including replays whose answer a timeout fault then lost).
	Replays int64 `json:"replays"`
	// Faults counts the faults that fired.
	Faults FaultStats `json:"faults"`
}

// FaultStats counts fired faults, one counter per kind.
type FaultStats struct {
	// Fail is requests answered 500 before anything was charged.
	Fail int64 `json:"fail"`
	// Timeout is answers withheld and aborted after the charge was stored.
	Timeout int64 `json:"timeout"`
	// Decline is new charges declined.
	Decline int64 `json:"decline"`
}
