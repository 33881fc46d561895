package integration_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// engine is the import path every engine module lives under.
const engine = "github.com/oncekey/oncekey/idempotency"

// budgets are the three ways a team adopts the engine, each with every
// module an outside module that imports those packages may name in
// `go list -m all`: the packages' own needs and their tests' (a module's
// requirements cover its tests), nothing of Oncekey's service.
var budgets = []struct {
	name    string   // as docs/library.md's table names it
	imports []string // the packages the outside module imports
	modules []string // what `go list -m all` may name, beside the outside module
	// floor is the go directive the outside module has once tidied: the
	// highest of the imported modules' floors, as docs/library.md states
	// them (raised only where a dependency's fix for a known vulnerability
	// needs a newer Go).
	floor string
	// via is a module every user of these packages requires anyway (gRPC):
	// the modules it requires are in the budget too, whatever they are,
	// since no adapter of it could leave them out.
	via string
}{
	{
		name:    "`idempotency` and `…/memstore`",
		floor:   "1.24.0",
		imports: []string{engine, engine + "/memstore"},
		modules: []string{
			engine,
			"github.com/gowebpki/jcs",            // canonical JSON
			"github.com/hashicorp/golang-lru/v2", // recordcache
			"github.com/stretchr/testify",        // storetest's and the tests' assertions
			"go.yaml.in/yaml/v3",                 // testify's
		},
	},
	{
		name:    "`…/pgstore`",
		floor:   "1.25.0",
		imports: []string{engine + "/pgstore"},
		modules: []string{
			engine, engine + "/pgstore",
			"github.com/gowebpki/jcs", "github.com/hashicorp/golang-lru/v2",
			"github.com/stretchr/testify", "go.yaml.in/yaml/v3",
			"github.com/jackc/pgx/v5", "github.com/jackc/pgpassfile", "github.com/jackc/pgservicefile", "github.com/jackc/puddle/v2",
			"golang.org/x/sync", "golang.org/x/text", // pgx's
			// what pgx's and testify's go.mod files name for their own tests:
			"github.com/davecgh/go-spew", "github.com/pmezard/go-difflib", "github.com/stretchr/objx",
			"github.com/kr/pretty", "gopkg.in/check.v1", "gopkg.in/yaml.v3", "golang.org/x/mod", "golang.org/x/tools",
		},
	},
	{
		name:    "`…/redisstore`",
		floor:   "1.25.0",
		imports: []string{engine + "/redisstore"},
		modules: []string{
			engine, engine + "/redisstore",
			"github.com/gowebpki/jcs", "github.com/hashicorp/golang-lru/v2",
			"github.com/stretchr/testify", "go.yaml.in/yaml/v3",
			"github.com/redis/go-redis/v9", "github.com/sony/gobreaker/v2",
			"github.com/cespare/xxhash/v2", "go.uber.org/atomic", "github.com/zeebo/xxh3", "github.com/klauspost/cpuid/v2", "golang.org/x/sys", // go-redis's
			// what go-redis's and testify's go.mod files name for their own tests:
			"github.com/bsm/ginkgo/v2", "github.com/bsm/gomega", "github.com/davecgh/go-spew", "github.com/pmezard/go-difflib", "gopkg.in/yaml.v3",
		},
	},
	{
		name:    "`…/grpcidem`",
		floor:   "1.26.0",
		imports: []string{engine + "/grpcidem"},
		modules: []string{
			engine, engine + "/grpcidem",
			"github.com/gowebpki/jcs", "github.com/hashicorp/golang-lru/v2",
			"github.com/stretchr/testify", "go.yaml.in/yaml/v3",
			"google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto/googleapis/rpc",
		},
		via: "google.golang.org/grpc",
	},
}

// never are modules of Oncekey's service that an adopter of the engine
// must not inherit, whatever else changes.
var never = []string{
	"github.com/riverqueue/", "go.opentelemetry.io/", "gonum.org/", "modernc.org/sqlite", "github.com/pressly/goose",
	"github.com/alecthomas/kong", "github.com/prometheus/", "github.com/oapi-codegen/", "github.com/go-chi/chi",
	"github.com/oncekey/oncekey ", // the service's own module
}

// TestDependencyBudget builds, for each budget, a throwaway module outside
// this repository that imports only those packages, tidies it with the go
// command, and holds `go list -m all` to the budget. docs/library.md states
// the counts; they must be the ones measured here.
func TestDependencyBudget(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	doc, err := os.ReadFile(filepath.Join(root, "..", "docs", "library.md"))
	require.NoError(t, err)

	for _, b := range budgets {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var main strings.Builder
			main.WriteString("package main\n\nimport (\n")
			for _, p := range b.imports {
				fmt.Fprintf(&main, "\t_ %q\n", p)
			}
			main.WriteString(")\n\nfunc main() {}\n")
			var modules []string
			for _, p := range b.imports {
				modules = append(modules, moduleOf(p))
			}
			m := outsideModule(t, root, map[string]string{"main.go": main.String()}, modules...)
			m.run("mod", "tidy")
			m.run("build", "./...")

			goLine := strings.TrimSpace(m.run("mod", "edit", "-print"))
			require.Contains(t, strings.Split(goLine, "\n"), "go "+b.floor, "an importer of %s needs Go %s (the floor docs/library.md states), no more, no less", b.name, b.floor)

			listed := strings.Split(strings.TrimSpace(m.run("list", "-m", "-f", "{{.Path}}", "all")), "\n")
			require.Equal(t, "example.com/adopter", listed[0], "the main module comes first")
			viaOwn := m.requirementsOf(b.via)
			if b.via != "" {
				require.Subset(t, listed, []string{b.via, "google.golang.org/protobuf"}, "an importer of %s gets gRPC and protobuf", b.name)
			}
			for _, mod := range listed[1:] {
				if viaOwn[mod] {
					continue
				}
				require.True(t, slices.Contains(b.modules, mod), "an importer of %s inherits %s, which is not in its budget: %v", b.name, mod, listed)
				if b.via == "" {
					require.False(t, strings.HasPrefix(mod, "google.golang.org/"), "an importer of %s inherits %s: gRPC and protobuf are grpcidem's alone", b.name, mod)
				}
				for _, n := range never {
					require.False(t, strings.HasPrefix(mod+" ", n), "an importer of %s inherits %s", b.name, mod)
				}
			}
			row := fmt.Sprintf("| %s | %d |", b.name, len(listed))
			require.Contains(t, string(doc), row, "docs/library.md's table of module counts must say what `go list -m all` names: %v", listed)
		})
	}
}

// moduleOf is the engine module that holds package p.
func moduleOf(p string) string {
	for _, m := range []string{"/pgstore", "/redisstore", "/oapi", "/grpcidem"} {
		if p == engine+m || strings.HasPrefix(p, engine+m+"/") {
			return engine + m
		}
	}
	return engine
}

// outside is a throwaway module outside this repository, example.com/adopter,
// that requires engine modules from the checkout (replace directives).
type outside struct {
	t   *testing.T
	dir string
}

// outsideModule writes files into a new outside module that requires
// modules (each at v0.1.0, replaced by its directory under root).
func outsideModule(t *testing.T, root string, files map[string]string, modules ...string) outside {
	t.Helper()
	m := outside{t: t, dir: t.TempDir()}
	var mod strings.Builder
	mod.WriteString("module example.com/adopter\n\ngo 1.24.0\n\nreplace (\n")
	for _, sub := range []string{"", "/pgstore", "/redisstore", "/oapi", "/grpcidem"} {
		fmt.Fprintf(&mod, "\t%s%s => %s\n", engine, sub, filepath.Join(root, sub))
	}
	mod.WriteString(")\n")
	files["go.mod"] = mod.String()
	for name, text := range files {
		require.NoError(t, os.WriteFile(filepath.Join(m.dir, name), []byte(text), 0o644))
	}
	for _, mod := range modules {
		m.run("mod", "edit", "-require="+mod+"@v0.1.0")
	}
	return m
}

// requirementsOf is the set of modules that module requires, directly or
// through others, in the outside module's graph; empty for "".
func (m outside) requirementsOf(module string) map[string]bool {
	m.t.Helper()
	set := map[string]bool{}
	if module == "" {
		return set
	}
	edges := map[string][]string{} // path → the paths it requires
	for _, line := range strings.Split(strings.TrimSpace(m.run("mod", "graph")), "\n") {
		from, to, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		from, _, _ = strings.Cut(from, "@")
		to, _, _ = strings.Cut(to, "@")
		edges[from] = append(edges[from], to)
	}
	queue := []string{module}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, to := range edges[next] {
			if !set[to] {
				set[to] = true
				queue = append(queue, to)
			}
		}
	}
	return set
}

// run runs the go command in the module, and fails the test if it fails.
func (m outside) run(args ...string) string {
	m.t.Helper()
	goCmd, err := exec.LookPath("go")
	require.NoError(m.t, err, "the go command")
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = m.dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	require.NoError(m.t, err, "go %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}
