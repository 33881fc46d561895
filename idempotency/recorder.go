package idempotency

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
)

// recorder buffers the operation's response. Nothing reaches the client
// until the outcome is committed, so the client can never act on a response
// that a rollback then takes back. A body larger than pieceSize is stored
// in pieces as it is written (spill: through the lease, with the run's
// writes), so that the recorder holds at most one piece of it; the client
// then gets it from the store once it is committed.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
	// spill stores the body's pieces with the run's writes
	// (Lease.WritePiece); nil: the body is kept whole. pieces counts the
	// pieces stored (the body's are 1 to pieces), size their bytes; err
	// is a piece that could not be stored: the run fails.
	spill  spiller
	pieces int
	size   int64
	err    error
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.wroteHeader {
		return
	}
	r.wroteHeader = true
	r.status = status
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.err != nil {
		return 0, r.err
	}
	n, _ := r.body.Write(p)
	if r.spill != nil && replayable(r.status) {
		if _, err := r.storeFull(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// spiller stores piece n of a running operation's body with its writes.
// An interface, not a func: the request that implements it is one
// allocation already, and a method value would be another.
type spiller interface {
	spill(n int, p []byte) error
}

// errPieceRefused fails a run whose lease took some of its body's pieces
// and refused the rest once the operation had returned.
var errPieceRefused = errors.New("idempotency: the lease took some pieces of the response's body and refused the rest")

// storeFull stores the buffered body in pieces while more than a piece
// of it is buffered, and reports whether the lease took all it was
// offered.
func (r *recorder) storeFull() (bool, error) {
	for r.body.Len() > pieceSize {
		if taken, err := r.store(pieceSize); !taken || err != nil {
			return false, err
		}
	}
	return true, nil
}

// store stores the body's next k bytes as its next piece, through spill,
// and drops them from the buffer. A lease that does not take it now
// (errors.ErrUnsupported: its unit of work is busy, say, a handler
// reading rows of its transaction as it writes them) leaves it buffered,
// to be offered again on the next write and at the end (taken false); any
// other error fails the run.
func (r *recorder) store(k int) (taken bool, err error) {
	err = r.spill.spill(r.pieces+1, r.body.Bytes()[:k])
	switch {
	case err == nil:
		r.body.Next(k)
		r.pieces++
		r.size += int64(k)
		return true, nil
	case errors.Is(err, errors.ErrUnsupported):
		return false, nil
	}
	r.err = err
	return false, err
}

// end stores what is left of a body stored in pieces as its last pieces,
// and returns the response to commit: the count and size of its pieces,
// or, when the lease took none, the body whole in the record, as before
// pieces were kept.
func (r *recorder) end(header http.Header) (Response, error) {
	if r.err != nil {
		return Response{}, r.err
	}
	if r.spill != nil && replayable(r.status) {
		if _, err := r.storeFull(); err != nil {
			return Response{}, err
		}
	}
	if r.pieces == 0 {
		return Response{Status: r.status, Header: header, Body: r.body.Bytes()}, nil
	}
	for r.body.Len() > 0 {
		taken, err := r.store(min(r.body.Len(), pieceSize))
		if err != nil {
			return Response{}, err
		}
		if !taken {
			return Response{}, errPieceRefused
		}
	}
	return Response{Status: r.status, Header: header, Pieces: r.pieces + 1, Size: r.size}, nil
}

// allowed returns the allow-listed headers, which are what a replay
// carries. Their values are copies, made in one slice, each header's with
// no spare capacity (as http.Header.Clone does), so that appending to one
// never writes into another.
func (r *recorder) allowed(names []string) http.Header {
	out := http.Header{}
	n := 0
	for _, name := range names {
		n += len(r.header.Values(name))
	}
	if n == 0 {
		return out
	}
	all := make([]string, 0, n)
	for _, name := range names {
		if v := r.header.Values(name); len(v) > 0 {
			start := len(all)
			all = append(all, v...)
			out[http.CanonicalHeaderKey(name)] = all[start:len(all):len(all)]
		}
	}
	return out
}

// copyTo sends the buffered response to w.
func (r *recorder) copyTo(w http.ResponseWriter) {
	copyHeader(w.Header(), r.header)
	w.Header().Set("Content-Length", strconv.Itoa(r.body.Len()))
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}

// copyHeader copies the operation's response header src into the
// client's, dst, all but Idempotency-TTL: that is the engine's to say
// (Serve set it), not the operation's (an upstream's, behind a gateway).
func copyHeader(dst, src http.Header) {
	for name, values := range src {
		if name != ttlKey {
			dst[name] = values
		}
	}
}
