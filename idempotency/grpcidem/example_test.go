package grpcidem_test

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/grpcidem"
	"github.com/oncekey/oncekey/idempotency/memstore"
)

// A covered method runs once per key; the retry gets the stored answer.
// Any generated service is covered alike; this example borrows gRPC's
// health service, whose Check is unary and whose Watch streams. A server
// installs the interceptor with
// grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, idem.Unary())).
func Example() {
	idem := grpcidem.New(idempotency.Store[*memstore.Tx](memstore.New()), grpcidem.Config{
		// Whose keys they are: the principal an authenticating
		// interceptor put in the context.
		Scope: func(ctx context.Context) (string, error) { return "tenant-a", nil },
	})
	if err := idem.Cover(&healthpb.Health_ServiceDesc, "Check", grpcidem.Method{}); err != nil {
		panic(err)
	}
	fmt.Println(idem.Cover(&healthpb.Health_ServiceDesc, "Watch", grpcidem.Method{}))

	runs := 0
	check := func(ctx context.Context, req any) (any, error) {
		runs++
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: healthpb.Health_Check_FullMethodName}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("idempotency-key", "k-1"))
	for range 2 {
		resp, err := idem.Unary()(ctx, &healthpb.HealthCheckRequest{Service: "ledger"}, info, check)
		fmt.Println(resp.(*healthpb.HealthCheckResponse).GetStatus(), err)
	}
	fmt.Println("runs:", runs)
	// Output:
	// grpcidem: /grpc.health.v1.Health/Watch is a streaming method; only unary methods can be covered
	// SERVING <nil>
	// SERVING <nil>
	// runs: 1
}
