package grpcidem

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/oncekey/oncekey/idempotency"
)

// How an answer is kept in the engine's record (idempotency.Response):
// the status code in one header, the allow-listed metadata in another, the
// message (or the google.rpc.Status of an error) as the body.
const (
	mediaType      = "application/protobuf"
	headerCode     = "Grpc-Code"
	headerMetadata = "Grpc-Metadata"
)

// stored are the codes whose answers are the method's outcome, kept and
// replayed like an HTTP 4xx: the method ran and decided. Every other code
// is kept from the record, so that a retry runs the method again: it broke
// off (CANCELED, DEADLINE_EXCEEDED), failed on the server (INTERNAL,
// UNKNOWN, DATA_LOSS, UNIMPLEMENTED), is transient (UNAVAILABLE, ABORTED,
// RESOURCE_EXHAUSTED) or refused the call before it could start
// (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED), as HTTP's 400,
// 401 and 403 are never stored.
var stored = map[codes.Code]bool{
	codes.OK: true, codes.NotFound: true, codes.AlreadyExists: true,
	codes.FailedPrecondition: true, codes.OutOfRange: true,
}

// refused are the codes of a call refused before it could start, which the
// engine counts as rejected rather than as errors.
var refused = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.Unauthenticated: true, codes.PermissionDenied: true,
	codes.ResourceExhausted: true, codes.Canceled: true,
}

// httpStatus is the engine's status for an answer of code c: a stored
// status for the codes kept (200, 422), a refusal (400) or a server error
// (500) for the others, which free the key.
func httpStatus(c codes.Code) int {
	switch {
	case c == codes.OK:
		return 200
	case stored[c]:
		return 422
	case refused[c]:
		return 400
	}
	return 500
}

// record is the response Finish keeps of what the handler returned: its
// code, its allow-listed metadata, and its message or error status.
func (i *Interceptor[U]) record(resp any, err error, stream *recordingStream) idempotency.Response {
	st := status.Convert(err)
	var body []byte
	var merr error
	if st.Code() == codes.OK {
		if msg, ok := resp.(proto.Message); ok {
			body, merr = proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		}
	} else {
		body, merr = proto.Marshal(st.Proto())
	}
	if merr != nil {
		return idempotency.Response{Status: 500} // not stored: a retry runs again
	}
	h := map[string][]string{headerCode: {strconv.Itoa(int(st.Code()))}}
	if stream != nil {
		if lines := stream.kept(i.cfg.ReplayMetadata); len(lines) > 0 {
			h[headerMetadata] = lines
		}
	}
	return idempotency.Response{Status: httpStatus(st.Code()), Header: h, Body: body}
}

// replay sends a stored answer again: its metadata, with
// idempotent-replayed, and its message or error status.
func (m *method[U]) replay(ctx context.Context, resp idempotency.Response) (any, error) {
	header := metadata.Pairs(ReplayedMetadata, "true")
	trailer := metadata.MD{}
	for _, line := range resp.Header[headerMetadata] {
		kind, key, value, ok := parseMetadata(line)
		switch {
		case !ok:
			continue
		case kind == 'h':
			header.Append(key, value)
		default:
			trailer.Append(key, value)
		}
	}
	_ = grpc.SetHeader(ctx, header)
	if len(trailer) > 0 {
		_ = grpc.SetTrailer(ctx, trailer)
	}
	var code int
	var err error
	if v := resp.Header[headerCode]; len(v) == 1 {
		code, err = strconv.Atoi(v[0])
	} else {
		err = errors.New("no code")
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpcidem: %s: the stored answer has no status code", m.name)
	}
	if codes.Code(code) != codes.OK {
		var st spb.Status
		if err := proto.Unmarshal(resp.Body, &st); err != nil {
			return nil, status.Errorf(codes.Internal, "grpcidem: %s: the stored status does not decode: %v", m.name, err)
		}
		return nil, status.ErrorProto(&st)
	}
	msg := m.output.New().Interface()
	if err := proto.Unmarshal(resp.Body, msg); err != nil {
		return nil, status.Errorf(codes.Internal, "grpcidem: %s: the stored answer does not decode: %v", m.name, err)
	}
	return msg, nil
}

// withRetryInfo is a status of code c that tells the client when to retry.
func withRetryInfo(c codes.Code, msg string, after time.Duration) error {
	st, err := status.New(c, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)})
	if err != nil {
		return status.Error(c, msg)
	}
	return st.Err()
}
