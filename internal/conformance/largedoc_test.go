package conformance

import (
	"bytes"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/internal/conformance/largespec"
)

// TestLargeDocument loads a document the size and shape of a large public
// payments API's (OpenAPI 3.1, thousands of operations, the key through
// $refs to $refs, allOf and oneOf bodies with discriminators, $ref chains,
// two external $refs) and plans a run on it as --plan does, sending
// nothing: every covered operation is found, and each external $ref is a
// notice with its place in the file. It takes about a second (four under -race,
// on a busy two-core machine); the bound is ten times that, for a busy
// machine, and TestSessionScales is the one that catches a step quadratic
// in the operations.
func TestLargeDocument(t *testing.T) {
	t.Parallel()
	spec, err := largespec.Write(t.TempDir(), largespec.Options{Seed: 35})
	require.NoError(t, err)
	require.Greater(t, spec.Operations, 3000, "the document has thousands of operations")
	require.Len(t, spec.External, 2)

	peak := heapPeak(t)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	doc, notices, err := Load(spec.Path)
	require.NoError(t, err)
	loaded := time.Since(start)
	plans, err := Plan(Config{Spec: doc})
	require.NoError(t, err)
	var text bytes.Buffer
	require.NoError(t, WritePlan(&text, "text", plans))
	took := time.Since(start)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	t.Logf("%d operations (%d covered) in %d KiB: loaded in %v, planned (what --plan does) in %v more (%v in all); %d MiB allocated, heap in use at most about %d MiB (the process's: the tests alongside count too; race: %v)",
		spec.Operations, len(spec.Covered), spec.Size>>10, loaded.Round(time.Millisecond), (took - loaded).Round(time.Millisecond),
		took.Round(time.Millisecond), (after.TotalAlloc-before.TotalAlloc)>>20, peak()>>20, raceEnabled)

	var covered []string
	for _, p := range plans {
		covered = append(covered, p.Operation)
		require.NotEmpty(t, p.Request, p.Operation)
	}
	require.Equal(t, spec.Covered, covered, "the covered operations, found through $refs to the key's component parameter")
	require.True(t, bytes.HasSuffix(text.Bytes(), fmt.Appendf(nil, "\n%d operations under the protocol\n", len(spec.Covered))), "the plan's last line")

	require.Len(t, notices, len(spec.External), "a notice for each external $ref: %v", notices)
	for i, e := range spec.External {
		require.Equal(t, e.Pointer, notices[i].Pointer, "notice %d: %s", i, notices[i])
		require.Equal(t, e.Line, notices[i].Line, "notice %d: %s", i, notices[i])
		require.Contains(t, notices[i].What, e.Ref)
	}

	bound := 45 * time.Second
	if !raceEnabled {
		bound = 15 * time.Second
	}
	require.Less(t, took, bound, "loading a large document and planning a run on it")
}

// heapPeak samples the heap in use until the test ends and returns a
// function reading the highest it saw.
func heapPeak(t *testing.T) func() uint64 {
	var peak atomic.Uint64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			for old := peak.Load(); m.HeapInuse > old && !peak.CompareAndSwap(old, m.HeapInuse); old = peak.Load() {
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
	return func() uint64 { return peak.Load() }
}
