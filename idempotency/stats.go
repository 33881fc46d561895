package idempotency

import "time"

// Stats describes a store's keys for operators and metrics. A store that
// never commits a claim before its outcome (pgstore: the key row is
// inserted in the operation's transaction) shows no processing keys: a
// running operation's claim is invisible to other sessions until it commits
// completed.
type Stats struct {
	Processing int64 // keys whose operation is running (or was, if stuck)
	Completed  int64 // keys holding a stored response (an estimate on large tables)
	TableBytes int64 // storage used by keys, indexes included (0 in memory)
	// PiecesBytes is the storage used by the bodies kept in pieces
	// (Response.Pieces), apart from their keys' records: in a database,
	// the disk the pieces table takes with its TOAST and indexes (the
	// space of pieces that cleanup deleted stays counted, reused by new
	// ones); in memory, the pieces' lengths. Large answers can outweigh
	// every key together, so they are watched on their own.
	PiecesBytes int64
	// OldestProcessingAge is how long the oldest processing key has been
	// processing (0 when none).
	OldestProcessingAge time.Duration
	// CleanupLag is the age of the oldest expired key not yet deleted (0 when
	// none): how far cleanup is behind.
	CleanupLag time.Duration
	// Held counts the keys of held operations running now, and Unknown
	// those whose outcome is unknown (see Held): each of those may have
	// run, and waits for an operator.
	Held, Unknown int64
}
