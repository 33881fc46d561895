package idempotency

import (
	"bytes"
	"net/http"
	"strconv"
)

// recorder buffers the operation's response. Nothing reaches the client
// until the outcome is committed, so the client can never act on a response
// that a rollback then takes back.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
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
	return r.body.Write(p)
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
