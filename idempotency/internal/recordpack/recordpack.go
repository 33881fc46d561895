// Package recordpack keeps a completed record's fingerprint and response as
// one string, for the stores and caches that hold records in process
// memory (memstore, recordcache).
//
// A record kept as an idempotency.Record is a tree of pointers: the record,
// its header map and the map's groups, a slice of values per header, the
// body. The garbage collector walks every one of them, in every record, at
// every cycle, and a store that keeps each key for 48 hours keeps a great
// many. Packed, a record is one allocation that holds no pointers: the
// collector marks it and never looks inside, and it takes two words in the
// structure that holds it.
//
// Unpacking builds the caller's own Record, as the store contract asks of
// a record a claim returns: a new header map and new value slices, and a
// new body. The header's names and values are substrings of the packed
// string; strings cannot be written to, so sharing them shares nothing a
// caller could change.
package recordpack

import (
	"encoding/binary"
	"net/http"
	"strings"
	"time"

	"github.com/oncekey/oncekey/idempotency"
)

// Packed is a record's fingerprint, status, headers and body, as one
// string, which nothing can change once packed: it can be read without a
// lock by whoever got hold of it. The layout:
//
//	fingerprint     32 bytes
//	flags           1 byte (flagNilBody)
//	status          varint
//	header names    uvarint
//	header values   uvarint (of all names together)
//	section length  uvarint
//	pieces, size    two uvarints, with flagPieces only
//	header section  per name: uvarint length, name, uvarint count+1 (0
//	                for nil), then per value: uvarint length, value
//	body            the rest
//
// The counts come first so that Response allocates each part of the
// response once, at its final size.
type Packed string

// flagNilBody marks a response whose Body was nil, so that it unpacks as
// nil again rather than empty; flagPieces one whose body is stored in
// pieces (Response.Pieces), whose count and size follow the counts.
const (
	flagNilBody = 1 << 0
	flagPieces  = 1 << 1
)

// fingerprintSize is the length of the fingerprint at the start.
const fingerprintSize = len(idempotency.Fingerprint{})

// Pack encodes fp and resp into a Packed of its own: nothing of resp is
// shared, so the caller may reuse its buffers at once.
func Pack(fp idempotency.Fingerprint, resp idempotency.Response) Packed {
	// The header is read once, sizing the record as it goes, into fields
	// kept on the stack for the handful of headers a record has; a map is
	// walked again only for more.
	type field struct {
		name   string
		values []string
	}
	var fieldsBuf [8]field
	fields := fieldsBuf[:0]
	names, values, section := 0, 0, 0
	for name, vv := range resp.Header {
		names++
		values += len(vv)
		section += uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(vv))+1)
		for _, v := range vv {
			section += uvarintLen(uint64(len(v))) + len(v)
		}
		if len(fields) < cap(fields) {
			fields = append(fields, field{name, vv})
		}
	}
	var flags byte
	if resp.Body == nil {
		flags |= flagNilBody
	}
	if resp.Pieces > 0 {
		flags |= flagPieces
	}
	var head [fingerprintSize + 1 + 6*binary.MaxVarintLen64]byte
	h := append(head[:0], fp[:]...)
	h = append(h, flags)
	h = binary.AppendVarint(h, int64(resp.Status))
	h = binary.AppendUvarint(h, uint64(names))
	h = binary.AppendUvarint(h, uint64(values))
	h = binary.AppendUvarint(h, uint64(section))
	if resp.Pieces > 0 {
		h = binary.AppendUvarint(h, uint64(resp.Pieces))
		h = binary.AppendUvarint(h, uint64(resp.Size))
	}

	var b strings.Builder
	b.Grow(len(h) + section + len(resp.Body))
	b.Write(h)
	if len(fields) == names {
		for _, f := range fields {
			writeField(&b, f.name, f.values)
		}
	} else {
		for name, vv := range resp.Header {
			writeField(&b, name, vv)
		}
	}
	b.Write(resp.Body)
	return Packed(b.String())
}

// writeField writes one header name and its values, as Packed lays them
// out.
func writeField(b *strings.Builder, name string, values []string) {
	writeString(b, name)
	if values == nil {
		writeUvarint(b, 0)
		return
	}
	writeUvarint(b, uint64(len(values))+1)
	for _, v := range values {
		writeString(b, v)
	}
}

// Fingerprint is the packed record's fingerprint.
func (p Packed) Fingerprint() idempotency.Fingerprint {
	var fp idempotency.Fingerprint
	copy(fp[:], p[:fingerprintSize])
	return fp
}

// Status is the packed response's status.
func (p Packed) Status() int {
	status, _ := readVarint(string(p), fingerprintSize+1)
	return int(status)
}

// layout is where the parts of a packed record are.
type layout struct {
	status        int
	nilBody       bool
	names, values int
	section, body int // offsets of the header section and of the body
	pieces        int
	size          int64
}

// layout reads where p's parts are from the counts at its start.
func (p Packed) layout() layout {
	s := string(p)
	l := layout{nilBody: s[fingerprintSize]&flagNilBody != 0}
	status, i := readVarint(s, fingerprintSize+1)
	names, i := readUvarint(s, i)
	values, i := readUvarint(s, i)
	section, i := readUvarint(s, i)
	if s[fingerprintSize]&flagPieces != 0 {
		var pieces, size uint64
		pieces, i = readUvarint(s, i)
		size, i = readUvarint(s, i)
		l.pieces, l.size = int(pieces), int64(size)
	}
	l.status, l.names, l.values = int(status), int(names), int(values)
	l.section, l.body = i, i+int(section)
	return l
}

// Body is a copy of the packed response's body, nil if it was nil.
func (p Packed) Body() []byte {
	l := p.layout()
	if l.nilBody {
		return nil
	}
	return []byte(p[l.body:])
}

// Response unpacks the response as the caller's own: a new header, never
// nil, whose values of each name have no spare capacity (as with
// http.Header.Clone), so that appending to one never writes into
// another, and a new body.
func (p Packed) Response() idempotency.Response {
	s, l := string(p), p.layout()
	resp := idempotency.Response{Status: l.status, Header: make(http.Header, l.names), Body: p.Body(), Pieces: l.pieces, Size: l.size}
	// One slice holds every value: a record's header costs two
	// allocations (the map, the values), not one more per name.
	all := make([]string, l.values)
	i := l.section
	for range l.names {
		var name string
		var count uint64
		name, i = readString(s, i)
		count, i = readUvarint(s, i)
		if count == 0 {
			resp.Header[name] = nil
			continue
		}
		n := int(count - 1)
		vv := all[:n:n]
		all = all[n:]
		for j := range vv {
			vv[j], i = readString(s, i)
		}
		resp.Header[name] = vv
	}
	return resp
}

// Record unpacks the record that p holds, with the times its keeper keeps
// beside it, as the caller's own (see Response).
func (p Packed) Record(createdAt, expiresAt time.Time) *idempotency.Record {
	return &idempotency.Record{Fingerprint: p.Fingerprint(), Response: p.Response(), CreatedAt: createdAt, ExpiresAt: expiresAt}
}

// writeString writes s as Packed holds a string: its length, then its
// bytes.
func writeString(b *strings.Builder, s string) {
	writeUvarint(b, uint64(len(s)))
	b.WriteString(s)
}

// writeUvarint writes x as binary.AppendUvarint does, through a buffer on
// the stack.
func writeUvarint(b *strings.Builder, x uint64) {
	var buf [binary.MaxVarintLen64]byte
	b.Write(binary.AppendUvarint(buf[:0], x))
}

// readString reads the length-prefixed string at s[i:] and returns it (a
// substring of s: no allocation) and the offset after it.
func readString(s string, i int) (string, int) {
	length, i := readUvarint(s, i)
	end := i + int(length)
	return s[i:end], end
}

// readUvarint is binary.Uvarint of s[i:], which Pack wrote: it returns the
// value and the offset after it.
func readUvarint(s string, i int) (uint64, int) {
	var x uint64
	var shift uint
	for {
		b := s[i]
		i++
		x |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return x, i
		}
		shift += 7
	}
}

// readVarint is binary.Varint of s[i:], as readUvarint.
func readVarint(s string, i int) (int64, int) {
	ux, i := readUvarint(s, i)
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x, i
}

// uvarintLen is how many bytes binary.AppendUvarint writes for x.
func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}
