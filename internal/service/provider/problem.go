package provider

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/oncekey/oncekey/idempotency"
)

// problemTypeBase prefixes the sandbox's problem type URIs. They are kept
// apart from Oncekey's own (internal/wire/problem), which this package does not
// import: the sandbox stands in for a third party and shares nothing with
// the product's API but the idempotency protocol, whose problems it takes
// from the engine.
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

// refusal is a problem type that a well-formed request can still get
// because of what is stored, tied to the sentinel error that stands for it:
// the server answers err with it, and the client turns its slug back into
// err. Only refunds are refused this way; a charge never is.
type refusal struct {
	err    error
	status int
	slug   string
	title  string
}

// refusals lists every refusal, the one place its status and slug are set:
//
//   - charge-not-found (404): the refund's charge_id names no charge.
//   - charge-not-refundable (409): the charge was declined.
//   - refund-exceeds-charge (422): the amount is more than is left of the
//     charge after its succeeded refunds.
//
// The detail is the store's error, which says which charge and how much.
var refusals = []refusal{
	{ErrChargeNotFound, http.StatusNotFound, "charge-not-found", "Charge not found"},
	{ErrChargeNotRefundable, http.StatusConflict, "charge-not-refundable", "The charge cannot be refunded"},
	{ErrRefundExceedsCharge, http.StatusUnprocessableEntity, "refund-exceeds-charge", "The refund exceeds what is left of the charge"},
}

// writeRefusal answers err with its refusal's problem and reports whether
// err was one.
func writeRefusal(w http.ResponseWriter, err error) bool {
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			writeProblem(w, r.status, r.slug, r.title, err.Error())
			return true
		}
	}
	return false
}

func writeProblem(w http.ResponseWriter, status int, slug, title, detail string) {
	w.Header().Set("Content-Type", problemContentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(problem{Type: problemTypeBase + slug, Title: title, Status: status, Detail: detail})
}

// problemInternal is the protocol's answer to a failure of the sandbox's
// own: an error that is none of the protocol's.
var problemInternal = idempotency.ProblemOf(errors.New("the sandbox failed"))

// writeProtocolProblem answers with one of the idempotency protocol's
// problems, as the engine declares them: the sandbox speaks the protocol
// as any API built on the engine would.
func writeProtocolProblem(w http.ResponseWriter, p idempotency.Problem, detail string) {
	writeProblem(w, p.Status, p.Slug, p.Title, detail)
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
