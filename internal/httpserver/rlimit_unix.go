//go:build unix

package httpserver

import "syscall"

// openFileLimit is the process's soft limit on open files, or 0 if unknown.
// (The Go runtime raises the soft limit to the hard one at start-up.)
func openFileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<30 {
		return 0
	}
	return int(lim.Cur)
}
