package caddymodule_test

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/caddymodule"
)

// TestCaddyfile: what the directive takes, and what it refuses, before
// Caddy provisions anything.
func TestCaddyfile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, block string
		// wantErr is in the error of UnmarshalCaddyfile or Validate.
		wantErr string
	}{
		{"every option", "idempotency {\n scope {http.auth.user.id}\n database_url postgres://db/keys\n namespace payments-api\n redis_url redis://r:6379/0\n redis_secret s\n ttl 24h\n wait 2s\n lease 1m\n max_stored_bytes 4096\n store_responses on\n max_body_bytes 8192\n on_unknown retry\n problem_type_base https://example.com/problems/\n operation \"POST /transfers\"\n profile oncekey\n error_template /etc/caddy/errors.json\n key_header X-Idempotency-Key\n}", ""},
		{"a key in the body", "idempotency {\n scope {http.auth.user.id}\n key_body_field /idempotency_key\n}", ""},
		{"a bad profile", "idempotency {\n scope {http.auth.user.id}\n profile stripe\n}", `profile "stripe": want ietf or oncekey`},
		{"a key in two places", "idempotency {\n scope {http.auth.user.id}\n key_header X-Idempotency-Key\n key_body_field /idempotency_key\n}", "not both"},
		{"a body field that is no pointer", "idempotency {\n scope {http.auth.user.id}\n key_body_field idempotency_key\n}", "not a JSON pointer"},
		{"no scope", "idempotency {\n ttl 24h\n}", "scope is required"},
		{"an unknown option", "idempotency {\n scope {http.auth.user.id}\n upstream x\n}", `unknown option "upstream"`},
		{"an option without its value", "idempotency {\n scope\n}", "wrong argument count"},
		{"a bad duration", "idempotency {\n scope {http.auth.user.id}\n ttl soon\n}", `ttl "soon"`},
		{"a bad size", "idempotency {\n scope {http.auth.user.id}\n max_stored_bytes lots\n}", `max_stored_bytes "lots"`},
		{"no answer stored", "idempotency {\n scope {http.auth.user.id}\n store_responses off\n}", ""},
		{"a bad store_responses", "idempotency {\n scope {http.auth.user.id}\n store_responses never\n}", `store_responses "never": want on or off`},
		{"no answer stored, and a size of those stored", "idempotency {\n scope {http.auth.user.id}\n store_responses off\n max_stored_bytes 4096\n}", "store_responses off stores no answer, and max_stored_bytes bounds those stored: give one of them"},
		{"a bad on_unknown", "idempotency {\n scope {http.auth.user.id}\n on_unknown guess\n}", `on_unknown "guess"`},
		{"postgres without a namespace", "idempotency {\n scope {http.auth.user.id}\n database_url postgres://db/keys\n}", "database_url needs a namespace"},
		{"a namespace with a |", "idempotency {\n scope {http.auth.user.id}\n database_url postgres://db/keys\n namespace a|b\n}", `namespace: "a|b" holds a "|"`},
		{"a namespace in memory", "idempotency {\n scope {http.auth.user.id}\n namespace payments-api\n}", ""},
		{"a scope secret, rotated twice", "idempotency {\n scope {http.request.header.Authorization}\n scope_secret {env.IDEMPOTENCY_SCOPE_SECRET}\n scope_secret_previous {env.OLD_SECRET}\n scope_secret_previous {env.OLDER_SECRET}\n}", ""},
		{"a previous secret alone", "idempotency {\n scope {http.auth.user.id}\n scope_secret_previous {env.OLD_SECRET}\n}", "scope_secret_previous needs scope_secret"},
		{"a namespace too long for a scope secret", "idempotency {\n scope {http.auth.user.id}\n scope_secret {env.S}\n namespace " + strings.Repeat("n", 200) + "\n}", "too long for a scope_secret"},
		{"redis without postgres", "idempotency {\n scope {http.auth.user.id}\n redis_url redis://r:6379/0\n}", "redis_url needs database_url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var h caddymodule.Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.block))
			if err == nil {
				err = h.Validate()
			}
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

// TestCaddyfileStoreResponses: store_responses sets the handler's
// StoreResponses (its JSON store_responses), and leaves it unset when not
// given, which stores answers up to max_stored_bytes.
func TestCaddyfileStoreResponses(t *testing.T) {
	t.Parallel()
	for block, want := range map[string]*bool{
		"idempotency {\n scope {http.auth.user.id}\n store_responses off\n}": new(false),
		"idempotency {\n scope {http.auth.user.id}\n store_responses on\n}":  new(true),
		"idempotency {\n scope {http.auth.user.id}\n}":                       nil,
	} {
		var h caddymodule.Handler
		require.NoError(t, h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(block)), block)
		require.Equal(t, want, h.StoreResponses, block)
	}
}
