package client

import (
	"os"
	"sync/atomic"
	"testing"
)

// CountFsyncs makes the file journal count its fsyncs, until t ends. It
// swaps a package variable: call it from a test that is not parallel.
func CountFsyncs(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	was := fsync
	fsync = func(f *os.File) error {
		n.Add(1)
		return was(f)
	}
	t.Cleanup(func() { fsync = was })
	return &n
}
