//go:build !race

package conformance

// raceEnabled: see race_test.go.
const raceEnabled = false
