package caddymodule

import (
	"net/http"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/frontdoor"
)

// frontDoor reads what the operation needs from a request: the key where
// the site's clients put it (a header, or a member of the JSON body), the
// scope and the body, as `oncekey proxy` does (internal/gateway).
type frontDoor struct {
	engine    *idempotency.Engine
	key       frontdoor.KeyPlace
	scope     func(*http.Request) (string, error)
	maxBody   int64
	observer  idempotency.Observer
	operation string
}

// serveWith runs op for each request door has read, with forward as the
// operation; a request it cannot read is refused through the engine.
func serveWith[U any](door frontDoor, op *idempotency.Operation[U], forward http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// For legacyScopes: what the scope resolved to (scopeOf).
		r = withOldScopes(r)
		in, err := door.key.Prepare(w, r, door.scope, door.maxBody)
		if err != nil {
			door.observer.Outcome(door.operation, idempotency.OutcomeRejected)
			door.engine.WriteError(w, r, err)
			return
		}
		op.Serve(w, r, in, forward)
	})
}
