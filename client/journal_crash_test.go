package client_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/client/internal/crashpoint"
	"github.com/oncekey/oncekey/gen/api"
	"github.com/oncekey/oncekey/internal/service/servicetest"
	"github.com/oncekey/oncekey/internal/service/store/memory"
)

// buildJournalProc builds client/internal/journalproc, the client program
// the tests kill. It is built without the race detector whatever the test
// binary's flags: the program starts hundreds of times, and its code is
// the SDK's, which the other tests check for races.
func buildJournalProc(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "journalproc")
	out, err := exec.Command("go", "build", "-o", bin, "./internal/journalproc").CombinedOutput()
	require.NoError(t, err, "go build ./internal/journalproc: %s", out)
	return bin
}

// journalClient is a running journal client process.
type journalClient struct {
	cmd    *exec.Cmd
	events chan crashpoint.Event
	stderr *bytes.Buffer
}

func startJournalClient(t *testing.T, bin string, env ...string) *journalClient {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p := &journalClient{cmd: cmd, events: make(chan crashpoint.Event, 16), stderr: &bytes.Buffer{}}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // a no-op once it has ended
	go func() {
		defer close(p.events)
		lines := bufio.NewScanner(stdout)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			var e crashpoint.Event
			if json.Unmarshal(lines.Bytes(), &e) == nil {
				p.events <- e
			}
		}
	}()
	return p
}

// await returns the process's next event named name, failing on an error
// event, its end or the deadline.
func (p *journalClient) await(t *testing.T, name string) crashpoint.Event {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e, ok := <-p.events:
			require.True(t, ok, "the journal client ended before %q: %s", name, p.stderr)
			require.NotEqual(t, "error", e.Event, "journal client: %s", e.Err)
			if e.Event == name {
				return e
			}
		case <-deadline:
			t.Fatalf("no %q from the journal client within 20s: %s", name, p.stderr)
		}
	}
}

// kill ends the process with SIGKILL, as a crash or an OOM kill would.
func (p *journalClient) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.cmd.Wait()
}

// finish collects the process's events to its end, which must be a
// success.
func (p *journalClient) finish(t *testing.T) []crashpoint.Event {
	t.Helper()
	var all []crashpoint.Event
	for e := range p.events {
		require.NotEqual(t, "error", e.Event, "journal client: %s", e.Err)
		all = append(all, e)
	}
	require.NoError(t, p.cmd.Wait(), "journal client: %s", p.stderr)
	return all
}

// journalService is the real service (in memory) the journal clients call.
type journalService struct {
	servicetest.Service
	bin string // client/internal/journalproc
	sdk *client.Client
	// hold, while set, makes the service run each POST to completion and
	// keep its answer until the client goes away, reporting on committed
	// that it ran.
	hold      *atomic.Bool
	committed chan struct{}
}

func startJournalService(t *testing.T) journalService {
	t.Helper()
	s := journalService{bin: buildJournalProc(t), hold: &atomic.Bool{}, committed: make(chan struct{}, 1)}
	s.Service = servicetest.Start(t, memory.New(), servicetest.Options{Wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost || !s.hold.Load() {
				next.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(httptest.NewRecorder(), r) // committed, its answer held back
			s.committed <- struct{}{}
			<-r.Context().Done() // until the client is gone
		})
	}})
	sdk, err := client.New(client.Config{BaseURL: s.URL, APIKey: s.APIKey})
	require.NoError(t, err)
	s.sdk = sdk
	return s
}

func (s journalService) env(path, intent string, extra ...string) []string {
	return append([]string{"ONCEKEY_JOURNAL_URL=" + s.URL, "ONCEKEY_JOURNAL_APIKEY=" + s.APIKey,
		"ONCEKEY_JOURNAL_PATH=" + path, "ONCEKEY_JOURNAL_INTENT=" + intent}, extra...)
}

// orders counts the account's orders through the API (at most 100).
func (s journalService) orders(t *testing.T) int {
	t.Helper()
	limit := 100
	page, err := s.sdk.ListOrders(context.Background(), &api.ListOrdersParams{Limit: &limit})
	require.NoError(t, err)
	require.Nil(t, page.NextCursor, "counted on one page")
	return len(page.Items)
}

// killRounds is how many rounds TestJournalSurvivesKill9 runs per point
// (ONCEKEY_KILL_ROUNDS, default 100).
func killRounds(t *testing.T) int {
	n, err := strconv.Atoi(os.Getenv("ONCEKEY_KILL_ROUNDS"))
	if err != nil || n <= 0 {
		return 100
	}
	require.LessOrEqual(t, n, 100, "orders are counted on one page")
	return n
}

// TestJournalSurvivesKill9 is issue #58's Done-when: a client process
// killed with SIGKILL (a) after journaling the key and before sending,
// (held) after sending, while the service, which has created the order,
// holds its answer back, (b) after the answer came and before it was read,
// (c) after reading it and before journaling it, then started again, ends
// with exactly one order on the real service each time, and with the
// answer the first process got when it got one. Even rounds restart with
// Resume then the intent, odd rounds with the intent alone.
func TestJournalSurvivesKill9(t *testing.T) {
	t.Parallel()
	rounds := killRounds(t)
	for _, point := range []string{"a", "held", "b", "c"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			svc := startJournalService(t)
			dir := t.TempDir()
			start := time.Now()
			for round := range rounds {
				path := filepath.Join(dir, fmt.Sprintf("journal-%d", round))
				intent := fmt.Sprintf("checkout cart %s-%d", point, round)
				resume := round%2 == 0

				var hooked crashpoint.Event
				if point == "held" {
					svc.hold.Store(true)
					first := startJournalClient(t, svc.bin, svc.env(path, intent)...)
					select {
					case <-svc.committed:
					case <-time.After(20 * time.Second):
						t.Fatalf("round %d: the service ran no POST within 20s: %s", round, first.stderr)
					}
					first.kill(t)
					svc.hold.Store(false)
				} else {
					first := startJournalClient(t, svc.bin, svc.env(path, intent, "ONCEKEY_JOURNAL_HOOK="+point)...)
					hooked = first.await(t, "hook")
					first.kill(t)
				}

				second := startJournalClient(t, svc.bin, svc.env(path, intent, "ONCEKEY_JOURNAL_RESUME="+map[bool]string{true: "1", false: "0"}[resume])...)
				var resumed []crashpoint.Event
				var order *api.Order
				for _, e := range second.finish(t) {
					switch e.Event {
					case "resumed":
						resumed = append(resumed, e)
					case "order":
						order = e.Order
					}
				}
				require.NotNil(t, order, "round %d: the intent ran", round)
				require.Equal(t, round+1, svc.orders(t), "round %d at %s: exactly one order per intent", round, point)
				if resume {
					require.Len(t, resumed, 1, "round %d: the killed operation was pending", round)
					require.Equal(t, "answered", resumed[0].Kind, "round %d: %s", round, resumed[0].Err)
					require.Equal(t, http.StatusCreated, resumed[0].Status)
					var got api.Order
					require.NoError(t, json.Unmarshal(resumed[0].Body, &got))
					require.Equal(t, got, *order, "round %d: the intent returns Resume's answer", round)
					if point == "c" {
						require.JSONEq(t, string(hooked.Body), string(resumed[0].Body), "round %d: the answer equals the first one's", round)
					}
				} else {
					require.Empty(t, resumed)
				}
				if point == "c" {
					var firstOrder api.Order
					require.NoError(t, json.Unmarshal(hooked.Body, &firstOrder))
					require.Equal(t, firstOrder, *order, "round %d: the answer equals the first one's", round)
				}
			}
			t.Logf("point %s: %d rounds, %d orders, %s", point, rounds, svc.orders(t), time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestJournalTwoProcessesOneIntent: two processes started at once on one
// journal with one intent make one order, and both get it: the second
// waits for the journal's lock, then finds the intent answered.
func TestJournalTwoProcessesOneIntent(t *testing.T) {
	t.Parallel()
	svc := startJournalService(t)
	dir := t.TempDir()
	for round := range 10 {
		path := filepath.Join(dir, fmt.Sprintf("journal-%d", round))
		env := svc.env(path, fmt.Sprintf("checkout cart %d", round))
		one, two := startJournalClient(t, svc.bin, env...), startJournalClient(t, svc.bin, env...)
		var orders []*api.Order
		for _, p := range []*journalClient{one, two} {
			for _, e := range p.finish(t) {
				if e.Event == "order" {
					orders = append(orders, e.Order)
				}
			}
		}
		require.Len(t, orders, 2)
		require.Equal(t, orders[0], orders[1], "round %d: both get the one order", round)
		require.Equal(t, round+1, svc.orders(t), "round %d: one order", round)
	}
}

// TestJournalLockDiesWithItsHolder: a client killed with SIGKILL while it
// holds the journal's lock does not keep it: a process waiting for it
// takes it at once.
func TestJournalLockDiesWithItsHolder(t *testing.T) {
	t.Parallel()
	svc := startJournalService(t)
	path := filepath.Join(t.TempDir(), "journal")
	holder := startJournalClient(t, svc.bin, svc.env(path, "checkout", "ONCEKEY_JOURNAL_HOOK=a")...)
	holder.await(t, "hook") // holds the lock, hanging before its send
	next := startJournalClient(t, svc.bin, svc.env(path, "checkout")...)
	next.await(t, "locking")
	select {
	case e := <-next.events:
		t.Fatalf("the next process went on while the lock was held: %+v", e)
	default:
	}
	killed := time.Now()
	holder.kill(t)
	next.await(t, "opened")
	took := time.Since(killed)
	t.Logf("lock taken %s after the kill", took)
	require.Less(t, took, time.Second, "the kernel drops a dead process's flock")
	next.finish(t)
	require.Equal(t, 1, svc.orders(t))
}
