package provider

import (
	"encoding/json"
	"net/http"
)

// problemTypeBase prefixes the sandbox's problem type URIs. They are kept
// apart from Oncekey's own (internal/problem), which this package does not
// import: the sandbox stands in for a third party and shares nothing with
// the product's API.
const problemTypeBase = "https://oncekey.dev/problems/fakeprovider/"

// problemContentType is the media type of every error body (RFC 9457 §3).
const problemContentType = "application/problem+json"

// problem is an RFC 9457 problem details document.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func writeProblem(w http.ResponseWriter, status int, slug, title, detail string) {
	w.Header().Set("Content-Type", problemContentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problem{Type: problemTypeBase + slug, Title: title, Status: status, Detail: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed", r.Method+" is not allowed here; use "+allow)
	}
}
