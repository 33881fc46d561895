//go:build unix

package idempotency_test

import "syscall"

// processCPU is the CPU time the process has used so far, user and
// system, in nanoseconds, for BenchmarkEngine's cpu-ns/op.
func processCPU() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
