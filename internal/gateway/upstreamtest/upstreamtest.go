// Package upstreamtest runs upstream.py, a small transfers API in Python
// that declares the Idempotency-Key protocol in its openapi.yaml but does
// not keep it: it runs every request, and counts each run by its key in
// SQLite. It is the upstream that Oncekey's tests put things in front of:
// an API no one wrote in Go, whose duplicate runs can be counted, and
// which fails on request (X-Fault) in the ways a gateway must survive.
//
// It needs python3 (with its standard library's sqlite3) on the PATH.
package upstreamtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Header is the request header that asks upstream.py for a fault.
const Header = "X-Fault"

// The faults upstream.py makes on request, as values of Header.
const (
	// Fail answers 500 without running the transfer.
	Fail = "fail"
	// Reset runs the transfer, then resets the connection without
	// answering.
	Reset = "reset"
	// Hang runs the transfer, then answers nothing until the client goes
	// away.
	Hang = "hang"
)

// Slow is the fault that waits d before running the transfer and
// answering.
func Slow(d time.Duration) string { return fmt.Sprintf("slow=%d", d.Milliseconds()) }

// Upstream is a running upstream.py.
type Upstream struct {
	// URL is its base URL ("http://127.0.0.1:port").
	URL string
	// Spec is the path of its OpenAPI document.
	Spec string
	// Overrides is the path of `oncekey conformance`'s overrides for it.
	Overrides string
}

// Start runs upstream.py on a free loopback port, with a SQLite database of
// its own, until t ends.
func Start(t testing.TB) *Upstream {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("upstreamtest: python3 is not on the PATH (apt-get install python3): %v", err)
	}
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	spec := filepath.Join(dir, "openapi.yaml")
	cmd := exec.Command(python, filepath.Join(dir, "upstream.py"), "--spec", spec, "--db", filepath.Join(t.TempDir(), "executions.db"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("upstreamtest: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("upstreamtest: start upstream.py: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// Its first line names the port it bound.
	addr := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		addr <- strings.TrimPrefix(strings.TrimSpace(line), "listening on ")
	}()
	select {
	case a := <-addr:
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Fatalf("upstreamtest: upstream.py said %q, not where it listens", a)
		}
		return &Upstream{URL: "http://" + a, Spec: spec, Overrides: filepath.Join(dir, "conformance.yaml")}
	case <-time.After(30 * time.Second):
		t.Fatal("upstreamtest: upstream.py did not start listening within 30s")
		return nil
	}
}

// Executions returns how many transfers ran, in all and by the
// Idempotency-Key they came with ("" for none).
func (u *Upstream) Executions(t testing.TB) (total int, byKey map[string]int) {
	t.Helper()
	resp, err := http.Get(u.URL + "/_executions")
	if err != nil {
		t.Fatalf("upstreamtest: count executions: %v", err)
	}
	defer resp.Body.Close()
	var counts struct {
		Total int            `json:"total"`
		ByKey map[string]int `json:"by_key"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&counts); err != nil {
		t.Fatalf("upstreamtest: count executions: %v", err)
	}
	return counts.Total, counts.ByKey
}
