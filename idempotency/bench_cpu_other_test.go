//go:build !unix

package idempotency_test

// processCPU reports that the process's CPU time is not read here:
// BenchmarkEngine then reports no cpu-ns/op.
func processCPU() (int64, bool) { return 0, false }
