package grpcidem

import (
	"context"
	"encoding/base64"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

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
