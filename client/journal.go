package client

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// Journal keeps the Idempotency-Keys of a client's operations beyond its
// process, so that a client that crashes or is redeployed between sending
// an unsafe request and reading its answer does not lose the key: run
// again, the operation would otherwise mint a new key, and the server would
// run it a second time (a second order). The client appends a RecordSent
// before the first attempt of an operation leaves, and a RecordAnswered
// when a final answer comes; Client.Pending, Client.Resume and intents
// (Client.Intent) read them back.
//
// Append must make the record durable before it returns: the request is
// sent right after. A Journal is safe for concurrent use. OpenFileJournal
// is the one to use across restarts; NewMemoryJournal is for tests.
type Journal interface {
	// Append adds rec durably, after every record before it.
	Append(rec Record) error
	// Records returns every record kept, in the order they were appended.
	Records() []Record
}

// RecordKind is what a Record says happened.
type RecordKind string

// The kinds of records a client appends.
const (
	// RecordSent: the operation's first attempt is about to leave with Key;
	// written before it does, so a crash after it cannot lose the key.
	RecordSent RecordKind = "sent"
	// RecordAnswered: a final answer came for Key (a success, a 4xx, the
	// 202 of a long operation): the operation is over, and running its
	// intent again returns this answer without sending.
	RecordAnswered RecordKind = "answered"
	// RecordRetention: Server advertised how long it keeps a key
	// (Idempotency-TTL); a key never answered is resent only within it.
	RecordRetention RecordKind = "retention"
	// RecordForgotten: the caller settled Key another way (Client.Forget),
	// after its retention ran out unanswered: it is no longer pending.
	RecordForgotten RecordKind = "forgotten"
)

// MaxStoredBody bounds the bytes of a request or answer body that a
// record keeps: a larger body keeps only its SHA-256, so an answer over it
// cannot be returned from the journal, and a request over it cannot be
// resent by Resume (its key is still kept and reported).
const MaxStoredBody = 64 << 10

// Record is one line of a Journal. Which fields are set depends on Kind.
type Record struct {
	Kind RecordKind `json:"kind"`
	// Key is the operation's Idempotency-Key (all kinds but retention).
	Key string `json:"key,omitempty"`
	// Server is the origin the request went to (scheme://host:port):
	// retention is per server.
	Server string `json:"server,omitempty"`
	// Method and Path (with its query) are the request's (sent).
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	// Intent is the caller's name for the operation (sent), if it gave one.
	Intent string `json:"intent,omitempty"`
	// Status is the answer's HTTP status (answered).
	Status int `json:"status,omitempty"`
	// ContentType is the request's (sent) or the answer's (answered).
	ContentType string `json:"content_type,omitempty"`
	// BodySHA256 is the hex SHA-256 of the request's (sent) or the
	// answer's (answered) whole body; Body is that body when it is at most
	// MaxStoredBody bytes, else nil with BodyTruncated set.
	BodySHA256    string `json:"body_sha256,omitempty"`
	Body          []byte `json:"body,omitempty"`
	BodyTruncated bool   `json:"body_truncated,omitempty"`
	// Retention is what Server advertised (retention).
	Retention time.Duration `json:"retention,omitempty"`
	// Time is when the record was appended.
	Time time.Time `json:"time"`
}

// MemoryJournal is a Journal that lasts as long as its value: for tests,
// and for code that wants Pending and Resume within one process.
type MemoryJournal struct {
	mu      sync.Mutex
	records []Record
}

var _ Journal = (*MemoryJournal)(nil)

// NewMemoryJournal returns an empty MemoryJournal.
func NewMemoryJournal() *MemoryJournal { return &MemoryJournal{} }

// Append adds rec.
func (j *MemoryJournal) Append(rec Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.records = append(j.records, rec)
	return nil
}

// Records returns a copy of the records.
func (j *MemoryJournal) Records() []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.records)
}

// journalState is a Journal's records folded: each key's sent record and
// its answer, and each server's last advertised retention.
type journalState struct {
	order     []string // keys, in the order they were sent
	sent      map[string]Record
	answered  map[string]Record
	forgotten map[string]bool
	retention map[string]time.Duration
}

func fold(records []Record) journalState {
	s := journalState{sent: map[string]Record{}, answered: map[string]Record{}, forgotten: map[string]bool{}, retention: map[string]time.Duration{}}
	for _, r := range records {
		switch r.Kind {
		case RecordSent:
			if _, ok := s.sent[r.Key]; !ok {
				s.order = append(s.order, r.Key)
			}
			s.sent[r.Key] = r
		case RecordAnswered:
			s.answered[r.Key] = r
		case RecordForgotten:
			s.forgotten[r.Key] = true
		case RecordRetention:
			s.retention[r.Server] = r.Retention
		}
	}
	return s
}

// retentionOf is how long server keeps a key, as far as the journal
// knows: the last it advertised, else fallback.
func (s journalState) retentionOf(server string, fallback time.Duration) time.Duration {
	if d, ok := s.retention[server]; ok && d > 0 {
		return d
	}
	return fallback
}

// byIntent returns the key of intent's latest operation.
func (s journalState) byIntent(intent string) (string, bool) {
	for i := len(s.order) - 1; i >= 0; i-- {
		if s.sent[s.order[i]].Intent == intent {
			return s.order[i], true
		}
	}
	return "", false
}

// compact keeps what is still of use: every operation never answered (it
// must be resumed or reported), answered ones within their server's
// retention, and each server's last retention. It returns the records to
// keep and whether any were dropped.
func compact(records []Record, now time.Time, fallback time.Duration) ([]Record, bool) {
	s := fold(records)
	var kept []Record
	for server, d := range s.retention {
		kept = append(kept, Record{Kind: RecordRetention, Server: server, Retention: d, Time: now})
	}
	slices.SortFunc(kept, func(a, b Record) int { return strings.Compare(a.Server, b.Server) })
	for _, key := range s.order {
		sent := s.sent[key]
		answer, answered := s.answered[key]
		if (answered || s.forgotten[key]) && now.Sub(sent.Time) >= s.retentionOf(sent.Server, fallback) {
			continue
		}
		kept = append(kept, sent)
		if answered {
			kept = append(kept, answer)
		}
		if s.forgotten[key] {
			kept = append(kept, Record{Kind: RecordForgotten, Key: key, Time: now})
		}
	}
	return kept, len(kept) != len(records)
}
