// Package grpcidem runs unary gRPC methods exactly once per idempotency key,
// on the same stores as the HTTP engine: a retried call gets the first
// call's stored answer instead of running its side effect again.
//
// A covered call carries its key in metadata ("idempotency-key") or, as
// AIP-155 has it, in a request field such as request_id. The key belongs to
// the call's scope (Config.Scope: an authenticated principal), and its
// fingerprint is the full method name and the server's deterministic
// serialisation of the decoded request, so two clients that encode one
// message differently send one request. The handler writes through the
// claim's unit of work (Interceptor.Unit), and its answer is stored with the
// key in the same commit.
//
// The statuses a call gets from the protocol itself:
//
//   - a key used for a different request: FAILED_PRECONDITION;
//   - a duplicate of a call still running: ABORTED, with a RetryInfo detail;
//   - a store that cannot be reached: UNAVAILABLE, with a RetryInfo detail;
//   - no or an invalid key: INVALID_ARGUMENT; no scope: UNAUTHENTICATED.
//
// Streaming methods are never covered: Cover refuses them.
package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/oncekey/oncekey/idempotency"
)

// Metadata names of the protocol.
const (
	// DefaultKeyMetadata is the metadata that carries a call's key unless
	// Config.KeyMetadata names another.
	DefaultKeyMetadata = "idempotency-key"
	// ReplayedMetadata is set to "true" in the header metadata of an
	// answer that is a stored one, sent again.
	ReplayedMetadata = "idempotent-replayed"
)

// Config configures an Interceptor. Scope is required; every other field
// has a default.
type Config struct {
	// Scope returns whose keys a call's belong to (a tenant, an
	// authenticated principal): keys of two scopes never meet. An error,
	// or an empty scope, refuses the call: UNAUTHENTICATED, or the error's
	// own status when it is a gRPC status.
	Scope func(ctx context.Context) (string, error)
	// KeyMetadata names the metadata that carries the key (default
	// DefaultKeyMetadata). A method whose Method.KeyField is set reads the
	// field first.
	KeyMetadata string
	// ReplayMetadata lists the header and trailer metadata keys stored with
	// an answer and sent again with its replays. Anything else (request
	// ids, timings) belongs to one call. Default: none. Credentials,
	// cookies, the key, gRPC's own grpc-* metadata and hop-by-hop headers
	// are never stored, whatever it says.
	ReplayMetadata []string
	// TTL is how long a stored answer is replayed (default 48h).
	TTL time.Duration
	// Wait is how long a duplicate waits for a call still running with its
	// key before it gets ABORTED (default 1s).
	Wait time.Duration
	// RetryAfter is the delay the RetryInfo of ABORTED and UNAVAILABLE
	// advises (default 1s).
	RetryAfter time.Duration
	// Logger receives store failures (default slog.Default()).
	Logger *slog.Logger
	// Observer is told every covered call's outcome; operations are named
	// by full method ("/pkg.Service/Method").
	Observer idempotency.Observer
}

// Method says where one covered method's key is and what its fingerprint
// leaves out. The zero Method reads the key from metadata and requires it.
type Method struct {
	// KeyField names a string field of the request that carries the key
	// (AIP-155's request_id). It is left out of the fingerprint; a call
	// that leaves it empty is keyed by metadata.
	KeyField string
	// KeyOptional runs a call that carries no key at all unprotected, as
	// AIP-155 advises ("request IDs should be optional"), instead of
	// refusing it with INVALID_ARGUMENT.
	KeyOptional bool
	// Exclude names more top-level fields of the request that do not
	// change its meaning (a trace id, say): the fingerprint leaves them out.
	Exclude []string
}

// Interceptor is the protocol as a unary server interceptor over one store,
// whose unit of work is of type U. Declare the methods it covers with Cover
// before the server serves; it passes every other call through untouched.
type Interceptor[U any] struct {
	cfg    Config
	engine *idempotency.Engine
	store  idempotency.Store[U]

	mu      sync.RWMutex
	methods map[string]*method[U]
}

// method is one covered method.
type method[U any] struct {
	name     string // "/pkg.Service/Method"
	op       *idempotency.Operation[U]
	keyField protoreflect.FieldDescriptor // nil: metadata only
	optional bool
	exclude  []protoreflect.FieldDescriptor
	output   protoreflect.MessageType
}

// New returns an interceptor whose keys store keeps.
func New[U any](store idempotency.Store[U], cfg Config) *Interceptor[U] {
	if cfg.KeyMetadata == "" {
		cfg.KeyMetadata = DefaultKeyMetadata
	}
	var replay []string
	for _, name := range cfg.ReplayMetadata {
		if name = strings.ToLower(name); !neverReplayed(name, cfg.KeyMetadata) {
			replay = append(replay, name)
		}
	}
	cfg.ReplayMetadata = replay
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second // the engine's default
	}
	engine := idempotency.New(idempotency.Config{
		TTL:        cfg.TTL,
		Wait:       cfg.Wait,
		RetryAfter: cfg.RetryAfter,
		Logger:     cfg.Logger,
		Observer:   cfg.Observer,
	})
	return &Interceptor[U]{cfg: cfg, engine: engine, store: store, methods: map[string]*method[U]{}}
}

// Cover puts the unary method name of the service desc describes (as
// generated: pb.Ledger_ServiceDesc) under the protocol. It refuses a
// streaming method, a method the service does not have, one whose request
// has no such fields as m names, and one covered already; the method's
// .proto must be registered, which importing its generated package does.
func (i *Interceptor[U]) Cover(desc *grpc.ServiceDesc, name string, m Method) error {
	full := "/" + desc.ServiceName + "/" + name
	if !hasMethod(desc, name) {
		for _, s := range desc.Streams {
			if s.StreamName == name {
				return fmt.Errorf("grpcidem: %s is a streaming method; only unary methods can be covered", full)
			}
		}
		return fmt.Errorf("grpcidem: service %s has no method %s", desc.ServiceName, name)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(desc.ServiceName + "." + name))
	if err != nil {
		return fmt.Errorf("grpcidem: %s: its .proto is not registered (import its generated package): %w", full, err)
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return fmt.Errorf("grpcidem: %s is not a method", full)
	}
	output, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return fmt.Errorf("grpcidem: %s: its response type: %w", full, err)
	}
	cov := &method[U]{
		name: full, optional: m.KeyOptional, output: output,
		op: idempotency.NewOperation(i.engine, i.store, idempotency.OperationConfig{Name: full}),
	}
	fields := md.Input().Fields()
	if m.KeyField != "" {
		f := fields.ByName(protoreflect.Name(m.KeyField))
		if f == nil || f.Kind() != protoreflect.StringKind || f.Cardinality() == protoreflect.Repeated {
			return fmt.Errorf("grpcidem: %s: its request %s has no string field %q to carry the key", full, md.Input().FullName(), m.KeyField)
		}
		cov.keyField = f
		cov.exclude = append(cov.exclude, f)
	}
	for _, name := range m.Exclude {
		f := fields.ByName(protoreflect.Name(name))
		if f == nil {
			return fmt.Errorf("grpcidem: %s: its request %s has no field %q to exclude", full, md.Input().FullName(), name)
		}
		cov.exclude = append(cov.exclude, f)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.methods[full] != nil {
		return fmt.Errorf("grpcidem: %s is covered already", full)
	}
	i.methods[full] = cov
	return nil
}

// neverReplayed reports whether no configuration may store the metadata
// name (lower case) with an answer, as the HTTP engine never stores
// credentials, cookies, its key or hop-by-hop headers: they belong to one
// client, one call or one connection, and a replay goes to whoever holds
// the key. gRPC keeps grpc-* for itself (a call's status, timeout,
// encoding, trace), and a name beginning with a colon is an HTTP/2
// pseudo-header.
func neverReplayed(name, keyMetadata string) bool {
	switch name {
	case "authorization", "proxy-authorization", "www-authenticate", "proxy-authenticate",
		"cookie", "set-cookie", "set-cookie2",
		"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade",
		"content-type", "content-length", "user-agent",
		DefaultKeyMetadata, strings.ToLower(keyMetadata), ReplayedMetadata:
		return true
	}
	return strings.HasPrefix(name, "grpc-") || strings.HasPrefix(name, ":")
}

func hasMethod(desc *grpc.ServiceDesc, name string) bool {
	for _, m := range desc.Methods {
		if m.MethodName == name {
			return true
		}
	}
	return false
}

// Unary is the interceptor to install with grpc.ChainUnaryInterceptor (or
// grpc.UnaryInterceptor), after the one that authenticates the call, so
// that Config.Scope finds the principal.
func (i *Interceptor[U]) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		i.mu.RLock()
		m := i.methods[info.FullMethod]
		i.mu.RUnlock()
		if m == nil {
			return handler(ctx, req)
		}
		return i.serve(ctx, m, req, handler)
	}
}

// Unit returns the unit of work of the covered call in ctx: what its
// handler writes through, so that its writes commit with the stored answer
// or not at all.
func (i *Interceptor[U]) Unit(ctx context.Context) (U, bool) {
	unit, ok := ctx.Value(unitKey[U]{i}).(U)
	return unit, ok
}

// serve runs one covered call through the protocol's core: the call is a
// request whose body is its fingerprinted bytes, and the decision is
// turned into the call's answer.
func (i *Interceptor[U]) serve(ctx context.Context, m *method[U], req any, handler grpc.UnaryHandler) (any, error) {
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "grpcidem: %s: the request is a %T, not a protocol buffer", m.name, req)
	}
	key, err := i.key(ctx, m, msg)
	switch {
	case err != nil:
		return nil, statusOf(err, i.cfg.RetryAfter)
	case key == "": // a call without a key, which m lets run unprotected
		return handler(ctx, req)
	}
	scope, err := i.scope(ctx)
	if err != nil {
		return nil, err
	}
	body, err := m.fingerprinted(msg)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "grpcidem: the request cannot be serialised: %v", err)
	}
	// The method's full name is its route and its path, as it was when
	// calls went through the HTTP layer: records stored then still match.
	d, err := m.op.Begin(ctx, idempotency.Request{
		Scope: scope, Key: key, Method: "POST", Route: m.name, Path: m.name, ContentType: mediaType, Body: body,
	})
	switch {
	case err != nil:
		return nil, statusOf(err, i.cfg.RetryAfter)
	case d.Replay != nil:
		return m.replay(ctx, *d.Replay)
	}
	defer d.Abandon(ctx) // a handler that panics stores nothing
	var resp any
	var herr error
	for {
		hctx, stream := recordMetadata(context.WithValue(ctx, unitKey[U]{i}, d.Unit))
		resp, herr = handler(hctx, req)
		if err := d.Finish(ctx, i.record(resp, herr, stream)); err != nil {
			return nil, statusOf(err, i.cfg.RetryAfter)
		}
		if !d.Again {
			break
		}
		// The key was taken over from its expired record: the call's
		// writes and answer were discarded, and it runs again.
	}
	if d.Replay != nil {
		// A concurrent call's claim won the key as this one committed.
		return m.replay(ctx, *d.Replay)
	}
	return resp, herr
}

// unitKey carries a covered call's unit of work to its handler.
type unitKey[U any] struct{ i *Interceptor[U] }

// key returns the call's key: the request's key field when it is set, else
// the key metadata; "" when there is none.
func (i *Interceptor[U]) key(ctx context.Context, m *method[U], msg proto.Message) (string, error) {
	var values []string
	if m.keyField != nil {
		if v := msg.ProtoReflect().Get(m.keyField).String(); v != "" {
			values = []string{v}
		}
	}
	if values == nil {
		md, _ := metadata.FromIncomingContext(ctx)
		values = md.Get(i.cfg.KeyMetadata)
	}
	if len(values) == 0 {
		if m.optional {
			return "", nil
		}
		what := "metadata " + i.cfg.KeyMetadata
		if m.keyField != nil {
			what = "field " + string(m.keyField.Name()) + " or " + what
		}
		return "", fmt.Errorf("%w: send the key in the %s", idempotency.ErrMissingKey, what)
	}
	return idempotency.ParseKey(values)
}

// scope returns the call's scope, or the status that refuses it.
func (i *Interceptor[U]) scope(ctx context.Context) (string, error) {
	if i.cfg.Scope == nil {
		return "", statusOf(idempotency.ErrNoScope, 0)
	}
	scope, err := i.cfg.Scope(ctx)
	if _, isStatus := status.FromError(err); err != nil && isStatus {
		return "", err
	}
	if err != nil || scope == "" {
		return "", statusOf(idempotency.ErrNoScope, 0)
	}
	return scope, nil
}

// fingerprinted is what the fingerprint covers of msg: its deterministic
// serialisation without the excluded fields. Deterministic marshalling
// orders map entries, so two encodings of one message agree.
func (m *method[U]) fingerprinted(msg proto.Message) ([]byte, error) {
	if len(m.exclude) > 0 {
		msg = proto.Clone(msg)
		r := msg.ProtoReflect()
		for _, f := range m.exclude {
			r.Clear(f)
		}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(msg)
}

// statusOf is the gRPC status of one of the protocol's errors. Anything
// that is not the protocol's own is a store that failed: UNAVAILABLE, so
// that the client retries the call with the same key.
func statusOf(err error, retryAfter time.Duration) error {
	switch {
	case errors.Is(err, idempotency.ErrMissingKey), errors.Is(err, idempotency.ErrInvalidKey):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, idempotency.ErrNoScope):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, idempotency.ErrKeyMismatch):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, idempotency.ErrInFlight):
		return withRetryInfo(codes.Aborted, err.Error(), retryAfter)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return withRetryInfo(codes.Unavailable, "the idempotency store is unavailable; retry with the same key", retryAfter)
}
