// Command caddy is Caddy with its standard modules and the idempotency
// handler: what `xcaddy build --with
// github.com/oncekey/oncekey/idempotency/caddymodule` builds, and what the
// module's tests run.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/oncekey/oncekey/idempotency/caddymodule"
)

func main() {
	caddycmd.Main()
}
