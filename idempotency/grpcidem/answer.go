package grpcidem

import (
	"bytes"
	"context"
	"encoding/base64"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// How an answer is kept in the engine's record, whose response is HTTP's:
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
// status for the codes kept, a refusal or a server error for the others.
func httpStatus(c codes.Code) int {
	switch {
	case c == codes.OK:
		return http.StatusOK
	case stored[c]:
		return http.StatusUnprocessableEntity
	case refused[c]:
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// record writes what the handler returned into the engine's recorder w.
func (i *Interceptor[U]) record(w http.ResponseWriter, c call, stream *recordingStream) {
	st := status.Convert(c.err)
	var body []byte
	var err error
	if st.Code() == codes.OK {
		if msg, ok := c.resp.(proto.Message); ok {
			body, err = proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		}
	} else {
		body, err = proto.Marshal(st.Proto())
	}
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set(headerCode, strconv.Itoa(int(st.Code())))
	if stream != nil {
		h[headerMetadata] = stream.kept(i.cfg.ReplayMetadata)
	}
	w.WriteHeader(httpStatus(st.Code()))
	_, _ = w.Write(body)
}

// replay sends a stored answer again: its metadata, with
// idempotent-replayed, and its message or error status.
func (m *method[U]) replay(ctx context.Context, a *answer) (any, error) {
	header := metadata.Pairs(ReplayedMetadata, "true")
	trailer := metadata.MD{}
	for _, line := range a.header.Values(headerMetadata) {
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
	code, err := strconv.Atoi(a.header.Get(headerCode))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpcidem: %s: the stored answer has no status code", m.name)
	}
	if codes.Code(code) != codes.OK {
		var st spb.Status
		if err := proto.Unmarshal(a.body.Bytes(), &st); err != nil {
			return nil, status.Errorf(codes.Internal, "grpcidem: %s: the stored status does not decode: %v", m.name, err)
		}
		return nil, status.ErrorProto(&st)
	}
	msg := m.output.New().Interface()
	if err := proto.Unmarshal(a.body.Bytes(), msg); err != nil {
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

// answer is the engine's response writer for one call: what it answered,
// for serve to turn into the call's answer.
type answer struct {
	header http.Header
	status int
	body   bytes.Buffer
	err    error // the protocol's refusal or failure, from refusal
}

func newAnswer() *answer { return &answer{header: http.Header{}} }

func (a *answer) Header() http.Header { return a.header }

func (a *answer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *answer) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(p)
}

// recordingStream passes a handler's header and trailer metadata on to the
// call's stream and keeps a copy, to store with the answer.
type recordingStream struct {
	grpc.ServerTransportStream
	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
}

// recordMetadata returns ctx with a stream that records the metadata the
// handler sets, or ctx as it is when it has no stream (a handler called
// without a server).
func recordMetadata(ctx context.Context) (context.Context, *recordingStream) {
	next := grpc.ServerTransportStreamFromContext(ctx)
	if next == nil {
		return ctx, nil
	}
	s := &recordingStream{ServerTransportStream: next, header: metadata.MD{}, trailer: metadata.MD{}}
	return grpc.NewContextWithServerTransportStream(ctx, s), s
}

func (s *recordingStream) SetHeader(md metadata.MD) error {
	if err := s.ServerTransportStream.SetHeader(md); err != nil {
		return err
	}
	s.keep(s.header, md)
	return nil
}

func (s *recordingStream) SendHeader(md metadata.MD) error {
	if err := s.ServerTransportStream.SendHeader(md); err != nil {
		return err
	}
	s.keep(s.header, md)
	return nil
}

func (s *recordingStream) SetTrailer(md metadata.MD) error {
	if err := s.ServerTransportStream.SetTrailer(md); err != nil {
		return err
	}
	s.keep(s.trailer, md)
	return nil
}

func (s *recordingStream) keep(into, md metadata.MD) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range md {
		into[strings.ToLower(k)] = append(into[strings.ToLower(k)], v...)
	}
}

// kept is the allow-listed metadata (New took the never-replayed names off
// the list), one line each: "h key value" for headers, "t key value" for
// trailers, the value in base64 so that binary metadata survives any store.
func (s *recordingStream) kept(allowed []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lines []string
	for _, part := range []struct {
		kind string
		md   metadata.MD
	}{{"h", s.header}, {"t", s.trailer}} {
		for _, k := range slices.Sorted(maps.Keys(part.md)) {
			if !slices.Contains(allowed, k) {
				continue
			}
			for _, v := range part.md[k] {
				lines = append(lines, part.kind+" "+k+" "+base64.StdEncoding.EncodeToString([]byte(v)))
			}
		}
	}
	return lines
}

// parseMetadata reads one line of kept.
func parseMetadata(line string) (kind byte, key, value string, ok bool) {
	parts := strings.SplitN(line, " ", 3)
	if len(parts) != 3 || (parts[0] != "h" && parts[0] != "t") {
		return 0, "", "", false
	}
	v, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil {
		return 0, "", "", false
	}
	return parts[0][0], parts[1], string(v), true
}
