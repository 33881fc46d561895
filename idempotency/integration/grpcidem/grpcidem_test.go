package grpcidem_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/grpcidem"
	"github.com/oncekey/oncekey/idempotency/integration/grpcidem/testpb"
	"github.com/oncekey/oncekey/idempotency/memstore"
	"github.com/oncekey/oncekey/idempotency/pgstore"
	"github.com/oncekey/oncekey/idempotency/pgstore/pgstoretest"
)

func TestMain(m *testing.M) { pgstoretest.Main(m, pgstoretest.Options{}) }

// backend is a store the suite runs on, with the rows its ledger writes
// through the store's unit of work.
type backend[U any] struct {
	open func(t *testing.T) (idempotency.Store[U], *rows[U])
}

// rows writes a charge through a unit of work and counts the committed ones.
type rows[U any] struct {
	write func(ctx context.Context, unit U, id string) error
	count func(t *testing.T) int
}

func memoryBackend() backend[*memstore.Tx] {
	return backend[*memstore.Tx]{open: func(*testing.T) (idempotency.Store[*memstore.Tx], *rows[*memstore.Tx]) {
		var mu sync.Mutex
		committed := 0
		return memstore.New(), &rows[*memstore.Tx]{
			write: func(_ context.Context, tx *memstore.Tx, _ string) error {
				tx.OnCommit(func() { mu.Lock(); committed++; mu.Unlock() })
				return nil
			},
			count: func(*testing.T) int { mu.Lock(); defer mu.Unlock(); return committed },
		}
	}}
}

func postgresBackend() backend[pgx.Tx] {
	return backend[pgx.Tx]{open: func(t *testing.T) (idempotency.Store[pgx.Tx], *rows[pgx.Tx]) {
		_, pool := pgstoretest.Fresh(t)
		_, err := pool.Exec(t.Context(), "CREATE TABLE charges (id text PRIMARY KEY)")
		require.NoError(t, err)
		store, err := pgstore.New(pool, pgstore.Options{})
		require.NoError(t, err)
		return store, &rows[pgx.Tx]{
			write: func(ctx context.Context, tx pgx.Tx, id string) error {
				_, err := tx.Exec(ctx, "INSERT INTO charges (id) VALUES ($1)", id)
				return err
			},
			count: func(t *testing.T) int {
				var n int
				require.NoError(t, pool.QueryRow(context.Background(), "SELECT count(*) FROM charges").Scan(&n))
				return n
			},
		}
	}}
}

// TestInterceptor runs the suite on memstore and on PostgreSQL, over a real
// gRPC server and client on loopback.
func TestInterceptor(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) { t.Parallel(); suite(t, memoryBackend()) })
	t.Run("postgres", func(t *testing.T) { t.Parallel(); suite(t, postgresBackend()) })
}

func suite[U any](t *testing.T, b backend[U]) {
	for _, tc := range []struct {
		name string
		test func(t *testing.T, b backend[U])
	}{
		{"ConcurrentCallsRunOnce", concurrentCallsRunOnce[U]},
		{"ReplayIsByteIdentical", replayIsByteIdentical[U]},
		{"BusinessErrorsAreStored", businessErrorsAreStored[U]},
		{"FailuresAreNotStored", failuresAreNotStored[U]},
		{"SameMessageEncodedOtherwiseReplays", sameMessageEncodedOtherwiseReplays[U]},
		{"MismatchIsFailedPrecondition", mismatchIsFailedPrecondition[U]},
		{"InFlightIsAbortedWithRetryInfo", inFlightIsAborted[U]},
		{"DeadlineMidFlightIsNotStored", deadlineMidFlight[U]},
		{"KeysAreScoped", keysAreScoped[U]},
		{"KeyFromRequestField", keyFromRequestField[U]},
		{"KeyFieldIsNotFingerprinted", keyFieldIsNotFingerprinted[U]},
		{"PerCallMetadataIsNeverReplayed", perCallMetadataIsNeverReplayed[U]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.test(t, b)
		})
	}
}

// ledger is the service under test: each Charge that runs writes one row
// through the call's unit of work and is counted.
type ledger[U any] struct {
	testpb.UnimplementedLedgerServer
	idem *grpcidem.Interceptor[U]
	rows *rows[U]
	runs atomic.Int32
	// gate, when set, holds every Charge until it is closed or the call's
	// context ends; started is told each Charge that reaches it, and
	// finished each that returns.
	gate     chan struct{}
	started  chan struct{}
	finished chan struct{}
	// perCall, when set, is header metadata every Charge sets besides its
	// own.
	perCall metadata.MD
}

func (l *ledger[U]) Charge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Receipt, error) {
	l.runs.Add(1)
	if l.finished != nil {
		defer func() { l.finished <- struct{}{} }()
	}
	if l.started != nil {
		l.started <- struct{}{}
	}
	if l.gate != nil {
		select {
		case <-l.gate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	switch {
	case req.Amount > 1000:
		st, _ := status.New(codes.FailedPrecondition, "insufficient funds").
			WithDetails(&errdetails.ErrorInfo{Reason: "INSUFFICIENT_FUNDS", Domain: "ledger.test"})
		return nil, st.Err()
	case req.Amount == 13:
		return nil, status.Error(codes.Internal, "the ledger tripped")
	}
	id := newID()
	if unit, ok := l.idem.Unit(ctx); ok { // none when a call runs unprotected
		if err := l.rows.write(ctx, unit, id); err != nil {
			return nil, status.Errorf(codes.Internal, "write: %v", err)
		}
	}
	_ = grpc.SetHeader(ctx, metadata.Join(metadata.Pairs("x-ledger-node", "n1", "x-elapsed", "3ms"), l.perCall))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-balance-bin", "\x00\x01balance"))
	return &testpb.Receipt{Id: id, Account: req.Account, Amount: req.Amount}, nil
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "ch_" + hex.EncodeToString(b[:])
}

// principal is the authenticated caller an auth interceptor puts in the
// context, from the "tenant" metadata.
type principal struct{}

func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if t := md.Get("tenant"); len(t) == 1 {
		ctx = context.WithValue(ctx, principal{}, t[0])
	}
	return handler(ctx, req)
}

func scope(ctx context.Context) (string, error) {
	if p, ok := ctx.Value(principal{}).(string); ok {
		return p, nil
	}
	return "", idempotency.ErrNoScope
}

// start serves a ledger covered by an interceptor of cfg on loopback, and
// returns it with a client connection to it.
func start[U any](t *testing.T, b backend[U], cfg grpcidem.Config, m grpcidem.Method) (*ledger[U], *grpc.ClientConn) {
	t.Helper()
	store, rows := b.open(t)
	cfg.Scope = scope
	if cfg.ReplayMetadata == nil {
		cfg.ReplayMetadata = []string{"x-ledger-node", "x-balance-bin"}
	}
	if cfg.Wait == 0 {
		cfg.Wait = 10 * time.Second // duplicates wait out the first call, however busy the machine
	}
	idem := grpcidem.New(store, cfg)
	require.NoError(t, idem.Cover(&testpb.Ledger_ServiceDesc, "Charge", m))
	l := &ledger[U]{idem: idem, rows: rows}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, idem.Unary()))
	testpb.RegisterLedgerServer(srv, l)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return l, conn
}

// keyed is ctx with tenant and key metadata.
func keyed(ctx context.Context, tenant, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "tenant", tenant, "idempotency-key", key)
}

func newKey() string { return newID() }

// result is one call's answer as the client saw it.
type result struct {
	receipt *testpb.Receipt
	err     error
	header  metadata.MD
	trailer metadata.MD
	wire    []byte // the response message's bytes on the wire
}

func (r result) replayed() bool { return len(r.header.Get(grpcidem.ReplayedMetadata)) == 1 }

func charge(ctx context.Context, conn *grpc.ClientConn, req *testpb.ChargeRequest) result {
	var r result
	r.receipt = &testpb.Receipt{}
	r.err = conn.Invoke(ctx, testpb.Ledger_Charge_FullMethodName, req, r.receipt,
		grpc.Header(&r.header), grpc.Trailer(&r.trailer), grpc.ForceCodecV2(wireCodec{wire: &r.wire}))
	return r
}

// wireCodec is the proto codec that keeps the bytes of the message it
// receives, and sends a message of raw bytes as it is.
type wireCodec struct{ wire *[]byte }

func (wireCodec) Name() string { return "proto" }

func (wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if raw, ok := v.(rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(raw)}, nil
	}
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*c.wire = data.Materialize()
	return encoding.GetCodecV2("proto").Unmarshal(data, v)
}

// rawMessage is a request already encoded, sent as these bytes.
type rawMessage []byte

func concurrentCallsRunOnce[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{})
	ctx := keyed(t.Context(), "acme", newKey())
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 250, Labels: map[string]string{"a": "1", "b": "2"}}
	const n = 32
	results := make([]result, n)
	var ready, wg sync.WaitGroup
	ready.Add(n)
	wg.Add(n)
	go0 := make(chan struct{})
	for i := range n {
		go func() {
			defer wg.Done()
			ready.Done()
			<-go0
			results[i] = charge(ctx, conn, req)
		}()
	}
	ready.Wait()
	close(go0)
	wg.Wait()

	require.EqualValues(t, 1, l.runs.Load(), "32 identical calls at once must run the method once")
	require.Equal(t, 1, l.rows.count(t), "one committed row")
	replays := 0
	for i, r := range results {
		require.NoError(t, r.err, "call %d", i)
		require.True(t, proto.Equal(results[0].receipt, r.receipt), "call %d got another answer: %v", i, r.receipt)
		if r.replayed() {
			replays++
		}
	}
	require.Equal(t, n-1, replays, "every call but the one that ran is a replay")
}

func replayIsByteIdentical[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{})
	ctx := keyed(t.Context(), "acme", newKey())
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 250}
	first, again := charge(ctx, conn, req), charge(ctx, conn, req)
	require.NoError(t, first.err)
	require.NoError(t, again.err)
	require.EqualValues(t, 1, l.runs.Load())
	require.False(t, first.replayed())
	require.True(t, again.replayed(), "header %v", again.header)
	require.NotEmpty(t, first.wire)
	require.Equal(t, first.wire, again.wire, "the replay's message bytes are the first answer's")
	require.Equal(t, []string{"n1"}, again.header.Get("x-ledger-node"), "allow-listed header metadata is replayed")
	require.Empty(t, again.header.Get("x-elapsed"), "metadata off the allow-list is not")
	require.Equal(t, first.trailer.Get("x-balance-bin"), again.trailer.Get("x-balance-bin"), "allow-listed binary trailers are replayed")
	require.Equal(t, []string{"\x00\x01balance"}, again.trailer.Get("x-balance-bin"))
}

func businessErrorsAreStored[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{})
	ctx := keyed(t.Context(), "acme", newKey())
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 5000}
	first, again := charge(ctx, conn, req), charge(ctx, conn, req)
	require.EqualValues(t, 1, l.runs.Load(), "a business outcome is stored: the retry does not run")
	for _, r := range []result{first, again} {
		st := status.Convert(r.err)
		require.Equal(t, codes.FailedPrecondition, st.Code(), "%v", r.err)
		require.Equal(t, "insufficient funds", st.Message())
		require.Len(t, st.Details(), 1)
		require.Equal(t, "INSUFFICIENT_FUNDS", st.Details()[0].(*errdetails.ErrorInfo).Reason)
	}
	require.True(t, again.replayed())
}

func failuresAreNotStored[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{})
	ctx := keyed(t.Context(), "acme", newKey())
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 13}
	for i := range 2 {
		r := charge(ctx, conn, req)
		require.Equal(t, codes.Internal, status.Code(r.err), "call %d: %v", i, r.err)
		require.False(t, r.replayed())
	}
	require.EqualValues(t, 2, l.runs.Load(), "INTERNAL is not stored: the retry runs again")
	require.Equal(t, 0, l.rows.count(t))
}

func sameMessageEncodedOtherwiseReplays[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{Exclude: []string{"trace"}})
	ctx := keyed(t.Context(), "acme", newKey())
	first := charge(ctx, conn, &testpb.ChargeRequest{
		Account: "acc-1", Amount: 250, Labels: map[string]string{"a": "1", "b": "2"}, Trace: "t-1",
	})
	require.NoError(t, first.err)

	// The same message as another client might encode it: fields and map
	// entries in reverse order, and another trace, which is excluded.
	var raw []byte
	raw = protowire.AppendTag(raw, 5, protowire.BytesType)
	raw = protowire.AppendString(raw, "t-2")
	for _, kv := range [][2]string{{"b", "2"}, {"a", "1"}} {
		var entry []byte
		entry = protowire.AppendTag(entry, 2, protowire.BytesType)
		entry = protowire.AppendString(entry, kv[1])
		entry = protowire.AppendTag(entry, 1, protowire.BytesType)
		entry = protowire.AppendString(entry, kv[0])
		raw = protowire.AppendTag(raw, 4, protowire.BytesType)
		raw = protowire.AppendBytes(raw, entry)
	}
	raw = protowire.AppendTag(raw, 3, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 250)
	raw = protowire.AppendTag(raw, 2, protowire.BytesType)
	raw = protowire.AppendString(raw, "acc-1")
	decoded := &testpb.ChargeRequest{}
	require.NoError(t, proto.Unmarshal(raw, decoded))
	require.Equal(t, "t-2", decoded.Trace, "the raw request is the message meant")

	var again result
	again.receipt = &testpb.Receipt{}
	again.err = conn.Invoke(ctx, testpb.Ledger_Charge_FullMethodName, rawMessage(raw), again.receipt,
		grpc.Header(&again.header), grpc.ForceCodecV2(wireCodec{wire: &again.wire}))
	require.NoError(t, again.err)
	require.True(t, again.replayed(), "the same message, encoded otherwise, is the same request")
	require.Equal(t, first.wire, again.wire)
	require.EqualValues(t, 1, l.runs.Load())
}

func mismatchIsFailedPrecondition[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{})
	ctx := keyed(t.Context(), "acme", newKey())
	require.NoError(t, charge(ctx, conn, &testpb.ChargeRequest{Account: "acc-1", Amount: 250}).err)
	other := charge(ctx, conn, &testpb.ChargeRequest{Account: "acc-1", Amount: 251})
	require.Equal(t, codes.FailedPrecondition, status.Code(other.err), "%v", other.err)
	require.Contains(t, status.Convert(other.err).Message(), "different request")
	require.EqualValues(t, 1, l.runs.Load())
	require.Equal(t, 1, l.rows.count(t))
}

func inFlightIsAborted[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{Wait: 50 * time.Millisecond, RetryAfter: 2 * time.Second}, grpcidem.Method{})
	l.gate, l.started = make(chan struct{}), make(chan struct{}, 1)
	ctx := keyed(t.Context(), "acme", newKey())
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 250}
	firstDone := make(chan result, 1)
	go func() { firstDone <- charge(ctx, conn, req) }()
	<-l.started // the first call holds the key

	dup := charge(ctx, conn, req)
	st := status.Convert(dup.err)
	require.Equal(t, codes.Aborted, st.Code(), "%v", dup.err)
	require.Len(t, st.Details(), 1, "a RetryInfo detail")
	info, ok := st.Details()[0].(*errdetails.RetryInfo)
	require.True(t, ok, "%T", st.Details()[0])
	require.Equal(t, 2*time.Second, info.RetryDelay.AsDuration())

	close(l.gate)
	first := <-firstDone
	require.NoError(t, first.err)
	again := charge(ctx, conn, req)
	require.NoError(t, again.err)
	require.True(t, again.replayed())
	require.EqualValues(t, 1, l.runs.Load())
}

func deadlineMidFlight[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{})
	l.gate, l.finished = make(chan struct{}), make(chan struct{}, 2)
	key := newKey()
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 250}
	// Long enough for the call to claim its key on a busy machine: the
	// deadline expires while the method runs.
	short, cancel := context.WithTimeout(keyed(t.Context(), "acme", key), 2*time.Second)
	defer cancel()
	first := charge(short, conn, req)
	require.Equal(t, codes.DeadlineExceeded, status.Code(first.err), "%v", first.err)
	<-l.finished // the method saw its deadline and gave up
	require.EqualValues(t, 1, l.runs.Load(), "the first call ran until its deadline")

	close(l.gate) // the retry runs through
	again := charge(keyed(t.Context(), "acme", key), conn, req)
	require.NoError(t, again.err, "a call whose deadline expired mid-flight stored nothing: its retry runs")
	require.False(t, again.replayed())
	require.EqualValues(t, 2, l.runs.Load())
	require.Equal(t, 1, l.rows.count(t), "the call cut off wrote nothing")
}

func keysAreScoped[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{})
	key := newKey()
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 250}
	a := charge(keyed(t.Context(), "acme", key), conn, req)
	other := charge(keyed(t.Context(), "globex", key), conn, req)
	require.NoError(t, a.err)
	require.NoError(t, other.err)
	require.False(t, other.replayed(), "one key in two scopes is two operations")
	require.NotEqual(t, a.receipt.Id, other.receipt.Id)
	require.EqualValues(t, 2, l.runs.Load())

	anonymous := charge(metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", key), conn, req)
	require.Equal(t, codes.Unauthenticated, status.Code(anonymous.err), "%v", anonymous.err)
	missing := charge(metadata.AppendToOutgoingContext(t.Context(), "tenant", "acme"), conn, req)
	require.Equal(t, codes.InvalidArgument, status.Code(missing.err), "%v", missing.err)
	require.EqualValues(t, 2, l.runs.Load(), "refused calls do not run")
	require.Equal(t, 2, l.rows.count(t))
}

func keyFromRequestField[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{KeyField: "request_id", KeyOptional: true})
	ctx := metadata.AppendToOutgoingContext(t.Context(), "tenant", "acme")
	req := &testpb.ChargeRequest{RequestId: newKey(), Account: "acc-1", Amount: 250}
	first, again := charge(ctx, conn, req), charge(ctx, conn, req)
	require.NoError(t, first.err)
	require.True(t, again.replayed(), "request_id keys the call")
	require.EqualValues(t, 1, l.runs.Load())

	other := proto.Clone(req).(*testpb.ChargeRequest)
	other.RequestId = newKey()
	require.False(t, charge(ctx, conn, other).replayed(), "a new request_id is a new operation")

	unkeyed := &testpb.ChargeRequest{Account: "acc-1", Amount: 250}
	for range 2 {
		require.NoError(t, charge(ctx, conn, unkeyed).err, "without a request_id the call runs unprotected (AIP-155)")
	}
	require.EqualValues(t, 4, l.runs.Load())
}

// keyFieldIsNotFingerprinted: the key field carries the key and is no part
// of the request, so a retry that sends its key in metadata instead (a
// client library that moved it, a proxy that reads only metadata) is the
// same request: a replay, whichever way round.
func keyFieldIsNotFingerprinted[U any](t *testing.T, b backend[U]) {
	l, conn := start(t, b, grpcidem.Config{}, grpcidem.Method{KeyField: "request_id"})
	tenant := metadata.AppendToOutgoingContext(t.Context(), "tenant", "acme")
	for _, tc := range []struct{ name, first, retry string }{
		{"field, then metadata", "field", "metadata"},
		{"metadata, then field", "metadata", "field"},
	} {
		key := newKey()
		call := func(where string) result {
			req := &testpb.ChargeRequest{Account: "acc-1", Amount: 250}
			if where == "field" {
				req.RequestId = key
				return charge(tenant, conn, req)
			}
			return charge(keyed(t.Context(), "acme", key), conn, req)
		}
		first, again := call(tc.first), call(tc.retry)
		require.NoError(t, first.err, tc.name)
		require.NoError(t, again.err, "%s: the retry is the same request", tc.name)
		require.True(t, again.replayed(), "%s: the retry is a replay", tc.name)
		require.Equal(t, first.wire, again.wire, tc.name)
	}
	require.EqualValues(t, 2, l.runs.Load(), "each key ran once")
	require.Equal(t, 2, l.rows.count(t))
}

// perCallMetadataIsNeverReplayed: credentials, cookies, the key and gRPC's
// own metadata belong to one call; listed in ReplayMetadata, they are still
// not stored, and a replay, which goes to whoever holds the key, does not
// carry them. What else the list names is replayed.
func perCallMetadataIsNeverReplayed[U any](t *testing.T, b backend[U]) {
	perCall := metadata.Pairs("set-cookie", "session=s1", "authorization", "Bearer for-the-first-caller",
		"grpc-route", "r1", "idempotency-key", "echoed", "x-region", "eu")
	denied := []string{"set-cookie", "authorization", "grpc-route", "idempotency-key"}
	listed := []string{"X-Ledger-Node", "x-region", "Set-Cookie", "Authorization", "grpc-route", "idempotency-key", grpcidem.ReplayedMetadata}
	l, conn := start(t, b, grpcidem.Config{ReplayMetadata: listed}, grpcidem.Method{})
	l.perCall = perCall
	ctx := keyed(t.Context(), "acme", newKey())
	req := &testpb.ChargeRequest{Account: "acc-1", Amount: 250}
	first, again := charge(ctx, conn, req), charge(ctx, conn, req)
	require.NoError(t, first.err)
	require.NoError(t, again.err)
	require.True(t, again.replayed())
	for _, name := range denied {
		require.Equal(t, perCall.Get(name), first.header.Get(name), "the call that ran sends %s", name)
		require.Empty(t, again.header.Get(name), "its replay does not")
	}
	require.Equal(t, []string{"n1"}, again.header.Get("x-ledger-node"))
	require.Equal(t, []string{"eu"}, again.header.Get("x-region"))
	require.Equal(t, []string{"true"}, again.header.Get(grpcidem.ReplayedMetadata), "once")
}

// TestCoverRefuses: what the interceptor cannot cover is refused when it is
// declared, never left uncovered in silence.
func TestCoverRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, method string
		m            grpcidem.Method
		want         string
	}{
		{"streaming", "Watch", grpcidem.Method{}, "streaming method"},
		{"unknown", "Refund", grpcidem.Method{}, "has no method Refund"},
		{"key field missing", "Charge", grpcidem.Method{KeyField: "idempotency_key"}, `no string field "idempotency_key"`},
		{"key field not a string", "Charge", grpcidem.Method{KeyField: "amount"}, `no string field "amount"`},
		{"excluded field missing", "Charge", grpcidem.Method{Exclude: []string{"tracing"}}, `no field "tracing"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			idem := grpcidem.New(idempotency.Store[*memstore.Tx](memstore.New()), grpcidem.Config{Scope: scope})
			err := idem.Cover(&testpb.Ledger_ServiceDesc, tc.method, tc.m)
			require.ErrorContains(t, err, tc.want)
		})
	}
	idem := grpcidem.New(idempotency.Store[*memstore.Tx](memstore.New()), grpcidem.Config{Scope: scope})
	require.NoError(t, idem.Cover(&testpb.Ledger_ServiceDesc, "Charge", grpcidem.Method{}))
	require.ErrorContains(t, idem.Cover(&testpb.Ledger_ServiceDesc, "Charge", grpcidem.Method{}), "covered already")
}

// TestStoreUnavailable: a store that cannot be reached is UNAVAILABLE with
// a RetryInfo, never INTERNAL, and the method does not run.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close()) // nothing listens there now
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr + "/postgres?connect_timeout=2")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgstore.New(pool, pgstore.Options{})
	require.NoError(t, err)
	down := backend[pgx.Tx]{open: func(*testing.T) (idempotency.Store[pgx.Tx], *rows[pgx.Tx]) {
		return store, &rows[pgx.Tx]{}
	}}
	l, conn := start(t, down, grpcidem.Config{RetryAfter: time.Second}, grpcidem.Method{})
	r := charge(keyed(t.Context(), "acme", newKey()), conn, &testpb.ChargeRequest{Account: "acc-1", Amount: 250})
	st := status.Convert(r.err)
	require.Equal(t, codes.Unavailable, st.Code(), "%v", r.err)
	require.Len(t, st.Details(), 1)
	_, ok := st.Details()[0].(*errdetails.RetryInfo)
	require.True(t, ok)
	require.EqualValues(t, 0, l.runs.Load())
	require.False(t, errors.Is(r.err, context.Canceled))
}
