package conformance

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// yamlBomb is a YAML bomb of six levels: each alias names a list of ten
// of the level below, so x-5 stands for a million strings. With its
// external $ref, Load writes the document out as block YAML for
// kin-openapi (see blockYAML), aliases expanded; written out in full, it
// took 4 s and 403 MB (seven levels: 2.3 GB).
const yamlBomb = `openapi: 3.0.3
info: {title: Bomb, version: "1"}
paths:
  /orders:
    post:
      parameters:
        - $ref: 'common.yaml#/components/parameters/Key'
      responses:
        '200':
          description: OK
x-0: &a [x, x, x, x, x, x, x, x, x, x]
x-1: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
x-2: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
x-3: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
x-4: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
x-5: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
`

// TestLoadRefusesAYAMLBomb: a YAML bomb is refused in a few milliseconds
// and kilobytes, whether Load writes it out (it has an external $ref) or
// hands it to kin-openapi as it is (whose parser counts aliases).
//
// Not parallel, unlike the other tests: what it measures (the bytes
// allocated, the time) is the process's, which tests running alongside
// would add to. The time is bounded in a build without the race detector,
// which slows everything it runs 5 to 10 times.
func TestLoadRefusesAYAMLBomb(t *testing.T) {
	for _, tc := range []struct{ name, doc, err string }{
		{"written out, with an external $ref", yamlBomb, "the document's YAML aliases, written out, make more than 10000 nodes"},
		{"handed over as it is", strings.Replace(yamlBomb, "        - $ref: 'common.yaml#/components/parameters/Key'\n", "        - {name: Idempotency-Key, in: header, schema: {type: string}}\n", 1), "excessive aliasing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "openapi.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.doc), 0o600))
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, _, err := Load(path)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d bytes of YAML: refused in %v, %d KiB allocated (race: %v)", len(tc.doc), took.Round(time.Microsecond), allocated>>10, raceEnabled)
			require.Less(t, allocated, uint64(50<<20), "bytes allocated loading a YAML bomb")
			bound := 10 * time.Second
			if !raceEnabled {
				bound = time.Second
			}
			require.Less(t, took, bound, "loading a YAML bomb")
			require.ErrorContains(t, err, tc.err)
		})
	}
}

// TestLoadWritesOutAliases: a document that uses its anchors as real
// documents do (a schema named a few times) is written out, its aliases
// expanded, within blockYAML's budget.
func TestLoadWritesOutAliases(t *testing.T) {
	t.Parallel()
	var doc strings.Builder
	doc.WriteString(`openapi: 3.0.3
info: {title: T, version: "1"}
paths:
`)
	for _, p := range []string{"/a", "/b", "/c", "/d", "/e", "/f", "/g", "/h"} {
		doc.WriteString("  " + p + ":\n    post:\n      parameters: [{$ref: 'common.yaml#/Key'}]\n      requestBody: {content: {application/json: {schema: *order}}}\n      responses: {'200': {description: OK}}\n")
	}
	text := strings.Replace(doc.String(), "schema: *order", `schema: &order {type: object, properties: {amount: {type: integer}, currency: {type: string, enum: [eur, usd, gbp]}, lines: {type: array, items: {type: object, properties: {sku: {type: string}, quantity: {type: integer}}}}}}`, 1)
	path := filepath.Join(t.TempDir(), "openapi.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	loaded, notices, err := Load(path)
	require.NoError(t, err)
	require.Len(t, notices, 8, "one external $ref a path: the document is written out")
	for _, p := range []string{"/a", "/h"} {
		schema := loaded.Paths.Value(p).Post.RequestBody.Value.Content.Get("application/json").Schema.Value
		require.True(t, schema.Properties["lines"].Value.Items.Value.Properties["quantity"].Value.Type.Is("integer"), "the aliased schema of %s", p)
	}
}
