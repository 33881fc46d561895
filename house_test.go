package oncekey_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// products are the folders of internal/: the three products, the one
// package of HTTP conventions they share (internal/wire) and the support
// their tests share (internal/testsupport). ARCHITECTURE.md draws them.
var products = map[string]bool{"service": true, "gateway": true, "conformance": true, "wire": true, "testsupport": true}

const internalPrefix = "github.com/oncekey/oncekey/internal/"

// TestInternalHasAFolderPerProduct: nothing is added to internal/ beside
// the products, so that a package's folder says which product it belongs
// to.
func TestInternalHasAFolderPerProduct(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir("internal")
	require.NoError(t, err)
	for _, e := range entries {
		require.Truef(t, e.IsDir() && products[e.Name()], "internal/%s: internal/ holds one folder per product (%v); put it in the product it belongs to (ARCHITECTURE.md)", e.Name(), keys(products))
	}
}

// TestProductsImportOnlyTheirOwn holds the house rules of ARCHITECTURE.md
// over every non-test package of this module (go list's Deps, which leave
// tests out): a product imports its own packages, internal/wire and the
// engine, never another product's; internal/wire imports no product; and
// only tests import internal/testsupport, which may itself build on any
// product (it migrates the service's schema for every product's tests).
// cmd/ wires the products together and may import them all.
func TestProductsImportOnlyTheirOwn(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...").Output()
	require.NoError(t, err, "go list")
	checked := 0
	s := bufio.NewScanner(bytes.NewReader(out))
	s.Buffer(nil, 1<<22)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		pkg, deps := fields[0], fields[1:]
		from := productOf(pkg)
		for _, dep := range deps {
			to := productOf(dep)
			if to == "" || to == from {
				continue
			}
			checked++
			switch {
			case strings.HasPrefix(pkg, "github.com/oncekey/oncekey/cmd/"):
				// wiring
			case from == "testsupport":
				// test support builds what tests of any product need
			case to == "testsupport":
				t.Errorf("%s imports %s: internal/testsupport is for tests only", pkg, dep)
			case from == "" && to == "wire":
				// the module's other packages (client/) may speak the wire
			case to == "wire":
				// shared by every product
			case from == "":
				t.Errorf("%s imports %s: outside internal/, only cmd/ wires products together", pkg, dep)
			default:
				t.Errorf("%s (the %s) imports %s (the %s): a product never imports another's packages; move what both need into internal/wire or the engine", pkg, from, dep, to)
			}
		}
	}
	require.NoError(t, s.Err())
	require.NotZero(t, checked, "no import across internal/'s folders was seen: the test reads nothing")
}

// productOf is the folder of internal/ that pkg is in, or "".
func productOf(pkg string) string {
	rest, ok := strings.CutPrefix(pkg, internalPrefix)
	if !ok {
		return ""
	}
	product, _, _ := strings.Cut(rest, "/")
	return product
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
