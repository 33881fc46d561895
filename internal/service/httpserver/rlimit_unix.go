//go:build unix

package httpserver

import "syscall"

// openFileLimit is the process's soft limit on open files, or 0 if unknown.
// (The Go runtime raises the soft limit to the hard one at start-up.)
func openFileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	// RLIM_INFINITY, or any limit past a 32-bit int, is as good as none:
	// defaultMaxConns caps it anyway.
	return int(min(lim.Cur, 1<<30))
}
