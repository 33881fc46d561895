// Package schema holds the migrations of the idempotency engine's key
// table (package pgstore applies them with pgstore.Migrate). They live here,
// beside the application's own in schema/, so that all SQL is in one place
// and sqlc generates gen/keydb from them.
package schema

import "embed"

// Migrations are the numbered goose migrations of the key table.
//
//go:embed *.sql
var Migrations embed.FS
