package oncekey_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sleepBudget is how many sleeps the tests of the whole repository (every
// module) and storetest's suites may hold. A test that sleeps to wait for
// something is slow on an idle machine and flaky on a busy one; it waits
// for a condition instead (testing/synctest, a hook, a poll on what it
// waits for). What stays is pacing: a slow client or upstream whose
// slowness is what the test is about.
const sleepBudget = 15

// sleepCall is what a sleep looks like in source. It is built, not
// written, so that this file does not count itself.
var sleepCall = "time." + "Sleep("

// sleepsIn returns the lines (1-based) of src that call sleepCall, and of
// them those that say neither on their own line nor in the comment just
// above (the run of comment lines ending on the line before) that they are
// pacing. Comment lines do not count: a doc may name a sleep.
func sleepsIn(src string) (sleeps, unexplained []int) {
	lines := strings.Split(src, "\n")
	isComment := func(line string) bool { return strings.HasPrefix(strings.TrimSpace(line), "//") }
	for i, line := range lines {
		if isComment(line) || !strings.Contains(line, sleepCall) {
			continue
		}
		sleeps = append(sleeps, i+1)
		explained := strings.Contains(line, "pacing")
		for j := i - 1; j >= 0 && isComment(lines[j]) && !explained; j-- {
			explained = strings.Contains(lines[j], "pacing")
		}
		if !explained {
			unexplained = append(unexplained, i+1)
		}
	}
	return sleeps, unexplained
}

func TestSleepsIn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		src                 string
		sleeps, unexplained []int
	}{
		{"none", "package x\nfunc f() {}\n", nil, nil},
		{"a wait", "package x\nfunc f() {\n\t" + sleepCall + "d)\n}\n", []int{3}, []int{3}},
		{"pacing on the line", "package x\nfunc f() {\n\t" + sleepCall + "d) // pacing: a slow client\n}\n", []int{3}, nil},
		{"pacing above", "package x\nfunc f() {\n\t// pacing: a slow upstream\n\t" + sleepCall + "d)\n}\n", []int{4}, nil},
		{"pacing atop the comment above", "package x\nfunc f() {\n\t// pacing: a slow upstream,\n\t// long enough for duplicates\n\t" + sleepCall + "d)\n}\n", []int{5}, nil},
		{"pacing above a blank line", "package x\n// pacing\n\n\t" + sleepCall + "d)\n", []int{4}, []int{4}},
		{"pacing above code", "package x\n\tx := 1 // pacing\n\t" + sleepCall + "d)\n", []int{3}, []int{3}},
		{"in a comment", "package x\n// never " + sleepCall + "d) to wait\n", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sleeps, unexplained := sleepsIn(tc.src)
			require.Equal(t, tc.sleeps, sleeps, "sleeps")
			require.Equal(t, tc.unexplained, unexplained, "sleeps without a pacing comment")
		})
	}
}

// TestSleepBudget holds #56's line: the sleeps of every module's tests and
// of storetest's suites (which run in other modules' tests) are at most
// sleepBudget, and each says on its line or in the comment just above why
// it is pacing and not waiting.
func TestSleepBudget(t *testing.T) {
	t.Parallel()
	var total []string
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", "gen":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") && !(filepath.Dir(path) == filepath.Join("idempotency", "storetest") && strings.HasSuffix(path, ".go")) {
			return nil
		}
		files++
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sleeps, unexplained := sleepsIn(string(src))
		for _, line := range sleeps {
			total = append(total, fmt.Sprintf("%s:%d", filepath.ToSlash(path), line))
		}
		for _, line := range unexplained {
			t.Errorf("%s:%d sleeps with no comment on its line or just above saying why it is pacing and not waiting; wait for a condition instead (testing/synctest, a hook, a poll)", filepath.ToSlash(path), line)
		}
		return nil
	})
	require.NoError(t, err, "walk the repository")
	require.Greater(t, files, 100, "test files read: is the walk in the repository's root?")
	require.LessOrEqualf(t, len(total), sleepBudget, "%d sleeps in tests, the budget is %d: wait for a condition instead (testing/synctest, a hook, a poll)\n%s", len(total), sleepBudget, strings.Join(total, "\n"))
	t.Logf("%d sleeps of %d:\n%s", len(total), sleepBudget, strings.Join(total, "\n"))
}
