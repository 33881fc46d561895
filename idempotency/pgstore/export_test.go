package pgstore

import "time"

// WatchCommits makes s call sent with the number of members of every
// pipeline its group committer sends, just before sending it. sent may
// block, to hold pipelines back while others queue behind them.
func WatchCommits(s *Store, sent func(members int)) { s.commits.sent = sent }

// QueuedCommits is how many deferred commits of s wait for a pipeline.
func QueuedCommits(s *Store) int {
	s.commits.mu.Lock()
	defer s.commits.mu.Unlock()
	return len(s.commits.queue)
}

// MaxMergedCommits is how many pipelines may be in flight at once.
const MaxMergedCommits = maxMergedCommits

// MaxLoneMembers is the longest pipeline sent as its members' lone
// statements.
const MaxLoneMembers = maxLoneMembers

// Guarded is sql, a statement of n arguments, as a pipeline sends a write
// claimed at commit: its guard's calls replaced, after the CTE that tests
// its claim, whose arguments are the claim's scope, key and time after the
// statement's own.
func Guarded(s *Store, sql string, n int) string { return s.guarded(s.testingClaim(sql), n) }

// SetClock makes s read this process's time from now instead of time.Now:
// a process whose clock is off.
func SetClock(s *Store, now func() time.Time) { s.now = now }

// WatchSettles makes s call sent with the number of members of every
// pipeline of settles and releases it sends, just before sending it. sent
// may block, to hold pipelines back while others queue behind them.
func WatchSettles(s *Store, sent func(members int)) { s.settles.sent = sent }

// QueuedSettles is how many settles and releases of s wait for a
// pipeline.
func QueuedSettles(s *Store) int {
	s.settles.mu.Lock()
	defer s.settles.mu.Unlock()
	return len(s.settles.queue)
}
