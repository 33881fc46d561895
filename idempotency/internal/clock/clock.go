// Package clock lets the engine's tests, in modules of their own, skew an
// engine's clock: the process's, which two processes sharing one store
// may disagree on, and which a held operation's lease must not depend on
// where the store keeps a clock of its own (idempotency.Record.ReadAt).
package clock

import "time"

// Set makes e, an *idempotency.Engine, read the time from now instead of
// time.Now. The engine's package sets it as it loads.
var Set func(e any, now func() time.Time)
