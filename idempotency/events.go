package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"mime"
	"net/http"
	"time"
)

// headerLastEventID is the header with which a client of an event stream
// (the browser's EventSource, and most others) resumes it: the id of the
// last event it got. Spelled as net/http keys it (Last-Event-ID, as
// clients send it, is not canonical), so that looking it up on every
// replay allocates nothing.
const headerLastEventID = "Last-Event-Id"

// isEventStream reports whether h says its body is an event stream
// (text/event-stream).
func isEventStream(h http.Header) bool {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == "text/event-stream"
}

// maxEventLine is the longest line of an event stream that eventScanner
// reads for an id: an id is short, and a longer line is not one that
// matches.
const maxEventLine = 1024

// eventScanner reads an event stream, as the HTML standard's parser does
// (lines ended by CRLF, LF or CR; an event ended by a blank line; its id
// in a field "id"), for the end of the event whose id is last.
type eventScanner struct {
	last  string
	line  []byte
	long  bool // the line is longer than maxEventLine
	match bool // the event so far has its id set to last
	cr    bool // the byte before was a CR, which a LF may complete
}

// feed reads p, the stream's next bytes, and returns the offset in p just
// past the end of the first event whose id is last, or -1 while none has
// ended.
func (s *eventScanner) feed(p []byte) int {
	for i, b := range p {
		if s.cr && b == '\n' {
			s.cr = false
			continue // the LF of a CRLF: the line ended at its CR
		}
		s.cr = b == '\r'
		if b != '\r' && b != '\n' {
			if len(s.line) < maxEventLine {
				s.line = append(s.line, b)
			} else {
				s.long = true
			}
			continue
		}
		if len(s.line) > 0 || s.long {
			s.field()
			continue
		}
		// A blank line: the event ends.
		if s.match {
			s.match = false
			end := i + 1
			if b == '\r' && end < len(p) && p[end] == '\n' {
				end++
				s.cr = false
			}
			return end
		}
	}
	return -1
}

// field reads the line that just ended.
func (s *eventScanner) field() {
	if !s.long {
		name, value, _ := bytes.Cut(s.line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		if string(name) == "id" && bytes.IndexByte(value, 0) < 0 {
			s.match = string(value) == s.last
		}
	}
	s.line, s.long = s.line[:0], false
}

// resumeAt finds where a replay of a stream, whose body is in pieces from
// to pieces-1, resumes after the event whose id is last (the client's
// Last-Event-ID): the piece, and the offset in it, just past that
// event's end, and how many bytes come before. ok is false when no event
// of the stream stored so far has that id (the replay then sends the
// whole stream: the id names nothing the client can have had of it).
func resumeAt(read func(n int) ([]byte, error), from, pieces int, last string) (piece, offset int, skipped int64, ok bool, err error) {
	s := eventScanner{last: last}
	for i := from; i < pieces; i++ {
		p, err := read(i)
		if err != nil {
			return 0, 0, 0, false, errPieceLost(i, err)
		}
		if p == nil {
			// Not stored yet (a stream that runs): the client cannot have
			// had an event of it.
			return 0, 0, 0, false, nil
		}
		if end := s.feed(p); end >= 0 {
			return i, end, skipped + int64(end), true, nil
		}
		skipped += int64(len(p))
	}
	return 0, 0, 0, false, nil
}

// pieceHead is the first piece of a body stored in pieces: the status and
// the allow-listed headers of its response, so that a request that finds
// the operation still running can follow its body as it is stored
// (Operation.follow), before the record says them.
type pieceHead struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
}

// encode is h as the first piece stores it.
func (h pieceHead) encode() []byte {
	b, _ := json.Marshal(h)
	return b
}

// followPoll is how often a request that follows a body being stored
// looks for its next piece, and followCheck how long it goes without one
// before it reads the key's record again, to learn whether the operation
// still runs.
const (
	followPoll  = 20 * time.Millisecond
	followCheck = 500 * time.Millisecond
)

// follow answers d, a request whose key's held operation runs elsewhere and
// stores its body in pieces as it passes (a stream, or a large body): what
// is stored so far, then each piece as it is stored, until the empty
// piece that ends the body. With a Last-Event-ID that names an event
// stored so far, it resumes after that event. A follower cannot promise a
// length, so it sends none; if the operation stops without ending its
// body (its holder died, the body broke off), the answer breaks off, and
// a retry learns the key's outcome.
func (o *Operation[U]) follow(w http.ResponseWriter, r *http.Request, d *Decision[U]) {
	ctx := r.Context()
	var head pieceHead
	if err := json.Unmarshal(d.follow, &head); err != nil || head.Status == 0 {
		o.e.cfg.Logger.Error("idempotency: the head of a body being stored is unreadable", "error", err)
		o.e.writeError(w, r, ErrUnavailable)
		return
	}
	read := func(n int) ([]byte, error) { return o.store.ReadPiece(ctx, d.Ref, n) }
	n, offset := 1, 0
	if last := r.Header.Get(headerLastEventID); last != "" && isEventStream(head.Header) {
		piece, off, _, ok, err := resumeAt(read, 1, math.MaxInt, last)
		if err != nil {
			o.e.cfg.Logger.Error("idempotency: a body being stored could not be read", "error", err)
			o.e.writeError(w, r, ErrUnavailable)
			return
		}
		if ok {
			n, offset = piece, off
		}
	}
	setReplayHeader(w.Header(), head.Header, -1)
	w.WriteHeader(head.Status)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	quiet := time.Now()
	for {
		p, err := read(n)
		if err != nil {
			o.e.cfg.Logger.Error("idempotency: a body being followed broke off: a piece could not be read", "error", errPieceLost(n, err))
			panic(http.ErrAbortHandler)
		}
		if p != nil {
			if len(p) == 0 {
				return // the end
			}
			if _, err := w.Write(p[min(offset, len(p)):]); err != nil {
				return // the client left
			}
			_ = rc.Flush()
			n, offset, quiet = n+1, 0, time.Now()
			continue
		}
		if time.Since(quiet) >= followCheck {
			more, ok := o.stillStoring(ctx, d, n)
			if !ok {
				o.e.cfg.Logger.Warn("idempotency: a body being followed broke off: its operation stopped before it ended it", "record", recordID(d.req.Scope, d.req.Key))
				panic(http.ErrAbortHandler)
			}
			if !more {
				return
			}
			quiet = time.Now()
		}
		t := time.NewTimer(followPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// stillStoring reads the key's record again for a follower waiting for
// piece n: more pieces may come (more, ok), the body is complete and n is
// past it (!more, ok), or the operation stopped without ending it (!ok).
func (o *Operation[U]) stillStoring(ctx context.Context, d *Decision[U], n int) (more, ok bool) {
	req := ClaimRequest{
		Scope: d.req.Scope, Key: d.req.Key, Fingerprint: d.fp,
		Method: d.req.Method, Route: d.req.Route, TTL: o.cfg.TTL, Wait: minStoreWait, AtOnce: true,
	}
	lease, rec, err := o.store.Claim(ctx, req)
	if lease != nil {
		// The key was freed: the body will never be ended.
		_ = lease.Rollback(ctx)
		return false, false
	}
	if err != nil || rec == nil || !rec.CreatedAt.Equal(d.Ref.ClaimedAt) {
		return false, false
	}
	if h, held := o.heldAt(rec); held {
		return h.State == HeldRunning, h.State == HeldRunning
	}
	return n < rec.Response.Pieces, rec.Response.Pieces > 0
}
