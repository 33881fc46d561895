package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"
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
// where the response is stored: one that passes through is answered as it
// comes, its key recorded first as not stored.
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
	w := &heldWriter{recorder: recorder{header: http.Header{}, status: http.StatusOK}, client: s.w, limit: held.MaxStored, through: stored}
	verdict := &heldVerdict{}
	// The operation's context outlives the client (its outcome is settled
	// all the same) and ends before the lease does, unless the response
	// passes through by then.
	hctx, stop := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), heldKey{}, verdict))
	defer stop()
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
	default:
		finish(Response{Status: w.status, Header: w.allowed(s.op.e.stored), Body: w.body.Bytes()})
		w.copyTo(s.w)
	}
}

// heldWriter buffers a held operation's response as the recorder does, up
// to its limit, and passes it through to the client from the moment it
// cannot be stored: once it outgrows the limit, or at once for a stream.
// Before the first byte passes, through records the key's fate.
type heldWriter struct {
	recorder
	client  http.ResponseWriter
	limit   int64
	through func(status int, reason string)
	// passing is set once the response passes through; atomic, as the
	// lease's timer reads it on a goroutine of its own.
	passing atomic.Bool
}

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
	if mt, _, _ := mime.ParseMediaType(w.header.Get("Content-Type")); mt == "text/event-stream" {
		w.pass("the response is a stream (text/event-stream)")
	}
}

func (w *heldWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if !w.passing.Load() && int64(w.body.Len()+len(p)) > w.limit {
		w.pass(fmt.Sprintf("the response is larger than the %d bytes a response is stored up to", w.limit))
	}
	if w.passing.Load() {
		return w.client.Write(p)
	}
	return w.body.Write(p)
}

// Flush passes a stream's data on as it comes; a response that may yet be
// stored is held back.
func (w *heldWriter) Flush() {
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
