package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oncekey/oncekey/client/internal/crashpoint"
)

// defaultKeyRetention is Config.KeyRetention's default: shorter than the
// service's own default (48h), so that without a word from the server a
// key is never resent after the server may have forgotten it.
const defaultKeyRetention = 24 * time.Hour

// headerKey is the request header that carries an operation's key (the
// engine's idempotency.HeaderKey, spelt out: the SDK links no engine).
const headerKey = "Idempotency-Key"

// headerRetention is the response header in which a server advertises
// how long it keeps a key (delta-seconds).
const headerRetention = "Idempotency-TTL"

// Entry is an operation the journal holds: its key and what was sent.
type Entry struct {
	Key    string
	Intent string
	// Server is the origin the request went to; Method and Path (with its
	// query) are the request's.
	Server, Method, Path string
	// BodySHA256 is the hex SHA-256 of the request's body.
	BodySHA256 string
	// SentAt is when the first attempt was about to leave.
	SentAt time.Time
}

func entryOf(r Record) Entry {
	return Entry{Key: r.Key, Intent: r.Intent, Server: r.Server, Method: r.Method, Path: r.Path, BodySHA256: r.BodySHA256, SentAt: r.Time}
}

// ExpiredError is an operation sent and never answered whose server may
// have forgotten its key by now (its retention has run out): sending it
// again could run it a second time, so it is not sent. Check whether it
// happened by reading the resource, then settle it with Client.Forget.
type ExpiredError struct {
	Entry     Entry
	Retention time.Duration
}

// Error names the key and how old it is.
func (e *ExpiredError) Error() string {
	return fmt.Sprintf("oncekey: key %s (%s %s, sent %s) was never answered and is older than the server's retention %s: not resent",
		e.Entry.Key, e.Entry.Method, e.Entry.Path, e.Entry.SentAt.Format(time.RFC3339), e.Retention)
}

// Intent returns a client whose operations run under name, the caller's
// name for one logical operation ("checkout cart 123"): the first run
// journals its key, and a later run of the same intent, in this process or
// after a restart, reuses that key instead of minting one. If the
// operation was answered, its answer comes from the journal and nothing is
// sent; if it never was, it is sent again with the same key, and the server
// runs it once or replays it. It needs Config.Journal. An intent is
// remembered as long as the journal keeps its operation (its server's
// retention after it was sent).
func (c *Client) Intent(name string) *Client {
	cp := *c
	cp.intent = name
	return &cp
}

// Do sends req through the client's HTTP client: an Idempotent attempt
// that sends with it is journaled (Config.Journal) like the client's own
// methods; one sent with another client is not.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	return c.cfg.HTTPClient.Do(req)
}

// Pending lists the journal's operations sent and never answered, oldest
// first (nil without a journal): those a process before this one left, and
// those this one is sending now or gave up on.
func (c *Client) Pending() []Entry {
	if c.cfg.Journal == nil {
		return nil
	}
	s := fold(c.cfg.Journal.Records())
	var out []Entry
	for _, key := range s.order {
		if _, answered := s.answered[key]; answered || s.forgotten[key] {
			continue
		}
		out = append(out, entryOf(s.sent[key]))
	}
	return out
}

// Forget settles a pending operation the caller has dealt with another way
// (typically an expired one, after reading the resource): it is no longer
// pending, and its intent, if it had one, is forgotten once the journal
// compacts it.
func (c *Client) Forget(key string) error {
	if c.cfg.Journal == nil {
		return errors.New("client: Forget needs Config.Journal")
	}
	return c.cfg.Journal.Append(Record{Kind: RecordForgotten, Key: key, Time: time.Now()})
}

// OutcomeKind says how a resumed operation ended.
type OutcomeKind int

// The outcomes of Resume, one per pending operation.
const (
	// OutcomeAnswered: a success (2xx; a long operation's 202 carries the
	// resource to poll). Status and Body are the answer.
	OutcomeAnswered OutcomeKind = iota + 1
	// OutcomeRefused: a final 4xx, the server's stored answer to the key.
	OutcomeRefused
	// OutcomeUnknown: a gateway answered 409 outcome-unknown: it cannot
	// tell whether the operation ran. Read the resource to find out.
	OutcomeUnknown
	// OutcomeInProgress: the server still ran the key's first request
	// (202 request-in-progress) when the attempts ran out: Resume later.
	OutcomeInProgress
	// OutcomeExpired: the operation is older than its server's retention
	// and was NOT sent (the server may have forgotten the key and would run
	// it again). Read the resource to find out, then Forget it.
	OutcomeExpired
	// OutcomeFailed: no answer (network errors or 5xx until the attempts
	// ran out), or the request could not be rebuilt (Err says): still
	// pending.
	OutcomeFailed
)

var outcomeNames = map[OutcomeKind]string{
	OutcomeAnswered: "answered", OutcomeRefused: "refused", OutcomeUnknown: "unknown",
	OutcomeInProgress: "in progress", OutcomeExpired: "expired", OutcomeFailed: "failed",
}

// String names the outcome.
func (k OutcomeKind) String() string { return outcomeNames[k] }

// Outcome is how Resume finished one pending operation.
type Outcome struct {
	Entry Entry
	Kind  OutcomeKind
	// Status and Body are the last answer (none for Expired, none for
	// Failed without one).
	Status int
	Body   []byte
	// Err is the error of a Failed, Refused, Unknown or InProgress
	// outcome, or the *ExpiredError of an Expired one.
	Err error
}

// Resume finishes every pending operation of the journal with its own key,
// retrying as the client's methods do (Retry-After honoured), and reports
// each outcome. An operation older than its server's retention is not
// sent: it is reported OutcomeExpired. The error is for a client without a
// journal; each operation's own failure is in its Outcome.
func (c *Client) Resume(ctx context.Context) ([]Outcome, error) {
	if c.cfg.Journal == nil {
		return nil, errors.New("client: Resume needs Config.Journal")
	}
	s := fold(c.cfg.Journal.Records())
	var out []Outcome
	for _, e := range c.Pending() {
		sent := s.sent[e.Key]
		if err := c.expired(s, sent); err != nil {
			out = append(out, Outcome{Entry: e, Kind: OutcomeExpired, Err: err})
			continue
		}
		out = append(out, c.resume(ctx, sent))
	}
	return out, nil
}

func (c *Client) resume(ctx context.Context, sent Record) Outcome {
	o := Outcome{Entry: entryOf(sent), Kind: OutcomeFailed}
	if sent.BodyTruncated {
		o.Err = fmt.Errorf("oncekey: key %s: its body (over %d bytes) was not journaled: it cannot be resent", sent.Key, MaxStoredBody)
		return o
	}
	unlock := c.intents.lock(sent.Intent)
	defer unlock()
	if !c.intents.start(sent.Key) {
		o.Err = fmt.Errorf("oncekey: key %s is being sent by this process already", sent.Key)
		return o
	}
	defer c.intents.done(sent.Key)
	op := &operation{key: sent.Key, intent: sent.Intent, begun: true}
	err := c.run(ctx, op, func(ctx context.Context, key string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, sent.Method, sent.Server+sent.Path, bytes.NewReader(sent.Body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
		req.Header.Set(headerKey, key)
		if sent.ContentType != "" {
			req.Header.Set("Content-Type", sent.ContentType)
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("oncekey: read the answer: %w", err)
		}
		o.Status, o.Body = resp.StatusCode, body
		return resp, problemOf(resp, body)
	})
	var problem *ProblemError
	switch {
	case err == nil:
		o.Kind = OutcomeAnswered
	case !errors.As(err, &problem) || problem.Status >= 500:
		o.Kind, o.Err = OutcomeFailed, err
	case problem.Status == http.StatusAccepted:
		o.Kind, o.Err = OutcomeInProgress, err
	case problem.Status == http.StatusConflict && strings.HasSuffix(problem.Problem.Type, "outcome-unknown"):
		o.Kind, o.Err = OutcomeUnknown, err
	default:
		o.Kind, o.Err = OutcomeRefused, err
	}
	return o
}

// expired returns an *ExpiredError when sent was never answered and is
// older than its server's retention.
func (c *Client) expired(s journalState, sent Record) error {
	retention := s.retentionOf(sent.Server, c.cfg.KeyRetention)
	if time.Since(sent.Time) < retention {
		return nil
	}
	return &ExpiredError{Entry: entryOf(sent), Retention: retention}
}

// operation is one logical operation under a journal, as the transport
// sees it through the request's context.
type operation struct {
	key, intent string
	// begun: its RecordSent is in the journal.
	begun bool
	// journaled is the RecordSent an intent found: its run must send the
	// same request, or it would get (or be given) another's answer.
	journaled *Record
	// stored is its answer from the journal: returned without sending.
	stored *Record
	// journalErr stops the retries: the operation could not be journaled,
	// so it was not sent.
	journalErr error
}

type operationKey struct{}

// journaled runs attempt as one logical operation under the journal: the
// intent's key if it has one, a new key otherwise.
func (c *Client) journaled(ctx context.Context, attempt Attempt) error {
	unlock := c.intents.lock(c.intent)
	defer unlock()
	op := &operation{intent: c.intent}
	if c.intent != "" {
		s := fold(c.cfg.Journal.Records())
		if key, ok := s.byIntent(c.intent); ok {
			sent := s.sent[key]
			op.key, op.begun, op.journaled = key, true, &sent
			if answer, ok := s.answered[key]; ok {
				op.stored = &answer
			} else if err := c.expired(s, s.sent[key]); err != nil {
				return err
			}
		}
	}
	if op.key == "" {
		op.key = c.cfg.NewKey()
	}
	if !c.intents.start(op.key) {
		return fmt.Errorf("oncekey: key %s is being sent by this process already (Resume)", op.key)
	}
	defer c.intents.done(op.key)
	return c.run(ctx, op, attempt)
}

// intentLocks keeps one process's runs of one intent apart (the file
// journal's lock keeps processes apart), and knows the keys it is sending,
// which Resume leaves to the run that sends them.
type intentLocks struct {
	mu       sync.Mutex
	locks    map[string]*intentLock
	inflight map[string]bool
}

// intentLock is one intent's lock and how many hold or wait for it, so
// that the map forgets an intent nobody runs.
type intentLock struct {
	sync.Mutex
	users int
}

// start marks key as being sent; false if it already is.
func (l *intentLocks) start(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight[key] {
		return false
	}
	l.inflight[key] = true
	return true
}

// done marks key as no longer being sent.
func (l *intentLocks) done(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inflight, key)
}

// lock waits for intent's lock and returns its unlock.
func (l *intentLocks) lock(intent string) func() {
	if intent == "" {
		return func() {}
	}
	l.mu.Lock()
	m, ok := l.locks[intent]
	if !ok {
		m = &intentLock{}
		l.locks[intent] = m
	}
	m.users++
	l.mu.Unlock()
	m.Lock()
	return func() {
		m.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		if m.users--; m.users == 0 {
			delete(l.locks, intent)
		}
	}
}

// journalTransport journals the requests of operations run under a
// journal: the RecordSent before the first attempt leaves, the answer when
// a final one comes, and the server's advertised retention. Other
// requests pass through.
type journalTransport struct {
	next http.RoundTripper
	c    *Client
	// retention is each server's retention as last journaled (server →
	// time.Duration), so that a header repeated on every answer costs no
	// read of the journal.
	retention sync.Map
}

func (t *journalTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	op, _ := req.Context().Value(operationKey{}).(*operation)
	if op == nil || req.Header.Get(headerKey) != op.key {
		return t.next.RoundTrip(req)
	}
	if op.journaled != nil {
		if err := sameRequest(op, req); err != nil {
			op.journalErr = err
			return nil, err
		}
	}
	if op.stored != nil {
		return storedResponse(req, op.stored)
	}
	j := t.c.cfg.Journal
	server := (&url.URL{Scheme: req.URL.Scheme, Host: req.URL.Host}).String()
	if !op.begun {
		body, err := readBody(req)
		if err != nil {
			return nil, err
		}
		rec := Record{Kind: RecordSent, Key: op.key, Server: server, Method: req.Method, Path: req.URL.RequestURI(),
			Intent: op.intent, ContentType: req.Header.Get("Content-Type"), Time: time.Now()}
		bounded(&rec, body)
		if err := j.Append(rec); err != nil {
			op.journalErr = fmt.Errorf("oncekey: not sent, the journal failed: %w", err)
			return nil, op.journalErr
		}
		op.begun = true
		crashpoint.At(crashpoint.BeforeSend, nil)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	crashpoint.At(crashpoint.AfterSend, nil)
	t.noteRetention(server, resp.Header.Get(headerRetention))
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("oncekey: read the answer: %w", err)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if resp.StatusCode >= 500 || inProgress(resp) {
		return resp, nil // not final: retried with the same key
	}
	crashpoint.At(crashpoint.BeforeRecord, body)
	rec := Record{Kind: RecordAnswered, Key: op.key, Server: server, Status: resp.StatusCode,
		ContentType: resp.Header.Get("Content-Type"), Time: time.Now()}
	bounded(&rec, body)
	// The answer is in hand even if it cannot be journaled: the operation
	// then stays pending, and Resume gets the server's replay of it.
	_ = j.Append(rec)
	return resp, nil
}

// noteRetention journals what server advertised when it differs from
// what the journal knows.
func (t *journalTransport) noteRetention(server, header string) {
	secs, err := strconv.ParseInt(strings.TrimSpace(header), 10, 64)
	if header == "" || err != nil || secs <= 0 {
		return
	}
	d := time.Duration(secs) * time.Second
	if known, ok := t.retention.Load(server); ok && known == d {
		return
	}
	if s := fold(t.c.cfg.Journal.Records()); s.retention[server] != d {
		if err := t.c.cfg.Journal.Append(Record{Kind: RecordRetention, Server: server, Retention: d, Time: time.Now()}); err != nil {
			return
		}
	}
	t.retention.Store(server, d)
}

// sameRequest checks that an intent's run sends the request its journaled
// key was sent with: another would be refused by the server (422, the key's
// request differs) or, answered from the journal, get another's answer.
func sameRequest(op *operation, req *http.Request) error {
	body, err := readBody(req)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	j := op.journaled
	if req.Method == j.Method && req.URL.RequestURI() == j.Path && hex.EncodeToString(sum[:]) == j.BodySHA256 {
		return nil
	}
	return fmt.Errorf("oncekey: intent %q was journaled with key %s for another request (%s %s): not sent", op.intent, op.key, j.Method, j.Path)
}

// readBody reads req's body and puts an unread copy back.
func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("oncekey: read the request body: %w", err)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// bounded sets rec's body hash, and the body itself when it is small
// enough to keep.
func bounded(rec *Record, body []byte) {
	sum := sha256.Sum256(body)
	rec.BodySHA256 = hex.EncodeToString(sum[:])
	if len(body) > MaxStoredBody {
		rec.BodyTruncated = true
		return
	}
	rec.Body = body
}

// storedResponse is the journal's answer to an intent, as a response.
func storedResponse(req *http.Request, rec *Record) (*http.Response, error) {
	if rec.BodyTruncated {
		return nil, fmt.Errorf("oncekey: key %s was answered %d, but its body (over %d bytes) was not journaled: read the resource", rec.Key, rec.Status, MaxStoredBody)
	}
	h := http.Header{}
	if rec.ContentType != "" {
		h.Set("Content-Type", rec.ContentType)
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", rec.Status, http.StatusText(rec.Status)), StatusCode: rec.Status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Body: io.NopCloser(bytes.NewReader(rec.Body)), ContentLength: int64(len(rec.Body)), Request: req,
	}, nil
}
