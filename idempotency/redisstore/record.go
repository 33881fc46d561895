package redisstore

import (
	"encoding/binary"
	"errors"
	"net/http"
	"time"

	"github.com/oncekey/oncekey/idempotency"
)

// A cached record is binary, not JSON: a replay from Redis decodes one on
// every request, and JSON (base64 body, RFC 3339 times, a header map) is
// dear to decode (docs/benchmarks.md). The layout:
//
//	format      1 byte, recordFormat
//	fingerprint 32 bytes
//	status      2 bytes, big endian
//	created_at  8 bytes, Unix nanoseconds, big endian
//	expires_at  8 bytes, Unix nanoseconds, big endian
//	pieces      uvarint, Response.Pieces: 0 for a body kept here
//	size        uvarint, Response.Size, with pieces > 0 only
//	headers     uvarint count, then count × (uvarint len, name, uvarint len, value)
//	body        exact bytes (none when pieces > 0)
//	tag         32 bytes, HMAC-SHA256 of the Redis key and all of the above (seal.go)
//
// A body too large to keep in its record is stored in pieces by the
// durable store, never in Redis: the cached record says how many there are
// and how long they are in all, and a replay reads them from the durable
// store (fastPath.ReadPiece) under the record's CreatedAt, which is why
// that is kept to the nanosecond.
//
// The format byte changes with the layout; a record in any other format is
// treated as absent and replaced by the next read-through. (Format 4 added
// pieces and size: a format 3 record read as 4 would lose them, and a
// replay of a large answer would be empty.)
const recordFormat byte = 4

// errRecordFormat is a cached value this replica cannot read.
var errRecordFormat = errors.New("redisstore: cached record in an unknown format")

func encodeRecord(rec *idempotency.Record) []byte {
	n := 1 + len(rec.Fingerprint) + 2 + 8 + 8 + 3*binary.MaxVarintLen64 + len(rec.Response.Body) + macSize
	pairs := 0
	for name, values := range rec.Response.Header {
		for _, v := range values {
			n += 2*binary.MaxVarintLen64 + len(name) + len(v)
			pairs++
		}
	}
	b := make([]byte, 0, n)
	b = append(b, recordFormat)
	b = append(b, rec.Fingerprint[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(rec.Response.Status))
	b = binary.BigEndian.AppendUint64(b, uint64(rec.CreatedAt.UnixNano()))
	b = binary.BigEndian.AppendUint64(b, uint64(rec.ExpiresAt.UnixNano()))
	pieces := max(rec.Response.Pieces, 0)
	b = binary.AppendUvarint(b, uint64(pieces))
	if pieces > 0 {
		b = binary.AppendUvarint(b, uint64(rec.Response.Size))
	}
	b = binary.AppendUvarint(b, uint64(pairs))
	for name, values := range rec.Response.Header {
		for _, v := range values {
			b = appendString(b, name)
			b = appendString(b, v)
		}
	}
	return append(b, rec.Response.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeRecord reads what encodeRecord wrote. raw is not retained: the
// body is copied, so the record outlives the client's read buffer.
func decodeRecord(raw []byte) (*idempotency.Record, error) {
	const fixed = 1 + 32 + 2 + 8 + 8
	if len(raw) < fixed || raw[0] != recordFormat {
		return nil, errRecordFormat
	}
	rec := &idempotency.Record{Response: idempotency.Response{Header: http.Header{}}}
	p := raw[1:]
	p = p[copy(rec.Fingerprint[:], p):]
	rec.Response.Status = int(binary.BigEndian.Uint16(p))
	rec.CreatedAt = time.Unix(0, int64(binary.BigEndian.Uint64(p[2:]))).UTC()
	rec.ExpiresAt = time.Unix(0, int64(binary.BigEndian.Uint64(p[10:]))).UTC()
	p = p[18:]
	pieces, p, err := readUvarint(p)
	if err != nil {
		return nil, err
	}
	if pieces > 0 {
		var size uint64
		if size, p, err = readUvarint(p); err != nil {
			return nil, err
		}
		rec.Response.Pieces, rec.Response.Size = int(pieces), int64(size)
	}
	pairs, p, err := readUvarint(p)
	if err != nil {
		return nil, err
	}
	for range pairs {
		var name, value string
		if name, p, err = readString(p); err != nil {
			return nil, err
		}
		if value, p, err = readString(p); err != nil {
			return nil, err
		}
		rec.Response.Header[name] = append(rec.Response.Header[name], value)
	}
	rec.Response.Body = append([]byte{}, p...)
	return rec, nil
}

var errTruncated = errors.New("redisstore: cached record truncated")

func readUvarint(p []byte) (uint64, []byte, error) {
	v, n := binary.Uvarint(p)
	if n <= 0 {
		return 0, nil, errTruncated
	}
	return v, p[n:], nil
}

func readString(p []byte) (string, []byte, error) {
	n, p, err := readUvarint(p)
	if err != nil || n > uint64(len(p)) {
		return "", nil, errTruncated
	}
	return string(p[:n]), p[n:], nil
}
