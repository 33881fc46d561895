// Package forward is what a gateway that forwards keyed requests to an
// upstream needs from net/http, so that it neither runs a request twice
// nor frees a key whose request may have run.
//
// Two things go wrong with a plain http.Transport. It resends a request on
// a new connection when a reused one fails after the request was written,
// if it takes the request for idempotent, and it does for any request that
// carries an Idempotency-Key or X-Idempotency-Key header: the upstream then
// runs it twice. And its errors do not say whether the request got there:
// a gateway that frees the key after a failure the upstream ran lets the
// client's retry run it again, and one that keeps every failure as of
// unknown outcome blocks a key that nothing ran under.
//
// Prepare answers the first, Reached the second. One rule decides
// Reached: the request may have run once the transport has written its
// whole header section (httptrace's WroteHeaders), unless HTTP/2 then
// says the stream was not processed (REFUSED_STREAM, or a GOAWAY that
// excludes it: RFC 9113, section 8.7). Until its header section is
// written an upstream holds no request it could run: a failed dial or
// TLS handshake, a refused connection, a wait for a pooled connection
// that timed out, a client that went away. Once it is, anything else (a
// reset, a timeout waiting for the answer, a connection closed while an
// Expect: 100-continue waits for its 100) may follow a run.
package forward

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"strings"
	"sync/atomic"
)

// resent are the headers whose presence net/http's transport takes for
// leave to resend a request (Request.isReplayable). It looks them up by
// their canonical names only.
var resent = []string{"Idempotency-Key", "X-Idempotency-Key"}

// Prepare returns a shallow copy of r to forward in its place, with its
// own header, in which the key headers are named in lower case: HTTP reads
// header names in any case, and net/http's transport, which looks for
// them by their canonical names, then never resends the request. Its
// context notes how far the request gets, for Reached; a ClientTrace
// already in it, or added to the context of a request made from it (as
// httputil.ReverseProxy and Caddy's reverse_proxy do), still runs.
//
// Header.Get and Header.Values no longer find the key headers of the
// returned request: read them from r.
func Prepare(r *http.Request) *http.Request {
	p := new(progress)
	ctx := context.WithValue(r.Context(), progressKey{}, p)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaders: func() { p.wroteHeaders.Store(true) },
	})
	out := r.WithContext(ctx)
	out.Header = r.Header.Clone()
	if out.Header == nil {
		out.Header = http.Header{}
	}
	for _, name := range resent {
		if v := out.Header.Values(name); len(v) > 0 {
			out.Header.Del(name)
			out.Header[strings.ToLower(name)] = v
		}
	}
	return out
}

// Reached reports whether the upstream may have run r, whose round trip
// failed with err: true once the transport wrote r's header section
// (of any attempt, if the transport retried), unless err is HTTP/2's word
// that the stream was not processed. r is the request Prepare returned,
// or one whose context derives from its context. For a request that
// Prepare did not see, or a nil err, it reports true: what cannot be
// known may have run.
func Reached(r *http.Request, err error) bool {
	p, ok := r.Context().Value(progressKey{}).(*progress)
	if !ok || err == nil {
		return true
	}
	return p.wroteHeaders.Load() && !unprocessed(err)
}

// progress is how far a prepared request got.
type progress struct {
	wroteHeaders atomic.Bool
}

type progressKey struct{}

// notProcessed matches the messages of the HTTP/2 transport's errors (in
// net/http and in golang.org/x/net/http2, whose types a standard-library
// package cannot name) for a stream the server did not process: reset
// with REFUSED_STREAM, or past the last stream of a GOAWAY. A message is
// matched whole, alone or quoted as the cause of the transport's refusal
// to retry a request whose body it has sent, so that no text an upstream
// chose (a GOAWAY's debug data, which a GoAwayError quotes) matches.
var notProcessed = func() *regexp.Regexp {
	cause := `(?:stream error: stream ID \d+; REFUSED_STREAM(?:; [^\]]*)?|` + regexp.QuoteMeta("http2: Transport received Server's graceful shutdown GOAWAY") + `)`
	cannotRetry := regexp.QuoteMeta("http2: Transport: cannot retry err [") + cause +
		regexp.QuoteMeta("] after Request.Body was written; define Request.GetBody to avoid this error")
	return regexp.MustCompile(`^(?:` + cause + `|` + cannotRetry + `)$`)
}()

// unprocessed reports whether err, or an error it wraps, is the HTTP/2
// transport's word that the server did not process the stream.
func unprocessed(err error) bool {
	for _, e := range chain(err) {
		if notProcessed.MatchString(e.Error()) {
			return true
		}
	}
	return false
}

// chain is err and every error it wraps, depth first.
func chain(err error) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner)
			}
		}
	}
	walk(err)
	return out
}
