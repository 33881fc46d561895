package redisstore

import (
	"crypto/sha256"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency"
)

func TestRecordEncoding(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 12, 3, 8, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		rec  idempotency.Record
	}{
		{
			name: "order created",
			rec: idempotency.Record{
				Fingerprint: sha256.Sum256([]byte("POST /orders")),
				Response: idempotency.Response{Status: http.StatusCreated, Body: []byte(`{"id":"1"}`), Header: http.Header{
					"Content-Type": {"application/json"}, "Location": {"/orders/1"},
				}},
				CreatedAt: created, ExpiresAt: created.Add(48 * time.Hour),
			},
		},
		{
			name: "empty body, repeated header, bytes that are not UTF-8",
			rec: idempotency.Record{
				Fingerprint: sha256.Sum256([]byte("x")),
				Response: idempotency.Response{Status: http.StatusNoContent, Body: []byte{}, Header: http.Header{
					"Retry-After": {"1", "\xff\x00"},
				}},
				CreatedAt: created, ExpiresAt: created.Add(time.Millisecond),
			},
		},
		{
			name: "body in pieces, kept by the durable store",
			rec: idempotency.Record{
				Fingerprint: sha256.Sum256([]byte("GET /export")),
				Response: idempotency.Response{Status: http.StatusOK, Body: []byte{}, Pieces: 200, Size: 50<<20 + 7, Header: http.Header{
					"Content-Type": {"application/octet-stream"},
				}},
				CreatedAt: created, ExpiresAt: created.Add(24 * time.Hour),
			},
		},
		{
			name: "one piece of one byte, no headers",
			rec: idempotency.Record{
				Response:  idempotency.Response{Status: http.StatusCreated, Body: []byte{}, Pieces: 1, Size: 1, Header: http.Header{}},
				CreatedAt: created, ExpiresAt: created.Add(time.Hour),
			},
		},
		{
			name: "no headers, binary body",
			rec: idempotency.Record{
				Response:  idempotency.Response{Status: http.StatusConflict, Body: []byte{0, 1, 2, 0xff}, Header: http.Header{}},
				CreatedAt: created, ExpiresAt: created.Add(time.Hour),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			raw := encodeRecord(&tt.rec)
			got, err := decodeRecord(raw)
			require.NoError(t, err, "decode what was encoded")
			require.Equal(t, tt.rec, *got, "record after a round trip")

			// Every truncation is refused or decodes to a shorter body,
			// never a panic; the format byte gates everything else.
			for n := range len(raw) {
				if rec, err := decodeRecord(raw[:n]); err == nil {
					require.Less(t, len(rec.Response.Body), len(tt.rec.Response.Body), "truncated to %d bytes", n)
				}
			}
			other := append([]byte{'{'}, raw[1:]...)
			_, err = decodeRecord(other)
			require.ErrorIs(t, err, errRecordFormat, "a record in another format")
		})
	}
}

// TestSealedRecordOpensOnlyUnchanged checks the tag: a sealed record opens
// under its secret and key, and under no other secret or key, nor with any
// one byte of it changed or cut off.
func TestSealedRecordOpensOnlyUnchanged(t *testing.T) {
	t.Parallel()
	record := []byte{recordFormat, 1, 2, 3, 4, 5}
	s := newSealer([]byte("the secret"))
	sealed := s.seal("k:{00}:1:rec", append([]byte(nil), record...))

	got, ok := s.open("k:{00}:1:rec", sealed)
	require.True(t, ok, "the sealed record under its own key")
	require.Equal(t, record, got, "the record opened")
	_, ok = s.open("k:{01}:1:rec", sealed)
	require.False(t, ok, "under another key")
	_, ok = newSealer([]byte("another secret")).open("k:{00}:1:rec", sealed)
	require.False(t, ok, "under another secret")
	_, ok = newSealer(nil).open("k:{00}:1:rec", sealed)
	require.False(t, ok, "under a random secret")
	for i := range sealed {
		changed := append([]byte(nil), sealed...)
		changed[i] ^= 1
		_, ok := s.open("k:{00}:1:rec", changed)
		require.False(t, ok, "byte %d changed", i)
	}
	for n := range len(sealed) {
		_, ok := s.open("k:{00}:1:rec", sealed[:n])
		require.False(t, ok, "cut to %d bytes", n)
	}
}
