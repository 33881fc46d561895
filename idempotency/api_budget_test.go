package idempotency

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// apiBudget is the most exported identifiers package idempotency may
// declare: every name is a promise to adopters once the module is tagged,
// so a new one must earn its place or another must go. Issue #56 sets it
// at 75 (126 before it); the budget ratchets down as names go, never up.
const apiBudget = 75

// reachedThrough are exported types that callers get from a function of
// the package and never need to spell: used when the function is.
var reachedThrough = map[string]string{"Decision": ".Begin("}

// exported is one exported identifier of the package's non-test files.
type exported struct {
	file, kind, name string
	// method is the name of a method, whose callers write .method(, not
	// idempotency.name.
	method string
	doc    bool
}

// exportedAPI lists the exported identifiers declared in the package's
// non-test files in dir: types, functions, methods on exported types,
// constants and variables.
func exportedAPI(t *testing.T, dir string) []exported {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	fset := token.NewFileSet()
	var out []exported
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		require.NoError(t, err, path)
		file := filepath.Base(path)
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					out = append(out, exported{file: file, kind: "func", name: d.Name.Name, doc: d.Doc != nil})
					continue
				}
				recv := receiverType(d.Recv.List[0].Type)
				if recv.IsExported() {
					out = append(out, exported{file: file, kind: "method", name: recv.Name + "." + d.Name.Name, method: d.Name.Name, doc: d.Doc != nil})
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							out = append(out, exported{file: file, kind: "type", name: s.Name.Name, doc: s.Doc != nil || d.Doc != nil})
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								// A constant of a documented group ("The outcomes.") is
								// documented by it, as go doc shows it.
								out = append(out, exported{file: file, kind: d.Tok.String(), name: n.Name, doc: s.Doc != nil || s.Comment != nil || d.Doc != nil})
							}
						}
					}
				}
			}
		}
	}
	return out
}

// receiverType is the named type of a method's receiver, generic or not.
func receiverType(e ast.Expr) *ast.Ident {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x
		default:
			panic("unexpected receiver")
		}
	}
}

// TestExportedAPIBudget: package idempotency declares at most apiBudget
// exported identifiers, each with a doc comment and with a use outside the
// package's own files (another package of the repository, or the
// package's examples), so that none is exported for nobody.
func TestExportedAPIBudget(t *testing.T) {
	t.Parallel()
	api := exportedAPI(t, ".")
	var names []string
	for _, e := range api {
		names = append(names, e.file+" "+e.kind+" "+e.name)
	}
	require.LessOrEqual(t, len(api), apiBudget, "package idempotency exports %d identifiers, over its budget of %d:\n%s",
		len(api), apiBudget, strings.Join(names, "\n"))

	outside := usesOutside(t)
	var faults []string
	for _, e := range api {
		if !e.doc {
			faults = append(faults, e.file+": exported "+e.kind+" "+e.name+" has no doc comment")
		}
		use := "idempotency." + e.name
		if e.method != "" {
			use = "." + e.method + "("
		}
		if via, ok := reachedThrough[e.name]; ok && e.method == "" {
			use = via
		}
		if !slices.ContainsFunc(outside, func(src string) bool { return strings.Contains(src, use) }) {
			faults = append(faults, e.file+": exported "+e.kind+" "+e.name+" is used by no other package of the repository and no example (no "+use+")")
		}
	}
	require.Empty(t, faults, "every exported identifier has a doc comment and a use outside the package:\n%s", strings.Join(faults, "\n"))
}

// usesOutside is the Go source that may use the package's exported
// names from outside: every .go file of the repository but the
// package's own (its examples aside), and generated code.
func usesOutside(t *testing.T) []string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	here, err := filepath.Abs(".")
	require.NoError(t, err)
	var srcs []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "gen" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || (filepath.Dir(path) == here && d.Name() != "example_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		srcs = append(srcs, string(src))
		return nil
	})
	require.NoError(t, err)
	return srcs
}
