// Command journalproc is the client program of the SDK's crash tests
// (client/journal_crash_test.go): a process that opens a file journal,
// resumes its pending operations and creates an order under an intent,
// and can be made to hang at a crash point for the test to kill it there.
// It prints one JSON event a line.
//
// Environment: ONCEKEY_JOURNAL_URL, ONCEKEY_JOURNAL_APIKEY (the service),
// ONCEKEY_JOURNAL_PATH (the journal), ONCEKEY_JOURNAL_INTENT (the intent),
// ONCEKEY_JOURNAL_RESUME=0 to skip Resume, and ONCEKEY_JOURNAL_HOOK=a, b
// or c to hang at a crash point of its first journaled request: a, the key
// is journaled and the request not sent; b, the answer's headers came and
// its body is unread; c, the answer is read and not journaled.
package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"time"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/client/internal/crashpoint"
	"github.com/oncekey/oncekey/gen/api"
)

// order is what every run creates: the same request, so a resent one is
// the same operation.
var order = api.NewOrder{Items: []api.OrderItem{{Sku: "SKU-1", Qty: 2}}, Amount: 1200, Currency: "RUB"}

func main() { os.Exit(run()) }

func run() int {
	out := json.NewEncoder(os.Stdout)
	emit := func(e crashpoint.Event) { _ = out.Encode(e) }
	fail := func(err error) int {
		emit(crashpoint.Event{Event: "error", Err: err.Error()})
		return 1
	}
	hook := os.Getenv("ONCEKEY_JOURNAL_HOOK")
	hang := func(point string) func([]byte) {
		if hook != point {
			return nil
		}
		return func(body []byte) {
			emit(crashpoint.Event{Event: "hook", Point: point, Body: body})
			time.Sleep(time.Hour) // until killed (a sleep, so the runtime sees no deadlock)
		}
	}
	crashpoint.BeforeSend, crashpoint.AfterSend, crashpoint.BeforeRecord = hang("a"), hang("b"), hang("c")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	emit(crashpoint.Event{Event: "locking"})
	j, err := client.OpenFileJournal(ctx, os.Getenv("ONCEKEY_JOURNAL_PATH"), client.FileJournalOptions{})
	if err != nil {
		return fail(err)
	}
	defer j.Close()
	emit(crashpoint.Event{Event: "opened"})
	c, err := client.New(client.Config{
		BaseURL: os.Getenv("ONCEKEY_JOURNAL_URL"), APIKey: os.Getenv("ONCEKEY_JOURNAL_APIKEY"), Journal: j,
		HTTPClient:  &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second},
		MaxAttempts: 20, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond,
	})
	if err != nil {
		return fail(err)
	}
	if os.Getenv("ONCEKEY_JOURNAL_RESUME") != "0" {
		outcomes, err := c.Resume(ctx)
		if err != nil {
			return fail(err)
		}
		for _, o := range outcomes {
			e := crashpoint.Event{Event: "resumed", Kind: o.Kind.String(), Status: o.Status, Body: o.Body}
			if o.Err != nil {
				e.Err = o.Err.Error()
			}
			emit(e)
		}
	}
	created, err := c.Intent(os.Getenv("ONCEKEY_JOURNAL_INTENT")).CreateOrder(ctx, order)
	if err != nil {
		return fail(err)
	}
	emit(crashpoint.Event{Event: "order", Order: created})
	return 0
}
