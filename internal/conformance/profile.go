package conformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oncekey/oncekey/idempotency"
)

// Profile is what an API's idempotency answers look like where real APIs
// legitimately differ: the checks hold every API to the same promises, and
// a profile says which statuses and headers keep them.
type Profile struct {
	// Name is how --profile names it.
	Name string `json:"name"`
	// MismatchStatus answers a key reused with a different request.
	MismatchStatus int `json:"mismatch_status"`
	// InFlightStatus answers a duplicate of a request still running. A 2xx
	// in-flight answer must be a problem document, so that it cannot be
	// taken for the operation's own answer.
	InFlightStatus int `json:"in_flight_status"`
	// ReplayHeader marks a replayed answer with the value "true"; empty:
	// replays are not marked.
	ReplayHeader string `json:"replay_header,omitempty"`
	// KeyRequired says a request without a key is refused (4xx) rather than
	// run without protection.
	KeyRequired bool `json:"key_required"`
	// MissingKeyStatus is the one status that refuses a request without a
	// key, where the profile's source names one (agent-commerce's 400, which
	// a client reads as "add the header and retry"); 0: any 4xx, as the
	// drafts' SHOULD allows.
	MissingKeyStatus int `json:"missing_key_status,omitempty"`
	// CanonicalJSON says the fingerprint compares JSON values, not bytes:
	// reordered keys and other whitespace are the same request.
	CanonicalJSON bool `json:"canonical_json"`
	// CanonicalForm says the fingerprint compares form fields, not bytes:
	// fields whose bytes are percent-encoded otherwise ("%20" for "+"), in
	// their order, are the same request.
	CanonicalForm bool `json:"canonical_form"`
	// WaitsForFirst says a duplicate may wait for the first request and get
	// its answer instead of the in-flight answer.
	WaitsForFirst bool `json:"waits_for_first"`
	// MaxKeyLength is the longest key accepted, in bytes.
	MaxKeyLength int `json:"max_key_length"`
	// RetryAfter says the in-flight answer and 503 carry Retry-After.
	RetryAfter bool `json:"retry_after"`
	// KeyPerPath says a key is the caller's on one endpoint path only (ACP
	// §6.1: "the same key on different endpoints is treated
	// independently"): the same key on another path is another key, so the
	// mismatch checks reuse a key on the same path alone.
	KeyPerPath bool `json:"key_per_path,omitempty"`
	// StoresServerErrors says a 5xx is stored and replayed like any answer
	// (Stripe's API v1 replays its 500s): error-not-stored is skipped.
	StoresServerErrors bool `json:"stores_server_errors,omitempty"`
}

// Profiles are the profiles --profile knows, by name.
var Profiles = map[string]Profile{
	"oncekey": {
		Name: "oncekey", MismatchStatus: 409, InFlightStatus: 202, ReplayHeader: idempotency.HeaderReplayed,
		KeyRequired: true, CanonicalJSON: true, CanonicalForm: true, WaitsForFirst: true, MaxKeyLength: 255,
		RetryAfter: true,
	},
	// ietf follows draft-ietf-httpapi-idempotency-key-header-06 §2.7: 400
	// without a key, 422 for a reused key, 409 while the first request
	// runs. The draft names no replay marker and leaves the fingerprint's
	// form to the server.
	"ietf": {
		Name: "ietf", MismatchStatus: 422, InFlightStatus: 409,
		KeyRequired: true, MaxKeyLength: 255,
	},
	// ietf-07 follows draft-ietf-httpapi-idempotency-key-header-07, the
	// newest revision whose text could be read when it was added (-08 and
	// -09 exist; see docs/conformance.md). Its §2.1-§2.7 say what -06's say,
	// word for word, and its Appendix A (changes from -06) is empty, so it
	// expects what ietf does: it is its own name so that a run says which
	// revision it held the API to, and so that ietf can keep meaning -06.
	"ietf-07": {
		Name: "ietf-07", MismatchStatus: 422, InFlightStatus: 409,
		KeyRequired: true, MaxKeyLength: 255,
	},
	// agent-commerce is the Agentic Commerce Protocol's idempotency
	// (rfcs/rfc.agentic_checkout.md §6, SEP #120): a key on every POST,
	// 400 without one, 409 with Retry-After while the first request runs,
	// 422 for the same key with another body, Idempotent-Replayed: true
	// on a replay. Bodies are JSON compared as values (§6.2), keys at most
	// 255 characters (§6.1), and scoped to the caller and the endpoint's
	// path (§6.1): the mismatch checks reuse a key on the same path alone.
	"agent-commerce": {
		Name: "agent-commerce", MismatchStatus: 422, InFlightStatus: 409, ReplayHeader: "Idempotent-Replayed",
		KeyRequired: true, MissingKeyStatus: 400, CanonicalJSON: true, MaxKeyLength: 255, RetryAfter: true,
		KeyPerPath: true,
	},
	// stripe is Stripe's documented behaviour: the key is optional, a
	// reused key with other parameters is 400, a concurrent duplicate 409,
	// and replays carry Idempotent-Replayed, 500s included (its API v1
	// stores any answer once the endpoint began). Its bodies are forms; a retry
	// whose client library orders or encodes the parameters otherwise
	// sends the same parameters, so it replays.
	"stripe": {
		Name: "stripe", MismatchStatus: 400, InFlightStatus: 409, ReplayHeader: "Idempotent-Replayed",
		CanonicalJSON: true, CanonicalForm: true, MaxKeyLength: 255, StoresServerErrors: true,
	},
}

// ProfileNamed returns the profile called name.
func ProfileNamed(name string) (Profile, error) {
	if p, ok := Profiles[name]; ok {
		return p, nil
	}
	var names []string
	for n := range Profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return Profile{}, fmt.Errorf("no profile %q (there are %s)", name, strings.Join(names, ", "))
}
