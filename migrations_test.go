package oncekey_test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// migrationDirs are the folders of numbered migrations that a deployment
// applies: the service's (goose) and the engine's key table (pgstore).
var migrationDirs = []string{"schema", "idempotency/pgstore/migrations"}

// migrationExceptions lists the reviewed exceptions to the additive rules,
// one "<migration file> <rule>" a line.
const migrationExceptions = "api/migrations.allowed"

// TestMigrationsAreAdditive: the previous release (api/previous-release)
// must run on the schema this one migrates to, so that an operator can roll
// back after the migrations ran (docs/operations.md, "Upgrades and
// rollbacks"). Every migration the previous release had is kept as it was,
// and every newer one only adds: no column dropped, retyped or renamed, no
// table of the previous release dropped, and no column made or added NOT
// NULL without a default, unless api/migrations.allowed declares the
// exception after review. TestPreviousReleaseRunsOnTheNewSchema
// (cmd/oncekey) runs the previous release on the result.
func TestMigrationsAreAdditive(t *testing.T) {
	t.Parallel()
	rev := previousReleaseCommit(t)
	released := map[string]string{} // path → the previous release's text
	tables := map[string]bool{}     // the tables its migrations create
	for _, dir := range migrationDirs {
		out, err := exec.Command("git", "ls-tree", "--name-only", rev, dir+"/").CombinedOutput()
		require.NoError(t, err, "git ls-tree %s %s: %s", rev, dir, out)
		for _, file := range strings.Fields(string(out)) {
			if path.Ext(file) != ".sql" {
				continue
			}
			text, err := exec.Command("git", "show", rev+":"+file).Output()
			require.NoError(t, err, "git show %s:%s", rev, file)
			released[file] = string(text)
			for _, m := range createTable.FindAllStringSubmatch(upSection(string(text)), -1) {
				tables[unquote(m[1])] = true
			}
		}
	}
	require.NotEmpty(t, released, "the previous release %s has migrations in %v", rev, migrationDirs)

	allowed := map[string]bool{}
	raw, err := os.ReadFile(migrationExceptions)
	require.NoError(t, err)
	for line := range strings.Lines(string(raw)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			allowed[strings.Join(strings.Fields(line), " ")] = true
		}
	}

	var found []string
	used := map[string]bool{}
	for _, dir := range migrationDirs {
		files, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, f := range files {
			file := dir + "/" + f.Name()
			if f.IsDir() || path.Ext(file) != ".sql" {
				continue
			}
			text, err := os.ReadFile(file)
			require.NoError(t, err)
			if before, ok := released[file]; ok {
				require.Equal(t, before, string(text), "%s was released with %s and must not change: a database that applied it never applies it again; write a new migration", file, rev)
				delete(released, file)
				continue
			}
			for _, v := range breakingChanges(string(text), tables) {
				exception := file + " " + v.rule
				if allowed[exception] {
					used[exception] = true
					continue
				}
				found = append(found, fmt.Sprintf("%s: %s\n\t%s: %s\n\tor, once reviewed, declare %q in %s", file, v.statement, v.rule, ruleAdvice[v.rule], exception, migrationExceptions))
			}
		}
	}
	require.Empty(t, slices.Sorted(maps.Keys(released)), "migrations of the previous release %s that are gone: a database that applied them keeps what they made", rev)
	require.Empty(t, found, "migrations newer than the previous release %s that it cannot run on (docs/operations.md, \"Upgrades and rollbacks\")", rev)
	for exception := range allowed {
		require.True(t, used[exception], "%s declares %q, which no migration newer than %s needs: take it out", migrationExceptions, exception, rev)
	}
}

// TestBreakingChangesAreFound holds breakingChanges to the rules: what a
// previous release runs on passes, what it cannot is found.
func TestBreakingChangesAreFound(t *testing.T) {
	t.Parallel()
	tables := map[string]bool{"orders": true, "idempotency_keys": true}
	tests := []struct {
		name, sql string
		want      []string
	}{
		{"a nullable column", "ALTER TABLE orders ADD COLUMN note text;", nil},
		{"a column with a default", "ALTER TABLE orders ADD COLUMN IF NOT EXISTS region text NOT NULL DEFAULT 'eu';", nil},
		{"a column without the word COLUMN", "alter table orders add region text not null default 'eu'", nil},
		{"a new table, an index, a constraint", "CREATE TABLE notes (id bigint NOT NULL); CREATE INDEX notes_idx ON notes (id); ALTER TABLE orders ADD CONSTRAINT amount_positive CHECK (amount > 0);", nil},
		{"a new table dropped", "CREATE TABLE scratch (id int); DROP TABLE scratch;", nil},
		{"a default, then NOT NULL", "ALTER TABLE orders ALTER COLUMN note SET DEFAULT '';\nALTER TABLE orders ALTER COLUMN note SET NOT NULL;", nil},
		{"words in comments and strings", "-- we never DROP COLUMN or RENAME here\nDO $$ BEGIN RAISE NOTICE 'rename the column, drop column x'; END $$;", nil},
		{"the Down section", "-- +goose Up\nALTER TABLE orders ADD COLUMN note text;\n-- +goose Down\nALTER TABLE orders DROP COLUMN note;", nil},
		{"a dropped column", "ALTER TABLE orders DROP COLUMN items;", []string{"drop-column"}},
		{"a dropped column among additions", "ALTER TABLE orders ADD COLUMN a text, DROP COLUMN IF EXISTS items;", []string{"drop-column"}},
		{"a table of the previous release dropped", "DROP TABLE IF EXISTS public.orders CASCADE;", []string{"drop-table"}},
		{"a retyped column", "ALTER TABLE orders ALTER COLUMN amount TYPE numeric;", []string{"retype"}},
		{"a retyped column, long form", "ALTER TABLE orders ALTER amount SET DATA TYPE numeric USING amount::numeric;", []string{"retype"}},
		{"a renamed column", "ALTER TABLE orders RENAME COLUMN items TO line_items;", []string{"rename"}},
		{"a renamed table", "ALTER TABLE idempotency_keys RENAME TO keys;", []string{"rename"}},
		{"NOT NULL without a default", "ALTER TABLE orders ALTER COLUMN note SET NOT NULL;", []string{"set-not-null"}},
		{"a NOT NULL column without a default", "ALTER TABLE orders ADD COLUMN region text NOT NULL;", []string{"add-not-null"}},
		{"one bad action of two", "ALTER TABLE orders ADD COLUMN a text DEFAULT 'x' NOT NULL, ADD COLUMN b numeric(10, 2) NOT NULL;", []string{"add-not-null"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var rules []string
			for _, v := range breakingChanges(tt.sql, tables) {
				rules = append(rules, v.rule)
			}
			require.Equal(t, tt.want, rules, "%s", tt.sql)
		})
	}
}

// ruleAdvice says, for each rule, why the previous release cannot run on
// such a change, and what to do instead.
var ruleAdvice = map[string]string{
	"drop-column":  "the previous release still reads or writes the column; keep it until the release after the one that stops using it",
	"drop-table":   "the previous release still uses the table; keep it until the release after the one that stops using it",
	"retype":       "the previous release reads and writes the old type; add a column of the new type beside it, write both, and drop the old one later",
	"rename":       "the previous release names the old one; add the new name beside it (a column, a view) and drop the old one later",
	"set-not-null": "the previous release may insert rows without the column; give it a default first (ALTER COLUMN ... SET DEFAULT)",
	"add-not-null": "the previous release inserts rows without the column; give it a DEFAULT",
}

// breakingChange is a statement of a migration that the previous release
// cannot run on, and the rule it breaks.
type breakingChange struct {
	statement, rule string
}

var (
	createTable  = regexp.MustCompile(`(?i)\bCREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([\w."]+)`)
	dropTable    = regexp.MustCompile(`(?i)^DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(.+?)(?:\s+(?:CASCADE|RESTRICT))?$`)
	alterTable   = regexp.MustCompile(`(?i)^ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?[\w."]+\s+(.*)$`)
	rename       = regexp.MustCompile(`(?i)\bRENAME\b`)
	dropColumn   = regexp.MustCompile(`(?i)^DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?([\w"]+)`)
	notConstrain = regexp.MustCompile(`(?i)^DROP\s+(?:CONSTRAINT|EXPRESSION|DEFAULT|NOT\s+NULL|IDENTITY)\b`)
	retype       = regexp.MustCompile(`(?i)^ALTER\s+(?:COLUMN\s+)?[\w"]+\s+(?:SET\s+DATA\s+)?TYPE\b`)
	setNotNull   = regexp.MustCompile(`(?i)^ALTER\s+(?:COLUMN\s+)?([\w"]+)\s+SET\s+NOT\s+NULL\b`)
	setDefault   = regexp.MustCompile(`(?i)^ALTER\s+(?:COLUMN\s+)?([\w"]+)\s+SET\s+DEFAULT\b`)
	addColumn    = regexp.MustCompile(`(?i)^ADD\s+(?:COLUMN\s+)?(?:IF\s+NOT\s+EXISTS\s+)?([\w"]+)\s+(.*)$`)
	notColumn    = regexp.MustCompile(`(?i)^ADD\s+(?:CONSTRAINT|PRIMARY|UNIQUE|CHECK|FOREIGN|EXCLUDE)\b`)
	notNull      = regexp.MustCompile(`(?i)\bNOT\s+NULL\b`)
	hasDefault   = regexp.MustCompile(`(?i)\b(?:DEFAULT|GENERATED)\b`)
)

// breakingChanges reads the Up part of a migration and returns its
// statements that break the additive rules. tables are the previous
// release's tables.
func breakingChanges(sql string, tables map[string]bool) []breakingChange {
	var out []breakingChange
	statements := splitStatements(upSection(sql))
	defaulted := map[string]bool{} // columns given a default by this migration
	for _, s := range statements {
		if m := alterTable.FindStringSubmatch(s); m != nil {
			for _, action := range splitTopLevel(m[1], ',') {
				if m := setDefault.FindStringSubmatch(action); m != nil {
					defaulted[unquote(m[1])] = true
				}
				if m := addColumn.FindStringSubmatch(action); m != nil && !notColumn.MatchString(action) && hasDefault.MatchString(m[2]) {
					defaulted[unquote(m[1])] = true
				}
			}
		}
	}
	for _, s := range statements {
		if m := dropTable.FindStringSubmatch(s); m != nil {
			for _, name := range strings.Split(m[1], ",") {
				if tables[unquote(strings.TrimSpace(name))] {
					out = append(out, breakingChange{s, "drop-table"})
					break
				}
			}
			continue
		}
		if rename.MatchString(s) {
			out = append(out, breakingChange{s, "rename"})
			continue
		}
		m := alterTable.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		for _, action := range splitTopLevel(m[1], ',') {
			switch {
			case dropColumn.MatchString(action) && !notConstrain.MatchString(action):
				out = append(out, breakingChange{s, "drop-column"})
			case retype.MatchString(action):
				out = append(out, breakingChange{s, "retype"})
			case setNotNull.MatchString(action):
				if !defaulted[unquote(setNotNull.FindStringSubmatch(action)[1])] {
					out = append(out, breakingChange{s, "set-not-null"})
				}
			case addColumn.MatchString(action) && !notColumn.MatchString(action):
				def := addColumn.FindStringSubmatch(action)[2]
				if notNull.MatchString(def) && !hasDefault.MatchString(def) {
					out = append(out, breakingChange{s, "add-not-null"})
				}
			}
		}
	}
	return out
}

// upSection is a goose migration's Up part (all of a pgstore migration,
// which has no markers): the Down part is what a rollback by goose would
// run, never what an upgrade runs.
func upSection(sql string) string {
	if _, up, ok := strings.Cut(sql, "-- +goose Up"); ok {
		sql = up
	}
	up, _, _ := strings.Cut(sql, "-- +goose Down")
	return up
}

// splitStatements splits SQL at its semicolons, leaving out comments and
// the text of string literals (a RAISE's message that says "rename" is no
// rename) but keeping dollar-quoted bodies (a DO block's statements), each
// statement with its white space collapsed.
func splitStatements(sql string) []string {
	var out []string
	var b strings.Builder
	flush := func() {
		if s := strings.Join(strings.Fields(b.String()), " "); s != "" {
			out = append(out, s)
		}
		b.Reset()
	}
	for i := 0; i < len(sql); i++ {
		switch c := sql[i]; {
		case strings.HasPrefix(sql[i:], "--"):
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				end = len(sql) - i
			}
			i += end
			b.WriteByte('\n')
		case strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i:], "*/")
			if end < 0 {
				end = len(sql) - i
			}
			i += end + 1
			b.WriteByte(' ')
		case c == '\'':
			end := strings.IndexByte(sql[i+1:], '\'')
			for end >= 0 && i+end+2 < len(sql) && sql[i+end+2] == '\'' { // '' inside a literal
				next := strings.IndexByte(sql[i+end+3:], '\'')
				if next < 0 {
					end = -1
					break
				}
				end += next + 2
			}
			if end < 0 {
				end = len(sql) - i - 1
			}
			i += end + 1
			b.WriteString("''")
		case c == ';':
			flush()
		default:
			b.WriteByte(c)
		}
	}
	flush()
	return out
}

// splitTopLevel splits s at sep where it is outside parentheses.
func splitTopLevel(s string, sep byte) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case sep:
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// unquote is a table or column name as PostgreSQL folds it, without a
// schema (public).
func unquote(name string) string {
	name = strings.TrimPrefix(strings.TrimPrefix(name, "public."), `"public".`)
	if strings.HasPrefix(name, `"`) {
		return strings.Trim(name, `"`)
	}
	return strings.ToLower(name)
}

// previousReleaseCommit is the commit api/previous-release names, which
// must be in this clone's history. A clone without it (a shallow one)
// skips the test, except in CI, where it fails.
func previousReleaseCommit(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("api/previous-release")
	require.NoError(t, err)
	var rev string
	for line := range strings.Lines(string(raw)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			rev = line
		}
	}
	require.Regexp(t, `^[0-9a-f]{40}$`, rev, "api/previous-release names a commit by its full hash")
	if out, err := exec.Command("git", "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the previous release %s is not in this clone's history (a shallow clone? CI clones fully): %v\n%s", rev, err, out)
		}
		t.Skipf("the previous release %s is not in this clone's history: %v", rev, err)
	}
	return rev
}
