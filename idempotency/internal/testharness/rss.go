package testharness

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RSSOf is the resident set of process pid, in bytes, from /proc.
func RSSOf(pid int) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// PeakRSS samples the resident set of process pid every 5 ms while fn
// runs and returns its growth over what it was before fn: the most the
// process held for what fn made it do, which a test bounds to show that
// a large answer is never held whole.
func PeakRSS(t *testing.T, pid int, fn func()) int64 {
	t.Helper()
	before, err := RSSOf(pid)
	if err != nil {
		t.Fatalf("the resident set of process %d: %v", pid, err)
	}
	peak := before
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss, err := RSSOf(pid); err == nil {
				peak = max(peak, rss)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	fn()
	close(done)
	<-sampled
	return peak - before
}
