package conformance_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/oncekey/oncekey/idempotency"
)

// bugs are the ways the toy server can break the protocol, one at a time.
type bugs struct {
	runsEveryDuplicate     bool // never looks a key up
	replaysDifferentBody   bool // a replay's body is not the stored bytes
	ignoresFingerprint     bool // replays whatever the key holds
	leaksAcrossCredentials bool // one key space for every caller
	refusesOthersKeys      bool // a key another caller used is refused (403)
	storesValidationErrors bool // a 400 is stored under the key
	replaysSetCookie       bool // stores the Set-Cookie it sent
	acceptsNoKey           bool // runs requests without a key
	acceptsAnyKey          bool // neither empty nor over-long keys are refused
	comparesBytes          bool // the fingerprint is the body's bytes
	inFlightAs409          bool // a duplicate in flight gets 409, not 202
	noRetryAfter           bool // the in-flight answer says not when to come back
	answersOffSpec         bool // a widget's size comes as a string
	storesServerErrors     bool // a 5xx is stored under the key
	keepsKeyOnError        bool // a 5xx stores nothing, and its key's retries are refused (409)
	forgetsKeys            bool // a key is forgotten keptFor after its answer (but a large answer's: its retry follows a 1.5 MiB transfer, whose time on a busy machine is unbounded; only retention is about time)
	truncatesLarge         bool // stores at most 256 KiB of an answer
	// Not a bug: an answer over 1 MiB is not stored, and its retries are
	// refused with 409, as Oncekey's gateway refuses what it could not store.
	refusesLargeReplay bool
}

// keptFor is how long a toy that forgets keys keeps one.
const keptFor = 500 * time.Millisecond

// largeNotes is the size of the notes X-Large adds to a widget: above
// conformance.LargeAnswerBytes, below conformance.MaxAnswerBytes.
const largeNotes = 3 << 19

// toy is a small widget API that keeps the Idempotency-Key protocol the
// oncekey profile describes, written by hand for the test (not with the
// idempotency package, so that each bug can be put in), unless bugs says
// otherwise. Every operation takes 50ms, so that identical requests sent at
// once overlap; X-Slow makes one take longer, X-Fail makes it fail (500)
// and X-Large makes its widget carry notes of 1.5 MiB.
type toy struct {
	bugs bugs

	mu      sync.Mutex
	records map[string]*record // scope + key
	widgets map[string]map[string]any
	ran     int
}

type record struct {
	fingerprint string
	done        chan struct{}
	stored      time.Time // when done closed
	status      int
	header      http.Header
	body        []byte
}

func newToy(b bugs) *toy {
	return &toy{bugs: b, records: map[string]*record{}, widgets: map[string]map[string]any{}}
}

func (t *toy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	scope := map[string]string{"Bearer a": "a", "Bearer b": "b"}[r.Header.Get("Authorization")]
	if scope == "" {
		problem(w, 401, idempotency.ProblemOf(idempotency.ErrNoScope).Slug)
		return
	}
	route := ""
	id := ""
	switch parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/"); {
	case len(parts) == 1 && parts[0] == "widgets" && r.Method == http.MethodPost:
		route = "POST /widgets"
	case len(parts) == 2 && parts[0] == "widgets" && r.Method == http.MethodGet:
		t.get(w, parts[1])
		return
	case len(parts) == 3 && parts[0] == "widgets" && parts[2] == "paint" && r.Method == http.MethodPost:
		route, id = "POST /widgets/{id}/paint", parts[1]
	default:
		problem(w, 404, "not found")
		return
	}
	body, _ := io.ReadAll(r.Body)
	keys := r.Header.Values("Idempotency-Key")
	switch {
	case len(keys) == 0 && t.bugs.acceptsNoKey:
		t.execute(w, r, route, id, body)
		return
	case len(keys) == 0:
		problem(w, 400, "missing Idempotency-Key")
		return
	case (keys[0] == "" || len(keys[0]) > 255) && !t.bugs.acceptsAnyKey:
		problem(w, 400, "invalid Idempotency-Key")
		return
	}
	if t.bugs.leaksAcrossCredentials {
		scope = ""
	}
	fingerprint := route + " " + r.URL.Path + " " + canonical(r.Header.Get("Content-Type"), body)
	if t.bugs.comparesBytes {
		fingerprint = route + " " + r.URL.Path + " " + string(body)
	}
	slot := scope + "\x00" + keys[0]

	t.mu.Lock()
	if t.bugs.refusesOthersKeys && t.usedByOther(scope, keys[0]) {
		t.mu.Unlock()
		problem(w, 403, "Idempotency-Key belongs to another account")
		return
	}
	rec, seen := t.records[slot]
	if t.bugs.runsEveryDuplicate || (seen && t.bugs.forgetsKeys && rec.age() > keptFor && r.Header.Get("X-Large") == "") {
		seen = false
	}
	if !seen {
		rec = &record{fingerprint: fingerprint, done: make(chan struct{})}
		t.records[slot] = rec
	}
	t.mu.Unlock()

	if seen {
		select {
		case <-rec.done:
		default:
			if !t.bugs.noRetryAfter {
				w.Header().Set("Retry-After", "0")
			}
			if t.bugs.inFlightAs409 {
				problem(w, 409, "in progress")
				return
			}
			problem(w, 202, "in progress")
			return
		}
		if rec.fingerprint != fingerprint && !t.bugs.ignoresFingerprint {
			problem(w, 409, "Idempotency-Key was used for another request")
			return
		}
		if rec.status == 0 {
			problem(w, 409, "the answer was not stored")
			return
		}
		for name, values := range rec.header {
			w.Header()[name] = values
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(rec.status)
		if t.bugs.replaysDifferentBody {
			w.Write(bytes.ToUpper(rec.body))
			return
		}
		w.Write(rec.body)
		return
	}

	rw := &recorded{header: http.Header{}}
	t.execute(rw, r, route, id, body)
	switch {
	case rw.status >= 500 && t.bugs.keepsKeyOnError:
		// Kept, with no answer: rec.status stays 0.
	case rw.status == 400 && !t.bugs.storesValidationErrors, rw.status >= 500 && !t.bugs.storesServerErrors:
		t.mu.Lock()
		delete(t.records, slot)
		t.mu.Unlock()
	case rw.body.Len() > 1<<20 && t.bugs.refusesLargeReplay:
		// Ran, and not stored: rec.status stays 0.
	default:
		rec.status, rec.body, rec.header = rw.status, rw.body.Bytes(), rw.header.Clone()
		if !t.bugs.replaysSetCookie {
			rec.header.Del("Set-Cookie")
		}
		if t.bugs.truncatesLarge && len(rec.body) > 256<<10 {
			rec.body = rec.body[:256<<10]
		}
	}
	rec.stored = time.Now()
	close(rec.done)
	for name, values := range rw.header {
		w.Header()[name] = values
	}
	w.WriteHeader(rw.status)
	w.Write(rw.body.Bytes())
}

// age is how long ago rec's answer was stored; 0 while it runs.
func (rec *record) age() time.Duration {
	select {
	case <-rec.done:
		return time.Since(rec.stored)
	default:
		return 0
	}
}

// usedByOther reports whether a caller other than scope used key. t.mu
// is held.
func (t *toy) usedByOther(scope, key string) bool {
	for slot := range t.records {
		other, k, _ := strings.Cut(slot, "\x00")
		if k == key && other != scope {
			return true
		}
	}
	return false
}

// execute runs an operation: it creates or paints a widget.
func (t *toy) execute(w http.ResponseWriter, r *http.Request, route, id string, body []byte) {
	slow(r)
	if r.Header.Get("X-Fail") != "" {
		problem(w, 500, "failed on demand")
		return
	}
	in, ok := decodeBody(r.Header.Get("Content-Type"), body)
	if !ok {
		problem(w, 400, "not JSON, nor a form")
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var widget map[string]any
	switch route {
	case "POST /widgets":
		name, ok1 := in["name"].(string)
		size, ok2 := in["size"].(float64)
		if !ok1 || !ok2 || name == "" || size < 1 || size > 100 || len(in) != 2 {
			problem(w, 400, "invalid widget")
			return
		}
		widget = map[string]any{"id": uuid.NewString(), "name": name, "size": size}
		if t.bugs.answersOffSpec {
			widget["size"] = fmt.Sprint(size)
		}
		t.widgets[widget["id"].(string)] = widget
	default:
		if _, err := uuid.Parse(id); err != nil {
			problem(w, 400, "invalid id")
			return
		}
		if r.URL.Query().Get("coats") == "" {
			problem(w, 400, "how many coats?")
			return
		}
		color, _ := in["color"].(string)
		if color != "red" && color != "blue" && color != "green" || len(in) != 1 {
			problem(w, 400, "invalid color")
			return
		}
		if widget = t.widgets[id]; widget == nil {
			problem(w, 404, "no such widget")
			return
		}
		widget["color"] = color
	}
	if r.Header.Get("X-Large") != "" {
		widget = maps.Clone(widget)
		widget["notes"] = strings.Repeat("n", largeNotes)
	}
	t.ran++
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Set-Cookie", fmt.Sprintf("session=%d; HttpOnly", t.ran))
	if route == "POST /widgets" {
		w.Header().Set("Location", "/widgets/"+widget["id"].(string))
		w.WriteHeader(201)
	}
	json.NewEncoder(w).Encode(widget)
}

func (t *toy) get(w http.ResponseWriter, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	widget := t.widgets[id]
	if widget == nil {
		problem(w, 404, "no such widget")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(widget)
}

func problem(w http.ResponseWriter, status int, title string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"title": title, "status": status})
}

// canonical is a form body with its fields sorted by key and encoded
// alike, or a JSON body with its keys sorted and no whitespace.
func canonical(contentType string, body []byte) string {
	if contentType == formMedia {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return string(body)
		}
		return form.Encode()
	}
	var v any
	if json.Unmarshal(body, &v) != nil {
		return string(body)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

const formMedia = "application/x-www-form-urlencoded"

// decodeBody reads a JSON object, or a form whose every key has one value
// (numbers in it as numbers, as the widget's schema types them).
func decodeBody(contentType string, body []byte) (map[string]any, bool) {
	var in map[string]any
	if contentType != formMedia {
		return in, json.Unmarshal(body, &in) == nil
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, false
	}
	in = map[string]any{}
	for k, v := range form {
		if len(v) != 1 {
			return nil, false
		}
		in[k] = v[0]
		if n, err := strconv.ParseFloat(v[0], 64); err == nil {
			in[k] = n
		}
	}
	return in, true
}

// recorded is a response held until the toy has stored it.
type recorded struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorded) Header() http.Header { return r.header }
func (r *recorded) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}
func (r *recorded) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return r.body.Write(b)
}
