package main

import (
	"context"
	"crypto/rand"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/oncekey/oncekey/examples/transfers/transferspb"
	"github.com/oncekey/oncekey/idempotency/grpcidem"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

// TestTransferRunsOnce serves the example on a database of its own and
// retries one transfer: the retry is the first answer, replayed, and one
// transfer is recorded.
func TestTransferRunsOnce(t *testing.T) {
	pool, drop, err := pgstoretest.Database()
	require.NoError(t, err)
	t.Cleanup(drop)
	ctx := context.Background()
	require.NoError(t, migrate(ctx, pool))
	srv, _, err := newServer(pool)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	client := transferspb.NewTransfersClient(conn)

	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer acme")
	req := &transferspb.CreateTransferRequest{RequestId: rand.Text(), FromAccount: "acc-1", ToAccount: "acc-2", AmountCents: 500}
	var header metadata.MD
	first, err := client.CreateTransfer(ctx, req)
	require.NoError(t, err)
	again, err := client.CreateTransfer(ctx, req, grpc.Header(&header))
	require.NoError(t, err)
	require.Equal(t, first.Id, again.Id)
	require.Equal(t, []string{"true"}, header.Get(grpcidem.ReplayedMetadata))

	req.AmountCents = 600 // the same request_id for another transfer
	_, err = client.CreateTransfer(ctx, req)
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)

	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM transfers").Scan(&n))
	require.Equal(t, 1, n)
}
