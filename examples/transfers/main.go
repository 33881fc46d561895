// Command transfers is an example gRPC service whose CreateTransfer runs
// exactly once per request_id (AIP-155), using only the public packages of
// github.com/oncekey/oncekey/idempotency: grpcidem's interceptor claims the
// key, and pgstore keeps it in PostgreSQL in the same transaction as the
// transfer it records.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres go run .
//
// ADDR overrides the listen address (127.0.0.1:9090). Calls authenticate
// with "authorization: Bearer <tenant>" metadata; keys are the tenant's.
package main

import (
	"cmp"
	"context"
	"errors"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/oncekey/oncekey/examples/transfers/transferspb"
	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/grpcidem"
	"github.com/oncekey/oncekey/idempotency/pgstore"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("set DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/postgres")
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	srv, keys, err := newServer(pool)
	if err != nil {
		return err
	}
	// Expired keys are already free to claim again; purging only keeps the
	// table small.
	go idempotency.Cleanup{Purge: keys.PurgeExpired, Interval: time.Hour, Batch: 1000}.Run(ctx)
	lis, err := net.Listen("tcp", cmp.Or(os.Getenv("ADDR"), "127.0.0.1:9090"))
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	log.Printf("transfers: gRPC on %s", lis.Addr())
	return srv.Serve(lis)
}

// migrate creates the key table and the transfers table.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgstore.Migrate(ctx, pool, pgstore.Options{}); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS transfers (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		tenant text NOT NULL,
		from_account text NOT NULL,
		to_account text NOT NULL,
		amount_cents bigint NOT NULL
	)`)
	return err
}

// newServer is the service: authentication first, then the idempotency
// interceptor, which covers CreateTransfer by its request_id.
func newServer(pool *pgxpool.Pool) (*grpc.Server, *pgstore.Store, error) {
	keys, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		return nil, nil, err
	}
	idem := grpcidem.New(keys, grpcidem.Config{Scope: tenantOf})
	err = idem.Cover(&transferspb.Transfers_ServiceDesc, "CreateTransfer", grpcidem.Method{KeyField: "request_id", KeyOptional: true})
	if err != nil {
		return nil, nil, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, idem.Unary()))
	transferspb.RegisterTransfersServer(srv, &transfers{idem: idem})
	return srv, keys, nil
}

// tenant is the context key of the authenticated tenant.
type tenant struct{}

// authenticate takes the tenant from "authorization: Bearer <tenant>"; a
// real service verifies a token here.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get("authorization")
	if len(auth) != 1 || !strings.HasPrefix(auth[0], "Bearer ") || len(auth[0]) == len("Bearer ") {
		return nil, status.Error(codes.Unauthenticated, `send "authorization: Bearer <tenant>"`)
	}
	return handler(context.WithValue(ctx, tenant{}, strings.TrimPrefix(auth[0], "Bearer ")), req)
}

func tenantOf(ctx context.Context) (string, error) {
	if t, ok := ctx.Value(tenant{}).(string); ok {
		return t, nil
	}
	return "", idempotency.ErrNoScope
}

// transfers records transfers in the transaction that claims the key, so
// a transfer and its stored answer commit together or not at all.
type transfers struct {
	transferspb.UnimplementedTransfersServer
	idem *grpcidem.Interceptor[pgx.Tx]
}

func (s *transfers) CreateTransfer(ctx context.Context, req *transferspb.CreateTransferRequest) (*transferspb.Transfer, error) {
	switch {
	case req.AmountCents <= 0:
		return nil, status.Error(codes.InvalidArgument, "amount_cents must be positive")
	case req.FromAccount == "" || req.ToAccount == "":
		return nil, status.Error(codes.InvalidArgument, "from_account and to_account are required")
	case req.FromAccount == req.ToAccount:
		return nil, status.Error(codes.FailedPrecondition, "an account cannot pay itself")
	}
	tx, ok := s.idem.Unit(ctx)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "send a request_id: a transfer without one could run twice")
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO transfers (tenant, from_account, to_account, amount_cents)
		VALUES ($1, $2, $3, $4) RETURNING id`,
		ctx.Value(tenant{}), req.FromAccount, req.ToAccount, req.AmountCents).Scan(&id)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "record the transfer: %v", err)
	}
	return &transferspb.Transfer{
		Id: "tr_" + strconv.FormatInt(id, 10), FromAccount: req.FromAccount, ToAccount: req.ToAccount, AmountCents: req.AmountCents,
	}, nil
}
