package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// headerRepeat is the request header with which a client says that a
// request repeating an earlier one under another key is meant (?1, an RFC
// 9651 boolean): a second order of the same cart, on purpose. The engine
// then neither counts it nor refuses it (OperationConfig.RefuseRepeats).
const headerRepeat = "Idempotency-Repeat"

// defaultRepeatWindow is how long a request is remembered for spotting its
// repeats under another key (Config.RepeatWindow): a client's timeouts and
// retries fall within minutes; a shopper ordering the same thing again
// usually does not.
const defaultRepeatWindow = 5 * time.Minute

// maxRepeats bounds the requests an engine remembers for spotting repeats,
// whatever the rate: about 100 bytes each, some 6.5 MiB at most. Beyond it
// the oldest is forgotten before its window ends.
const maxRepeats = 1 << 16

// errRepeated is the kind of a request refused for repeating, under
// another key, one its operation ran or runs within the window:
// ProblemOf's repeated-request.
var errRepeated = errors.New("an identical request was made under another Idempotency-Key")

// errInvalidRepeat refuses an Idempotency-Repeat header that is not an
// RFC 9651 boolean.
var errInvalidRepeat = errors.New("the Idempotency-Repeat header must be ?1 (this repeat is meant) or ?0")

// repeatedError refuses a request as a repeat (errRepeated), naming the
// earlier one: how long ago it began, whether it still runs, and the
// resource its answer named.
type repeatedError struct {
	age      time.Duration
	running  bool
	status   int
	location string
}

func (e *repeatedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s ago", errRepeated.Error(), e.age.Round(time.Second))
	switch {
	case e.running:
		b.WriteString(" and is still running")
	case e.location != "":
		fmt.Fprintf(&b, " and was answered %d with Location %s", e.status, e.location)
	default:
		fmt.Fprintf(&b, " and was answered %d", e.status)
	}
	b.WriteString("; nothing ran. Retry with that request's key to get its answer, or send " + headerRepeat + ": ?1 if this one is meant as a new request")
	return b.String()
}

func (e *repeatedError) Is(target error) bool { return target == errRepeated }

// parseRepeat reads Idempotency-Repeat: absent or ?0 is false, ?1 true.
func parseRepeat(h http.Header) (bool, error) {
	values := h.Values(headerRepeat)
	if len(values) == 0 {
		return false, nil
	}
	if len(values) == 1 {
		switch strings.TrimSpace(values[0]) {
		case "?1":
			return true, nil
		case "?0":
			return false, nil
		}
	}
	return false, errInvalidRepeat
}

// repeatID names a request for spotting its repeats: its operation, scope
// and fingerprint, hashed together so that every entry has one small size.
type repeatID [16]byte

// keyHash is a key hashed (SHA-256, the first 8 bytes): enough to tell two
// keys apart, and what the log shows instead of the key.
type keyHash [8]byte

func repeatIDOf(label, scope string, fp Fingerprint) repeatID {
	h := sha256.New()
	h.Write([]byte(label))
	h.Write([]byte{0})
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write(fp[:])
	var sum [sha256.Size]byte
	var id repeatID
	copy(id[:], h.Sum(sum[:0]))
	return id
}

func hashKey(key string) keyHash {
	sum := sha256.Sum256([]byte(key))
	return keyHash(sum[:8])
}

// repeatEntry is the last request of one repeatID: under which key, when
// it began, until when it counts, and once its outcome is stored, that
// outcome's status and Location.
type repeatEntry struct {
	key      keyHash
	seq      uint64
	began    time.Time
	until    time.Time
	done     bool
	status   int
	location string
}

// repeatSlot is an entry's place in the order of arrival, by which entries
// are forgotten.
type repeatSlot struct {
	id  repeatID
	seq uint64
}

// repeats remembers, on this process, the requests its operations ran or
// run within their windows, so that the same request under another key is
// seen. Memory is bounded by maxRepeats; time per request is two hashes
// and a map operation under one lock.
type repeats struct {
	mu      sync.Mutex
	entries map[repeatID]repeatEntry
	// order holds the entries' slots in the order of arrival from head
	// on, at most maxRepeats of them.
	order []repeatSlot
	head  int
	seq   uint64
	// logAfter is when the next repeat may be logged (Unix nanoseconds):
	// one line a second at most, the counter counts them all.
	logAfter atomic.Int64
}

func newRepeats() *repeats {
	return &repeats{entries: map[repeatID]repeatEntry{}}
}

// enter records a request of id under key, beginning at now and counting
// for window, and returns the earlier request of id under another key
// that still counts, if there is one. A request that is refused for it
// (refuse) is not recorded; seq names the record otherwise.
func (r *repeats) enter(id repeatID, key keyHash, now time.Time, window time.Duration, refuse bool) (earlier repeatEntry, found bool, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(now)
	if e, ok := r.entries[id]; ok && e.key != key && now.Before(e.until) {
		earlier, found = e, true
		if refuse {
			return earlier, true, 0
		}
	}
	if len(r.order)-r.head == maxRepeats {
		r.pop()
	}
	if r.head > 0 && r.head >= len(r.order)/2 {
		// Half the slice is forgotten slots: move the rest down, so that
		// it never grows past twice what is remembered.
		r.order = r.order[:copy(r.order, r.order[r.head:])]
		r.head = 0
	}
	r.seq++
	r.entries[id] = repeatEntry{key: key, seq: r.seq, began: now, until: now.Add(window)}
	r.order = append(r.order, repeatSlot{id: id, seq: r.seq})
	return earlier, found, r.seq
}

// forget drops the entries, oldest first, whose window ended by now.
func (r *repeats) forget(now time.Time) {
	for r.head < len(r.order) {
		s := r.order[r.head]
		if e, ok := r.entries[s.id]; ok && e.seq == s.seq && now.Before(e.until) {
			return
		}
		r.pop()
	}
}

// pop forgets the oldest slot, and its entry unless a later request of
// the same id replaced it.
func (r *repeats) pop() {
	s := r.order[r.head]
	if e, ok := r.entries[s.id]; ok && e.seq == s.seq {
		delete(r.entries, s.id)
	}
	r.head++
}

// done records that the request seq of id stored its outcome.
func (r *repeats) done(id repeatID, seq uint64, status int, location string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[id]; ok && e.seq == seq {
		e.done, e.status, e.location = true, status, location
		r.entries[id] = e
	}
}

// drop forgets the request seq of id, which stored nothing: a retry of it
// under another key repeats nothing.
func (r *repeats) drop(id repeatID, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.entries[id]; ok && e.seq == seq {
		delete(r.entries, id)
	}
}

// mayLog reports whether a repeat may be logged now (one a second).
func (r *repeats) mayLog(now time.Time) bool {
	after := r.logAfter.Load()
	return now.UnixNano() >= after && r.logAfter.CompareAndSwap(after, now.Add(time.Second).UnixNano())
}

// enterRepeats records the request, about to run, for spotting repeats,
// and reports one (Observer.Repeated, a log line); it returns the error
// that refuses the request when its operation refuses repeats.
func (d *Decision[U]) enterRepeats() error {
	o := d.op
	if o.cfg.RepeatWindow <= 0 {
		return nil
	}
	repeats := o.e.repeats
	now := o.e.now()
	d.repeat = repeatIDOf(d.label, d.req.Scope, d.fp)
	key := hashKey(d.req.Key)
	if d.req.Repeat {
		// Meant: recorded, so that its own repeats are seen, never counted.
		_, _, d.repeatSeq = repeats.enter(d.repeat, key, now, o.cfg.RepeatWindow, false)
		return nil
	}
	earlier, found, seq := repeats.enter(d.repeat, key, now, o.cfg.RepeatWindow, o.cfg.RefuseRepeats)
	d.repeatSeq = seq
	if !found {
		return nil
	}
	refused := o.cfg.RefuseRepeats
	o.e.cfg.Observer.Repeated(d.label, refused)
	if repeats.mayLog(now) {
		o.e.cfg.Logger.Warn("idempotency: a request repeats one made under another key (a client making a new key per attempt?)",
			"operation", d.label, "scope", d.req.Scope, "refused", refused,
			"key_sha256", hex.EncodeToString(key[:]), "earlier_key_sha256", hex.EncodeToString(earlier.key[:]),
			"earlier_age", now.Sub(earlier.began).Round(time.Millisecond).String(), "earlier_running", !earlier.done)
	}
	if !refused {
		return nil
	}
	return &repeatedError{age: now.Sub(earlier.began), running: !earlier.done, status: earlier.status, location: earlier.location}
}

// repeatDone records the run's stored outcome for spotting repeats; a nil
// resp (nothing stored) forgets the run.
func (d *Decision[U]) repeatDone(resp *Response) {
	if d.repeatSeq == 0 {
		return
	}
	seq := d.repeatSeq
	d.repeatSeq = 0
	if resp == nil {
		d.op.e.repeats.drop(d.repeat, seq)
		return
	}
	d.op.e.repeats.done(d.repeat, seq, resp.Status, resp.Header.Get("Location"))
}
