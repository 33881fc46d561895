package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/service/payments"
	"github.com/oncekey/oncekey/internal/service/provider"
)

// sampleRecords are records of every kind, as a client appends them.
func sampleRecords(now time.Time) []client.Record {
	var out []client.Record
	for i := range 4 {
		key := fmt.Sprintf("key-%d", i)
		out = append(out,
			client.Record{Kind: client.RecordSent, Key: key, Server: "http://127.0.0.1:1", Method: "POST", Path: "/orders",
				Intent: fmt.Sprintf("intent %d", i), Body: []byte(`{"amount":1200}`), Time: now},
			client.Record{Kind: client.RecordAnswered, Key: key, Status: 201, Body: []byte(`{"id":"` + key + `"}`), Time: now})
	}
	return append(out, client.Record{Kind: client.RecordSent, Key: "last", Server: "http://127.0.0.1:1", Method: "POST", Path: "/orders", Time: now})
}

// TestFileJournalSurvivesATornRecord: a journal cut at every byte offset
// of the whole file (a crash in the middle of an append, of the last
// record or of any earlier one being the last) opens without error, warns
// when the cut is inside a record, keeps every record before the cut, and
// (checked at every cut of the last record and between records) takes
// appends after them.
func TestFileJournalSurvivesATornRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	whole := filepath.Join(dir, "whole")
	now := time.Now().UTC().Truncate(time.Second)
	want := sampleRecords(now)
	j, err := client.OpenFileJournal(ctx, whole, client.FileJournalOptions{})
	require.NoError(t, err)
	ends := []int{0} // the file's size after each record
	for _, r := range want {
		require.NoError(t, j.Append(r))
		info, err := os.Stat(whole)
		require.NoError(t, err)
		ends = append(ends, int(info.Size()))
	}
	require.NoError(t, j.Close())
	data, err := os.ReadFile(whole)
	require.NoError(t, err)
	require.Equal(t, len(data), ends[len(ends)-1])

	for cut := 0; cut <= len(data); cut++ {
		path := filepath.Join(dir, fmt.Sprintf("cut-%d", cut))
		require.NoError(t, os.WriteFile(path, data[:cut], 0o600))
		var warnings []string
		j, err := client.OpenFileJournal(ctx, path, client.FileJournalOptions{Warn: func(s string) { warnings = append(warnings, s) }})
		require.NoError(t, err, "cut at %d", cut)
		whole := 0 // records wholly before the cut
		for whole+1 < len(ends) && ends[whole+1] <= cut {
			whole++
		}
		require.Equal(t, want[:whole], append([]client.Record{}, j.Records()...), "cut at %d: every record before it is kept", cut)
		if cut == ends[whole] {
			require.Empty(t, warnings, "cut at %d is between records", cut)
		} else {
			require.Len(t, warnings, 1, "cut at %d is inside record %d", cut, whole)
		}
		if cut < ends[len(ends)-2] && cut != ends[whole] {
			require.NoError(t, j.Close())
			continue // appending after a cut: every cut in the last record, and between records
		}
		extra := client.Record{Kind: client.RecordSent, Key: "after", Server: "http://127.0.0.1:1", Method: "POST", Path: "/orders", Time: now}
		require.NoError(t, j.Append(extra))
		require.NoError(t, j.Close())
		j, err = client.OpenFileJournal(ctx, path, client.FileJournalOptions{})
		require.NoError(t, err)
		require.Equal(t, append(want[:whole:whole], extra), j.Records(), "cut at %d: an append after the torn tail reads back", cut)
		require.NoError(t, j.Close())
	}
}

// TestFileJournalLock: a journal open in one place cannot be opened in
// another until it is closed (flock keeps open files apart even within one
// process); the waiting open ends with its context.
func TestFileJournalLock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "journal")
	first, err := client.OpenFileJournal(context.Background(), path, client.FileJournalOptions{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = client.OpenFileJournal(ctx, path, client.FileJournalOptions{})
	require.ErrorIs(t, err, context.DeadlineExceeded, "held by the first")
	require.ErrorContains(t, err, "held by another process")
	require.NoError(t, first.Close())
	second, err := client.OpenFileJournal(context.Background(), path, client.FileJournalOptions{})
	require.NoError(t, err, "free once closed")
	require.NoError(t, second.Close())
}

// TestFileJournalCompaction: opening a journal drops the operations
// answered longer ago than their server's retention (advertised, else
// KeyRetention), keeps the ones never answered however old (they are
// reported Expired, never forgotten silently) and the servers'
// retentions, and says so in a smaller file.
func TestFileJournalCompaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	now := time.Now().UTC().Truncate(time.Second)
	short, long := "http://short.example", "http://long.example"
	sent := func(key, server string, age time.Duration) client.Record {
		return client.Record{Kind: client.RecordSent, Key: key, Server: server, Method: "POST", Path: "/orders", Time: now.Add(-age)}
	}
	answered := func(key string) client.Record {
		return client.Record{Kind: client.RecordAnswered, Key: key, Status: 201, Body: []byte(`{}`), Time: now}
	}
	j, err := client.OpenFileJournal(ctx, path, client.FileJournalOptions{})
	require.NoError(t, err)
	for _, r := range []client.Record{
		{Kind: client.RecordRetention, Server: short, Retention: time.Hour, Time: now},
		sent("old-short", short, 2*time.Hour), answered("old-short"),
		sent("young-short", short, 30*time.Minute), answered("young-short"),
		sent("old-long", long, 30*time.Hour), answered("old-long"), // KeyRetention 24h
		sent("young-long", long, 2*time.Hour), answered("young-long"),
		sent("unanswered", short, 100*time.Hour),
		sent("forgotten", short, 2*time.Hour), {Kind: client.RecordForgotten, Key: "forgotten", Time: now},
	} {
		require.NoError(t, j.Append(r))
	}
	require.NoError(t, j.Close())
	before, err := os.Stat(path)
	require.NoError(t, err)

	j, err = client.OpenFileJournal(ctx, path, client.FileJournalOptions{Now: func() time.Time { return now }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	var keys []string
	for _, r := range j.Records() {
		if r.Kind == client.RecordSent {
			keys = append(keys, r.Key)
		}
	}
	require.Equal(t, []string{"young-short", "young-long", "unanswered"}, keys)
	require.Equal(t, client.RecordRetention, j.Records()[0].Kind, "the server's retention is kept")
	after, err := os.Stat(path)
	require.NoError(t, err)
	require.Less(t, after.Size(), before.Size(), "rewritten")
	entries, err := filepath.Glob(filepath.Join(filepath.Dir(path), "journal.tmp*"))
	require.NoError(t, err)
	require.Empty(t, entries, "no temporary file left")
}

// fakeServer answers each path as scripted and counts the requests.
type fakeServer struct {
	*httptest.Server
	requests atomic.Int32
	keys     chan string
}

func newFakeServer(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *fakeServer {
	t.Helper()
	f := &fakeServer{keys: make(chan string, 100)}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		f.keys <- r.Header.Get("Idempotency-Key")
		handle(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func newJournaled(t *testing.T, url string, j client.Journal, keyRetention time.Duration) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{BaseURL: url, APIKey: "k", Journal: j, KeyRetention: keyRetention,
		MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	require.NoError(t, err)
	return c
}

func orderAnswer(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"order-for-%s","amount":1200,"currency":"RUB","items":[],"status":"pending"}`, r.Header.Get("Idempotency-Key"))
}

// TestIntentAnsweredFromTheJournal: an intent run a second time returns
// the first run's answer from the journal without sending anything; an
// operation without an intent is journaled too (Pending sees it until it
// is answered); an intent without a journal is an error, not a silent
// new key.
func TestIntentAnsweredFromTheJournal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var drop atomic.Bool
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		if drop.Load() {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.Header().Set("Idempotency-TTL", "3600")
		orderAnswer(w, r)
	})
	j := client.NewMemoryJournal()
	c := newJournaled(t, srv.URL, j, 0)

	first, err := c.Intent("checkout cart 123").CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	again, err := c.Intent("checkout cart 123").CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	require.Equal(t, first, again, "the stored answer")
	require.EqualValues(t, 1, srv.requests.Load(), "the second run sent nothing")
	other, err := c.Intent("checkout cart 456").CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	require.NotEqual(t, first.Id, other.Id, "another intent, another key")
	require.Empty(t, c.Pending())

	drop.Store(true)
	_, err = c.CreateOrder(ctx, seedOrder)
	require.Error(t, err)
	pending := c.Pending()
	require.Len(t, pending, 1, "an operation without an intent is journaled")
	require.Equal(t, "POST", pending[0].Method)
	require.Equal(t, "/orders", pending[0].Path)
	require.Equal(t, srv.URL, pending[0].Server)
	require.Len(t, pending[0].BodySHA256, 64)
	var retention []client.Record
	for _, r := range j.Records() {
		if r.Kind == client.RecordRetention {
			retention = append(retention, r)
		}
	}
	require.Len(t, retention, 1, "the advertised retention, journaled once")
	require.Equal(t, time.Hour, retention[0].Retention)

	drop.Store(false)
	outcomes, err := c.Resume(ctx)
	require.NoError(t, err)
	require.Len(t, outcomes, 1)
	require.Equal(t, client.OutcomeAnswered, outcomes[0].Kind)
	require.Equal(t, pending[0].Key, outcomes[0].Entry.Key)
	require.Contains(t, string(outcomes[0].Body), "order-for-"+pending[0].Key, "resent with its own key")
	require.Empty(t, c.Pending())

	bare, err := client.New(client.Config{BaseURL: srv.URL, APIKey: "k"})
	require.NoError(t, err)
	before := srv.requests.Load()
	_, err = bare.Intent("x").CreateOrder(ctx, seedOrder)
	require.ErrorContains(t, err, "needs Config.Journal")
	require.Equal(t, before, srv.requests.Load())
}

// TestExpiredOperationsAreNotResent: an operation never answered and older
// than its server's retention — the one it advertised, else KeyRetention —
// is reported Expired by Resume and refused to its intent, and the server
// gets no request; a younger one is resent.
func TestExpiredOperationsAreNotResent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name         string
		advertised   time.Duration // 0: none
		keyRetention time.Duration
		age          time.Duration
		expired      bool
	}{
		{"older than KeyRetention", 0, 0, 25 * time.Hour, true},
		{"younger than KeyRetention", 0, 0, 23 * time.Hour, false},
		{"older than a configured KeyRetention", 0, time.Hour, 2 * time.Hour, true},
		{"older than the advertised retention", time.Hour, 48 * time.Hour, 2 * time.Hour, true},
		{"younger than the advertised retention", 72 * time.Hour, 0, 48 * time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, orderAnswer)
			j := client.NewMemoryJournal()
			if tt.advertised > 0 {
				require.NoError(t, j.Append(client.Record{Kind: client.RecordRetention, Server: srv.URL, Retention: tt.advertised, Time: time.Now()}))
			}
			body, err := json.Marshal(seedOrder) // as the generated client sends it
			require.NoError(t, err)
			sum := sha256.Sum256(body)
			require.NoError(t, j.Append(client.Record{Kind: client.RecordSent, Key: "k1", Server: srv.URL, Method: "POST", Path: "/orders",
				Intent: "checkout", ContentType: "application/json", Body: body, BodySHA256: hex.EncodeToString(sum[:]), Time: time.Now().Add(-tt.age)}))
			c := newJournaled(t, srv.URL, j, tt.keyRetention)

			outcomes, err := c.Resume(ctx)
			require.NoError(t, err)
			require.Len(t, outcomes, 1)
			order, err := c.Intent("checkout").CreateOrder(ctx, seedOrder)
			var expired *client.ExpiredError
			if tt.expired {
				require.ErrorAs(t, err, &expired, "the intent is refused")
				require.Equal(t, "k1", expired.Entry.Key)
				require.Equal(t, client.OutcomeExpired, outcomes[0].Kind)
				require.ErrorAs(t, outcomes[0].Err, &expired)
				require.Zero(t, srv.requests.Load(), "an expired key is never sent")
				require.Len(t, c.Pending(), 1, "still pending until forgotten")
				require.NoError(t, c.Forget("k1"))
				require.Empty(t, c.Pending())
				return
			}
			require.NoError(t, err)
			require.Equal(t, client.OutcomeAnswered, outcomes[0].Kind)
			require.Equal(t, "order-for-k1", order.Id, "the intent gets Resume's answer")
			require.EqualValues(t, 1, srv.requests.Load(), "resent once, then answered from the journal")
			require.Equal(t, "k1", <-srv.keys, "sent with its journaled key")
		})
	}
}

// TestResumeOutcomes: Resume reports each pending operation's end as its
// own kind, from the answer the server gives its key.
func TestResumeOutcomes(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		problem := func(status int, typ string) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"type":"https://oncekey.dev/problems/%s","title":"t","status":%d}`, typ, status)
		}
		switch r.URL.Path {
		case "/answered":
			orderAnswer(w, r)
		case "/long":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"id":"pay_1","status":"pending"}`)
		case "/refused":
			problem(http.StatusUnprocessableEntity, "validation-failed")
		case "/unknown":
			problem(http.StatusConflict, "outcome-unknown")
		case "/inprogress":
			problem(http.StatusAccepted, "request-in-progress")
		default:
			problem(http.StatusServiceUnavailable, "unavailable")
		}
	})
	j := client.NewMemoryJournal()
	paths := map[string]client.OutcomeKind{
		"/answered": client.OutcomeAnswered, "/long": client.OutcomeAnswered, "/refused": client.OutcomeRefused,
		"/unknown": client.OutcomeUnknown, "/inprogress": client.OutcomeInProgress, "/failing": client.OutcomeFailed,
	}
	for path := range paths {
		require.NoError(t, j.Append(client.Record{Kind: client.RecordSent, Key: "key" + strings.ReplaceAll(path, "/", "-"), Server: srv.URL,
			Method: "POST", Path: path, ContentType: "application/json", Body: []byte(`{}`), Time: time.Now()}))
	}
	c := newJournaled(t, srv.URL, j, 0)
	outcomes, err := c.Resume(context.Background())
	require.NoError(t, err)
	require.Len(t, outcomes, len(paths))
	for _, o := range outcomes {
		require.Equal(t, paths[o.Entry.Path], o.Kind, "%s: %v", o.Entry.Path, o.Err)
		if o.Kind != client.OutcomeAnswered {
			require.Error(t, o.Err, o.Entry.Path)
		}
	}
	var left []string
	for _, e := range c.Pending() {
		left = append(left, e.Path)
	}
	require.ElementsMatch(t, []string{"/inprogress", "/failing"}, left, "only the ones without a final answer stay pending")
}

// TestIntentRefusesAnotherRequest: an intent run with another request than
// the one its key was journaled with (another body, another operation) is
// an error, and nothing is sent: the journal's answer, or the server's
// replay, would be another request's.
func TestIntentRefusesAnotherRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := newFakeServer(t, orderAnswer)
	c := newJournaled(t, srv.URL, client.NewMemoryJournal(), 0)
	_, err := c.Intent("checkout").CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	other := seedOrder
	other.Amount++
	_, err = c.Intent("checkout").CreateOrder(ctx, other)
	require.ErrorContains(t, err, "for another request")
	_, err = c.Intent("checkout").CancelOrder(ctx, "order-1")
	require.ErrorContains(t, err, "for another request")
	require.EqualValues(t, 1, srv.requests.Load(), "only the first was sent")
}

// TestIntentOnceAcrossGoroutines: goroutines of one process running one
// intent at once send it once, and all get its answer.
func TestIntentOnceAcrossGoroutines(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, orderAnswer)
	c := newJournaled(t, srv.URL, client.NewMemoryJournal(), 0)
	ids := make(chan string, 8)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			order, err := c.Intent("checkout").CreateOrder(context.Background(), seedOrder)
			if err != nil {
				errs <- err
				return
			}
			ids <- order.Id
		}()
	}
	first := ""
	for range 8 {
		select {
		case err := <-errs:
			t.Fatal(err)
		case id := <-ids:
			if first == "" {
				first = id
			}
			require.Equal(t, first, id, "one answer for all")
		case <-time.After(10 * time.Second):
			t.Fatal("the goroutines did not finish within 10s")
		}
	}
	require.EqualValues(t, 1, srv.requests.Load(), "sent once")
}

// TestLongOperationAnswerIsJournaled: the 202 of a long operation (a
// payment, accepted and pending) is its answer: journaled, not pending,
// and its intent run again returns the accepted payment from the journal
// without a request, on the real service.
func TestLongOperationAnswerIsJournaled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupPayments(t, provider.Faults{Latency: time.Second}) // still pending when the intent runs again
	journal := client.NewMemoryJournal()
	c, err := client.New(client.Config{BaseURL: b.svc.URL, APIKey: b.svc.APIKey, Journal: journal})
	require.NoError(t, err)
	order, err := c.Intent("checkout cart 7").CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	var advertised []time.Duration
	for _, r := range journal.Records() {
		if r.Kind == client.RecordRetention {
			advertised = append(advertised, r.Retention)
		}
	}
	require.Equal(t, []time.Duration{48 * time.Hour}, advertised, "the service's Idempotency-TTL (its default 48h), journaled once")
	pay := api.NewPayment{OrderId: order.Id, Amount: order.Amount, Currency: order.Currency}
	payment, err := c.Intent("pay cart 7").CreatePayment(ctx, pay)
	require.NoError(t, err)
	require.Equal(t, api.PaymentStatus(payments.StatusPending), payment.Status, "accepted (202)")
	require.Empty(t, c.Pending(), "a long operation's 202 is an answer")

	b.injector.then()
	again, err := c.Intent("pay cart 7").CreatePayment(ctx, pay)
	require.NoError(t, err)
	require.Equal(t, payment, again, "the accepted payment, from the journal")
	require.Empty(t, b.injector.seen(), "nothing sent")
}

// TestFileJournalSyncsBeforeItSends: the record of an operation's key is
// fsynced before the request leaves, and its answer's record before the
// call returns. A kill -9 cannot show a missing fsync (the page cache
// survives the process), so this counts them. Not parallel: it swaps the
// journal's fsync.
func TestFileJournalSyncsBeforeItSends(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := client.OpenFileJournal(ctx, path, client.FileJournalOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	syncs := client.CountFsyncs(t)
	var atArrival atomic.Int64
	var onDisk atomic.Value
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		atArrival.Store(syncs.Load())
		raw, err := os.ReadFile(path)
		if err == nil {
			onDisk.Store(string(raw))
		}
		orderAnswer(w, r)
	})
	c := newJournaled(t, srv.URL, j, 0)

	_, err = c.Intent("checkout cart 7").CreateOrder(ctx, seedOrder)
	require.NoError(t, err)
	require.EqualValues(t, 1, atArrival.Load(), "the key's record was fsynced once before the request left")
	key := j.Records()[0].Key
	require.Contains(t, onDisk.Load(), key, "and was in the file")
	require.GreaterOrEqual(t, syncs.Load(), int64(2), "the answer's record was fsynced before the call returned")
}

// TestFileJournalCompactsWhileRunning: a process that never reopens its
// journal still keeps it the size of what is live. Once the journal holds
// 1,024 records, answered operations older than their retention go, the
// unanswered stay, and the appends after it land in the compacted file,
// which a later process reads whole.
func TestFileJournalCompactsWhileRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	start := time.Now()
	var now atomic.Int64
	now.Store(start.UnixNano())
	opts := client.FileJournalOptions{KeyRetention: time.Hour, Now: func() time.Time { return time.Unix(0, now.Load()) }}
	j, err := client.OpenFileJournal(ctx, path, opts)
	require.NoError(t, err)
	sent := func(key string) client.Record {
		return client.Record{Kind: client.RecordSent, Key: key, Server: "http://127.0.0.1:1", Method: "POST", Path: "/orders", Time: time.Unix(0, now.Load())}
	}
	require.NoError(t, j.Append(sent("never-answered")))
	for i := range 600 {
		key := fmt.Sprintf("op-%d", i)
		require.NoError(t, j.Append(sent(key)))
		require.NoError(t, j.Append(client.Record{Kind: client.RecordAnswered, Key: key, Status: 201, Body: []byte(`{}`), Time: time.Unix(0, now.Load())}))
		now.Add(int64(10 * time.Second)) // 600 operations over 100 minutes: the first 240 or so are past the hour
	}
	records := j.Records()
	require.Less(t, len(records), 1000, "compacted while running")
	require.Equal(t, "never-answered", records[0].Key, "the unanswered operation stays")
	require.NoError(t, j.Append(sent("after")))
	keys := func(records []client.Record) (out []string) {
		for _, r := range records {
			out = append(out, string(r.Kind)+" "+r.Key)
		}
		return out
	}
	want := keys(j.Records())
	require.NoError(t, j.Close())

	info, err := os.Stat(path)
	require.NoError(t, err)
	again, err := client.OpenFileJournal(ctx, path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = again.Close() })
	got := keys(again.Records())
	// Opening compacts again, now that more have aged past the hour: what
	// is read is what was written, less those.
	require.Subset(t, want, got, "the compacted file, read whole (%d bytes)", info.Size())
	require.Contains(t, got, "sent never-answered")
	require.Contains(t, got, "sent after", "an append after the compaction is in the new file")
	require.Contains(t, got, "answered op-599")
}
