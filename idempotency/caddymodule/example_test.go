package caddymodule_test

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/oncekey/oncekey/idempotency/caddymodule"
)

// The directive as a Caddyfile gives it, before reverse_proxy.
func Example() {
	d := caddyfile.NewTestDispenser(`idempotency {
		scope {http.request.header.X-Account-Id}
		ttl 24h
	}`)
	var h caddymodule.Handler
	if err := h.UnmarshalCaddyfile(d); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(h.Scope, time.Duration(h.TTL), h.Validate())
	// Output: {http.request.header.X-Account-Id} 24h0m0s <nil>
}
