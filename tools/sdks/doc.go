// Package sdks holds no code: its tests (sdks_test.go) run official SDKs
// that make their own Idempotency-Keys and retry (Stripe's Node SDK, from
// this directory's package.json, and stripe-go) through oncekey proxy and
// through Caddy with the idempotency module, in front of a Stripe-shaped
// upstream that does not deduplicate. make test/sdks runs them.
package sdks
