package caddymodule

import (
	"net/http"
	"strconv"

	"github.com/oncekey/oncekey/idempotency/frontdoor"
)

// refuseAmbiguous answers 400 ambiguous-path for an unsafe request whose
// path upstreams read in different ways (frontdoor.AmbiguousPath: a dot
// or empty segment, a "\", an encoded "/" or "\", a ";"), before its key
// is read, as oncekey proxy does, and reports whether it did. Caddy's path
// matcher cleans and lower-cases a path before it matches, but
// reverse_proxy sends the path as it came: what the matcher took for the
// covered path may be another to the upstream, and the reverse.
func (h *Handler) refuseAmbiguous(w http.ResponseWriter, r *http.Request) bool {
	why := frontdoor.AmbiguousPath(r.URL)
	if why == "" {
		return false
	}
	h.problem(w, http.StatusBadRequest, "ambiguous-path", "The request's path is ambiguous",
		"the path "+strconv.Quote(r.URL.EscapedPath())+" is ambiguous: "+why+"; send it as the upstream names it")
	return true
}
