package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// heldKey carries a held operation's verdict slot to its handler.
type heldKey struct{}

// heldVerdict is what the handler of a held operation reports of its
// outcome, besides its response.
type heldVerdict struct {
	unknown error
}

// MarkUnknown reports, from the handler of a held operation, that its
// request may have taken effect and no answer will come (written upstream,
// then a timeout or a reset). The handler writes nothing more: the engine
// records the key as unknown, with cause as the held record's Reason, and
// answers ErrOutcomeUnknown with its fixed detail: cause is for operators
// (the handler logs it), and may name internal addresses that no client
// should see. It reports false outside a held operation.
func MarkUnknown(r *http.Request, cause error) bool {
	v, ok := r.Context().Value(heldKey{}).(*heldVerdict)
	if !ok {
		return false
	}
	v.unknown = cause
	return true
}

// heldSettleMargin is how long before its lease's end a held operation's
// context ends: the time its holder has to record the outcome.
func heldSettleMargin(lease time.Duration) time.Duration {
	return min(lease/4, 5*time.Second)
}

// runHeld runs a held operation, whose hold Begin committed, and settles
// the key with the response (releases it for a response that is not
// stored, as run rolls back). Unlike run, it answers after the settle only
// where the response is stored whole in the record: one that passes
// through is answered as it comes, its key recorded first as not stored,
// and one stored in pieces passes piece by piece as each is stored, its
// last piece held back until the key is settled.
func (s *serving[U]) runHeld(next http.Handler) {
	d, ctx, held := &s.d, s.r.Context(), s.op.held
	finish := func(resp Response) { _ = d.Finish(ctx, resp) }
	stored := func(status int, reason string) {
		if !replayable(status) {
			finish(Response{Status: status})
			return
		}
		finish(Held{State: HeldNotStored, Reason: reason}.Response())
	}
	verdict := &heldVerdict{}
	// The operation's context outlives the client (its outcome is settled
	// all the same) and ends before the lease does, unless the response
	// passes through by then.
	hctx, stop := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), heldKey{}, verdict))
	defer stop()
	w := &heldWriter{recorder: recorder{header: http.Header{}, status: http.StatusOK}, client: s.w, limit: held.MaxStored, through: stored}
	w.pieces = func(n int, p []byte) (bool, error) { return s.op.store.WritePiece(hctx, d.Ref, n, p) }
	// While its body passes in pieces, the holder writes its head again
	// every third of its lease, which renews the lease (Store.WritePiece):
	// a stream may pass for longer than the lease without being taken for
	// an operation whose holder died.
	beat := make(chan struct{})
	var beating sync.WaitGroup
	w.stopBeat = sync.OnceFunc(func() {
		close(beat)
		beating.Wait()
	})
	defer w.stopBeat()
	w.head = func() []byte { return pieceHead{Status: w.status, Header: w.allowed(s.op.e.stored)}.encode() }
	w.beat = func(head []byte) {
		beating.Add(1)
		go func() {
			defer beating.Done()
			t := time.NewTicker(max(held.Lease/3, 10*time.Millisecond))
			defer t.Stop()
			for {
				select {
				case <-beat:
					return
				case <-t.C:
					_, _ = s.op.store.WritePiece(hctx, d.Ref, 0, head)
				}
			}
		}()
	}
	deadline := time.AfterFunc(held.Lease-heldSettleMargin(held.Lease)-time.Since(d.heldSince), func() {
		if !w.passing.Load() {
			stop()
		}
	})
	defer deadline.Stop()
	inner := s.r.WithContext(hctx)
	inner.Body = io.NopCloser(bytes.NewReader(d.req.Body))
	inner.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(d.req.Body)), nil }
	inner.ContentLength = int64(len(d.req.Body))
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		// A handler that gives up midway (httputil.ReverseProxy, when the
		// upstream's body breaks off) has taken the request upstream.
		switch {
		case w.piecing:
			stored(w.status, "the response broke off")
		case w.passing.Load():
		case w.wroteHeader:
			stored(w.status, "the response broke off")
		default:
			finish(Held{State: HeldUnknown, Reason: fmt.Sprint("the operation failed: ", p)}.Response())
		}
		panic(p)
	}()
	next.ServeHTTP(w, inner)

	switch {
	case w.piecing:
		// Stored in pieces as it passed: the last one, then the settle,
		// then the last bytes to the client.
		w.stopBeat()
		if w.piece(w.body.Bytes()) {
			// An empty piece ends the body, for those who follow it.
			if ok, err := w.pieces(w.n, []byte{}); err == nil && ok {
				w.n++
			}
			finish(Response{Status: w.status, Header: w.allowed(s.op.e.stored), Pieces: w.n, Size: w.size})
		}
		_, _ = w.client.Write(w.body.Bytes())
		w.body = bytes.Buffer{}
	case w.passing.Load():
		// Settled as it began to pass (stored).
	case verdict.unknown != nil:
		// The cause is the operator's (the held record's Reason, and the
		// handler's log), never the client's: it may name the upstream's
		// internal address.
		finish(Held{State: HeldUnknown, Reason: verdict.unknown.Error()}.Response())
		s.op.e.writeError(s.w, s.r, ErrOutcomeUnknown)
	case !replayable(w.status):
		finish(Response{Status: w.status})
		w.copyTo(s.w)
	case w.limit < 0:
		// A handler that wrote nothing: its empty 200 is not stored either.
		stored(w.status, "the operation stores no responses")
		w.copyTo(s.w)
	default:
		finish(Response{Status: w.status, Header: w.allowed(s.op.e.stored), Body: w.body.Bytes()})
		w.copyTo(s.w)
	}
}

// heldWriter buffers a held operation's response as the recorder does, up
// to pieceSize. A larger response, and a stream (text/event-stream) from
// its first byte, is stored in pieces as it passes to the client
// (pieces), up to its limit; past the limit, or where the store keeps no
// pieces (past inlineMax, or at once for a stream), it passes through
// unstored. Before the first byte passes unstored, through records the
// key's fate.
type heldWriter struct {
	recorder
	client  http.ResponseWriter
	limit   int64
	through func(status int, reason string)
	// pieces stores piece n of the body (Store.WritePiece); piecing is set
	// once the response is stored so, n counts the pieces stored and size
	// their bytes; noPieces once the store said it keeps none.
	// head is the first piece (pieceHead); beat renews the lease with it
	// from once it is stored until stopBeat (the operation ends, or its
	// response is no longer stored).
	pieces   func(n int, p []byte) (bool, error)
	head     func() []byte
	beat     func(head []byte)
	stopBeat func()
	piecing  bool
	noPieces bool
	n        int
	size     int64
	// passing is set once the response passes through, stored in pieces
	// or not; atomic, as the lease's timer reads it on a goroutine of its
	// own.
	passing atomic.Bool
}

// pieceSize is the most of a held operation's body kept in memory: a
// response up to it is stored whole in its record, a larger one in
// pieces of it. A variable for the tests.
var pieceSize = 256 << 10

// inlineMax is the largest response stored whole in its record where the
// store keeps no pieces (Store.WritePiece unsupported), as before pieces
// were kept.
const inlineMax = 1 << 20

// Header is the buffered response's header, and the client's once the
// response passes through (trailers set after the body go there).
func (w *heldWriter) Header() http.Header {
	if w.passing.Load() {
		return w.client.Header()
	}
	return w.recorder.Header()
}

func (w *heldWriter) WriteHeader(status int) {
	if w.wroteHeader || status < 200 {
		// Interim responses (103 Early Hints) are not the outcome.
		return
	}
	w.recorder.WriteHeader(status)
	if w.limit < 0 {
		w.pass("the operation stores no responses")
		return
	}
	if mt, _, _ := mime.ParseMediaType(w.header.Get("Content-Type")); mt == "text/event-stream" {
		if !replayable(status) {
			w.pass("the response is a stream (text/event-stream)")
			return
		}
		w.startStream()
	}
}

// startStream begins a stream (text/event-stream): its header goes to the
// client at once, and its data is stored a piece at a time as it passes,
// each flush of the operation's (an event, as an upstream sends it) a
// piece stored before the client gets it, so that a client that lost the
// stream gets it whole from its retry.
func (w *heldWriter) startStream() {
	w.piecing = true
	w.passing.Store(true)
	head := w.head()
	ok, err := w.pieces(0, head)
	if reason, stored := pieceTaken(ok, err); stored {
		w.beat(head)
	} else {
		if errors.Is(err, errors.ErrUnsupported) {
			reason = "the response is a stream (text/event-stream), and the store keeps no pieces"
		}
		w.piecing = false
		w.through(w.status, reason)
	}
	w.n = 1
	copyHeader(w.client.Header(), w.header)
	w.client.WriteHeader(w.status)
	_ = http.NewResponseController(w.client).Flush()
}

func (w *heldWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	switch {
	case w.piecing:
		return w.writePieces(p)
	case w.passing.Load():
		return w.client.Write(p)
	}
	total := int64(w.body.Len() + len(p))
	switch {
	case total > w.limit:
		w.pass(fmt.Sprintf("the response is larger than the %d bytes a response is stored up to", w.limit))
		return w.client.Write(p)
	case total <= int64(pieceSize):
		return w.body.Write(p)
	case w.noPieces || !replayable(w.status):
		return w.buffer(p)
	case w.body.Len() == 0:
		// The first piece is never empty.
		k := pieceSize
		w.body.Write(p[:k])
		n, err := w.startPieces(p[k:])
		return k + n, err
	default:
		return w.startPieces(p)
	}
}

// buffer keeps p with the rest of the body, where the response is not
// stored in pieces, up to inlineMax (as before pieces were kept); past
// it, the response passes through unstored.
func (w *heldWriter) buffer(p []byte) (int, error) {
	if limit := min(w.limit, inlineMax); int64(w.body.Len()+len(p)) > limit {
		w.pass(fmt.Sprintf("the response is larger than the %d bytes a response is stored up to where the store keeps no pieces", limit))
		return w.client.Write(p)
	}
	return w.body.Write(p)
}

// startPieces begins to store the response in pieces: the store takes
// what is buffered as the first piece, and then the client gets it; then
// p follows. Where the store keeps no pieces, p is buffered instead.
func (w *heldWriter) startPieces(p []byte) (int, error) {
	head := w.head()
	ok, err := w.pieces(0, head)
	if errors.Is(err, errors.ErrUnsupported) {
		w.noPieces = true
		return w.buffer(p)
	}
	w.passing.Store(true)
	if err == nil && ok {
		w.beat(head)
		ok, err = w.pieces(1, w.body.Bytes())
	}
	if reason, stored := pieceTaken(ok, err); !stored {
		w.stopPieces(reason)
		return w.client.Write(p)
	}
	w.piecing, w.n, w.size = true, 2, int64(w.body.Len())
	copyHeader(w.client.Header(), w.header)
	w.client.WriteHeader(w.status)
	_, _ = w.client.Write(w.body.Bytes())
	w.body.Reset()
	return w.writePieces(p)
}

// writePieces buffers p, then stores and sends each full piece; past the
// limit, or once the store takes no more, the rest passes unstored.
func (w *heldWriter) writePieces(p []byte) (int, error) {
	if w.size+int64(w.body.Len()+len(p)) > w.limit {
		w.stopPieces(fmt.Sprintf("the response is larger than the %d bytes a response is stored up to", w.limit))
		return w.client.Write(p)
	}
	w.body.Write(p)
	for w.body.Len() >= pieceSize {
		piece := w.body.Next(pieceSize)
		stored := w.piece(piece)
		// A client that left gets no more, but the pieces are stored all
		// the same, for its retry.
		_, _ = w.client.Write(piece)
		if !stored {
			_, _ = w.client.Write(w.body.Next(w.body.Len()))
			break
		}
	}
	return len(p), nil
}

// piece stores p as the next piece; false, having recorded that the
// response is not stored (the rest then passes unstored), when the store
// did not take it.
func (w *heldWriter) piece(p []byte) bool {
	if len(p) == 0 {
		return w.piecing
	}
	ok, err := w.pieces(w.n, p)
	if reason, stored := pieceTaken(ok, err); !stored {
		w.piecing = false
		w.stopBeat()
		w.through(w.status, reason)
		return false
	}
	w.n++
	w.size += int64(len(p))
	return true
}

// pieceTaken reads Store.WritePiece's answer: whether the piece was
// stored and, if not, why, for the held record's Reason.
func pieceTaken(ok bool, err error) (string, bool) {
	switch {
	case err != nil:
		return fmt.Sprint("the store did not take a piece of the response: ", err), false
	case !ok:
		return "the held record changed while its response was stored (released by an operator, or expired)", false
	}
	return "", true
}

// stopPieces gives up storing the response in pieces: the key records
// that it was not stored, and what is buffered and the rest pass through
// (after the header, when no piece of the body was stored yet).
func (w *heldWriter) stopPieces(reason string) {
	first := !w.piecing
	w.piecing = false
	w.stopBeat()
	w.through(w.status, reason)
	if first {
		copyHeader(w.client.Header(), w.header)
		w.client.WriteHeader(w.status)
	}
	_, _ = w.client.Write(w.body.Bytes())
	w.body = bytes.Buffer{}
}

// Flush passes a stream's data on as it comes: what is buffered of a
// response stored in pieces is stored as a piece first. A response that
// may yet be stored whole in its record is held back.
func (w *heldWriter) Flush() {
	if w.piecing && w.body.Len() > 0 {
		// Stored or not (the rest then passes unstored), the client gets
		// it.
		piece := w.body.Next(w.body.Len())
		w.piece(piece)
		_, _ = w.client.Write(piece)
	}
	if w.passing.Load() {
		_ = http.NewResponseController(w.client).Flush()
	}
}

// pass records why the response is not stored, then sends what is
// buffered and lets the rest through.
func (w *heldWriter) pass(reason string) {
	w.passing.Store(true)
	w.through(w.status, reason)
	copyHeader(w.client.Header(), w.header)
	w.client.WriteHeader(w.status)
	_, _ = w.client.Write(w.body.Bytes())
	w.body = bytes.Buffer{}
}
