package canonjson

import (
	"testing"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/require"
)

// writeCases are what writeFast must tell apart: what it writes itself
// (fast) and what it leaves to jcs.Transform. They seed FuzzWriteFast too.
var writeCases = []struct {
	name string
	doc  string
	fast bool
}{
	{name: "order", doc: checkSeeds[0], fast: true},
	{name: "keys out of order, whitespace", doc: " { \"z\" :\t[ ] , \"y\" : { } ,\r\n\"x\":\"\" } ", fast: true},
	{name: "keys sorting before and after a prefix", doc: `{"b":[1,-0,{"d":true,"c":null}],"a":"x y","a!":false,"":0}`, fast: true},
	{name: "strings beyond ASCII", doc: `{"k":"Привет, 世界 😀"}`, fast: true},
	{name: "scalars at the top", doc: `[true,false,null,12345678901234]`, fast: true},
	{name: "a string at the top", doc: `"a"`, fast: true},
	{name: "negative zero", doc: `-0`, fast: true},
	{name: "deepest allowed nesting", doc: checkSeeds[12], fast: true},
	{name: "an escape", doc: `{"k":"Привет, 世界 😀","j":"\u00e9"}`},
	{name: "a key beyond ASCII", doc: `{"é":1,"e":2}`},
	{name: "a fraction or an exponent", doc: `[1.0,2e3,-0.0]`},
}

// FuzzWriteFast holds the fast writer to jcs.Transform: whatever it writes
// is exactly what jcs.Transform writes, so a fingerprint does not depend on
// which of them canonicalised the body.
func FuzzWriteFast(f *testing.F) {
	for _, s := range checkSeeds {
		f.Add([]byte(s))
	}
	for _, c := range writeCases {
		f.Add([]byte(c.doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) || !checkFast(data) {
			return // Canonicalize does not ask writeFast
		}
		out, ok := writeFast(data)
		if !ok {
			return
		}
		want, err := jcs.Transform(data)
		require.NoError(t, err, "jcs.Transform(%q), which writeFast wrote as %q", data, out)
		require.Equal(t, string(want), string(out), "writeFast(%q)", data)
	})
}

// The fast writer must decide the bodies requests carry, or it is only
// overhead; what it leaves to jcs.Transform is what it cannot write by
// rearranging tokens.
func TestWriteFastDecidesCommonBodies(t *testing.T) {
	t.Parallel()
	for _, tt := range writeCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc := []byte(tt.doc)
			require.True(t, checkFast(doc), "checkFast(%s): writeFast sees only what it accepts", tt.doc)
			out, ok := writeFast(doc)
			require.Equal(t, tt.fast, ok, "writeFast(%s) decides", tt.doc)
			if ok {
				want, err := jcs.Transform(doc)
				require.NoError(t, err, "jcs.Transform(%s)", tt.doc)
				require.Equal(t, string(want), string(out), "writeFast(%s)", tt.doc)
			}
		})
	}
}

// The fast writer is worth having because it allocates once, for its
// output, where jcs.Transform allocates per token. Not parallel:
// testing.AllocsPerRun refuses to run beside other tests.
func TestWriteFastAllocatesOnce(t *testing.T) {
	doc := []byte(checkSeeds[0])
	fast := testing.AllocsPerRun(100, func() { _, _ = writeFast(doc) })
	full := testing.AllocsPerRun(100, func() { _, _ = jcs.Transform(doc) })
	require.Equal(t, 1.0, fast, "allocations of writeFast on an order body (jcs.Transform: %v)", full)
}
