//go:build race

package conformance

// raceEnabled: the race detector slows the tests that time work (5 to 10
// times), which set their bounds by it.
const raceEnabled = true
