package recordpack_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/recordpack"
)

// TestRoundTrip: what is packed unpacks exactly, nil and empty apart,
// header names as given (not canonicalised).
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	fp := idempotency.Fingerprint{1, 2, 3, 31: 0xff}
	long := strings.Repeat("v", 300) // a length of two varint bytes
	tests := []struct {
		name string
		resp idempotency.Response
	}{
		{"typical", idempotency.Response{Status: http.StatusCreated, Header: http.Header{
			"Content-Type": {"application/json"}, "Location": {"/orders/1"},
		}, Body: []byte(`{"id":1}`)}},
		{"nil header and body", idempotency.Response{Status: http.StatusNoContent}},
		{"empty body", idempotency.Response{Status: http.StatusOK, Header: http.Header{}, Body: []byte{}}},
		{"nil and empty values", idempotency.Response{Status: http.StatusOK, Header: http.Header{
			"X-Nil": nil, "X-Empty": {}, "X-Two": {"a", ""}, "x-not-canonical": {long},
		}, Body: []byte("x")}},
		{"odd statuses", idempotency.Response{Status: -7}},
		{"held", idempotency.Held{State: idempotency.HeldRunning, Until: time.Unix(1e9, 0)}.Response()},
		{"large body", idempotency.Response{Status: 200, Body: bytes.Repeat([]byte{0, 0x80, 0xff}, 10000)}},
		{"many headers", idempotency.Response{Status: 200, Header: manyHeaders(20)}},
		{"body in pieces", idempotency.Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Pieces: 200, Size: 50 << 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := recordpack.Pack(fp, tt.resp)
			require.Equal(t, fp, p.Fingerprint())
			require.Equal(t, tt.resp.Status, p.Status())
			got := p.Response()
			require.Equal(t, tt.resp.Status, got.Status)
			require.NotNil(t, got.Header)
			require.Len(t, got.Header, len(tt.resp.Header))
			for name, want := range tt.resp.Header {
				v, ok := got.Header[name]
				require.True(t, ok, name)
				require.Equal(t, want == nil, v == nil, name)
				require.Equal(t, len(want), len(v), name)
				for i := range want {
					require.Equal(t, want[i], v[i], name)
				}
			}
			require.Equal(t, tt.resp.Body == nil, got.Body == nil)
			require.True(t, bytes.Equal(tt.resp.Body, got.Body))
			require.Equal(t, tt.resp.Body == nil, p.Body() == nil)
			require.True(t, bytes.Equal(tt.resp.Body, p.Body()))
			require.Equal(t, tt.resp.Pieces, got.Pieces, "pieces")
			require.Equal(t, tt.resp.Size, got.Size, "size")

			created, expires := time.Unix(100, 0), time.Unix(200, 0)
			rec := p.Record(created, expires)
			require.Equal(t, fp, rec.Fingerprint)
			require.Equal(t, created, rec.CreatedAt)
			require.Equal(t, expires, rec.ExpiresAt)
		})
	}
}

// manyHeaders is a header of n names, more than Pack keeps at hand.
func manyHeaders(n int) http.Header {
	h := http.Header{}
	for i := range n {
		h[fmt.Sprintf("X-H%d", i)] = []string{strings.Repeat("v", i), "w"}
	}
	return h
}

// TestOwnership: the packed record shares nothing with what was packed,
// and each unpacked response is its caller's own, whose header values
// can be appended to without writing into each other.
func TestOwnership(t *testing.T) {
	t.Parallel()
	resp := idempotency.Response{Status: 200, Header: http.Header{"A": {"1"}, "B": {"2", "3"}}, Body: []byte("body")}
	p := recordpack.Pack(idempotency.Fingerprint{}, resp)
	resp.Header["A"][0] = "changed"
	resp.Body[0] = 'X'

	first := p.Response()
	require.Equal(t, "1", first.Header.Get("A"))
	require.Equal(t, "body", string(first.Body))
	first.Body[0] = 'Y'
	for name := range first.Header {
		first.Header[name] = append(first.Header[name], "appended")
	}
	require.Equal(t, []string{"1", "appended"}, first.Header["A"])
	require.Equal(t, []string{"2", "3", "appended"}, first.Header["B"])
	first.Header["B"][0] = "changed"

	second := p.Response()
	require.Equal(t, []string{"1"}, second.Header["A"])
	require.Equal(t, []string{"2", "3"}, second.Header["B"])
	require.Equal(t, "body", string(second.Body))
}

// FuzzRoundTrip: any response of one header and a body packs and unpacks
// to itself.
func FuzzRoundTrip(f *testing.F) {
	f.Add(201, "Content-Type", "application/json", "", []byte(`{"id":1}`))
	f.Add(-1, "", "", "\x80\xff", []byte(nil))
	f.Fuzz(func(t *testing.T, status int, name, v1, v2 string, body []byte) {
		if name == "Z" {
			t.Skip("the name of the nil header")
		}
		resp := idempotency.Response{Status: status, Header: http.Header{name: {v1, v2}, "Z": nil}, Body: body}
		got := recordpack.Pack(idempotency.Fingerprint{7}, resp).Response()
		if got.Status != status || len(got.Header) != 2 || got.Header["Z"] != nil ||
			len(got.Header[name]) != 2 || got.Header[name][0] != v1 || got.Header[name][1] != v2 ||
			!bytes.Equal(got.Body, body) || (got.Body == nil) != (body == nil) {
			t.Fatalf("packed %+v, unpacked %+v", resp, got)
		}
	})
}

// BenchmarkPack measures packing and unpacking a typical record, which
// memstore does at every commit and every replay.
func BenchmarkPack(b *testing.B) {
	resp := idempotency.Response{Status: http.StatusCreated, Header: http.Header{
		"Content-Type": {"application/json"}, "Location": {"/orders/ord_0190f7a4"},
	}, Body: []byte(`{"id":"ord_0190f7a4","status":"created","amount":1200,"currency":"RUB"}`)}
	b.Run("pack", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			recordpack.Pack(idempotency.Fingerprint{}, resp)
		}
	})
	b.Run("unpack", func(b *testing.B) {
		p := recordpack.Pack(idempotency.Fingerprint{}, resp)
		b.ReportAllocs()
		for b.Loop() {
			p.Response()
		}
	})
}
