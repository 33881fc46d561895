// Package crashpoint is the seam of the SDK's crash tests: functions the
// key journal calls at three points of a journaled request, so that a test
// program (client/internal/journalproc) can stop there and be killed. It
// is internal: no program outside the SDK can set them, and in every
// program but that one they are nil and cost a nil check.
package crashpoint

import "github.com/oncekey/oncekey/gen/api"

// The points, each nil unless the test program sets it before its first
// request (they are read without a lock).
var (
	// BeforeSend runs when an operation's key is journaled and its first
	// attempt not yet sent.
	BeforeSend func(body []byte)
	// AfterSend runs when an attempt was sent and its answer's headers
	// came, before its body is read.
	AfterSend func(body []byte)
	// BeforeRecord runs when a final answer is read (body) and not yet
	// journaled.
	BeforeRecord func(body []byte)
)

// At runs point with body if it is set.
func At(point func([]byte), body []byte) {
	if point != nil {
		point(body)
	}
}

// Event is one line the test program prints as JSON, and what the crash
// tests read back: the two sides of one wire, declared once.
type Event struct {
	Event  string     `json:"event"` // locking, opened, hook, resumed, order, error
	Point  string     `json:"point,omitempty"`
	Kind   string     `json:"kind,omitempty"`
	Status int        `json:"status,omitempty"`
	Body   []byte     `json:"body,omitempty"`
	Order  *api.Order `json:"order,omitempty"`
	Err    string     `json:"err,omitempty"`
}
