package postgres

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A deferred operation's unit of work takes only guarded writes: an
// unguarded one would happen even when the key turns out to be taken, and
// a read cannot be answered before the commit.
func TestPipelineRefusesWhatADeferredClaimCannotKeep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := &pipeline{}
	_, err := p.Exec(ctx, "INSERT INTO orders (account_id, id) VALUES ($1, $2)", 1, 2)
	require.ErrorIs(t, err, errUnguardedWrite, "unguarded write")
	_, err = p.Exec(ctx, "INSERT INTO orders SELECT $1 WHERE EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.xmin = pg_current_xact_id_if_assigned()::xid)", 1, 2)
	require.NoError(t, err, "guarded write")
	_, err = p.Query(ctx, "SELECT 1")
	require.ErrorIs(t, err, errDeferredRead, "query")
	require.ErrorIs(t, p.QueryRow(ctx, "SELECT 1").Scan(), errDeferredRead, "query row")
	require.Equal(t, 1, p.batch.Len(), "statements queued")
}
