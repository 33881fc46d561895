package canonjson

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/require"
)

// writeCases are what writeFast must tell apart: what it writes itself
// (fast) and what it leaves to writeFull. They seed FuzzWriteFast too.
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
	{name: "a fraction or an exponent", doc: `[1.0,2e3,-0.0]`, fast: true},
	{name: "exact decimals", doc: `{"amount":123456789.123456789123,"rate":1.00000000000000000001,"big":9007199254740993}`, fast: true},
}

// FuzzWriteFast holds the fast writer to writeFull: whatever it writes is
// exactly what writeFull writes, so a fingerprint does not depend on which
// of them canonicalised the body. Under the legacy rules both write
// exactly what jcs.Transform writes, so that a fingerprint stored before
// numbers were exact is still recognised; and a document whose numbers
// are all shortest doubles has one canonical form under both rules.
func FuzzWriteFast(f *testing.F) {
	for _, s := range checkSeeds {
		f.Add([]byte(s))
	}
	for _, c := range writeCases {
		f.Add([]byte(c.doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) || bounded(data) != nil || len(bytes.Trim(data, " \t\r\n")) == 0 {
			return // Canonicalize refuses it first
		}
		if json.Valid(data) && check(data, legacyNumbers) == nil {
			want, err := jcs.Transform(data)
			require.NoError(t, err, "jcs.Transform(%q)", data)
			full, err := writeFull(data, legacyNumbers)
			require.NoError(t, err, "writeFull(%q), legacy", data)
			require.Equal(t, string(want), string(full), "writeFull(%q), legacy", data)
			if out, ok := writeFast(data, legacyNumbers); ok && checkFast(data, legacyNumbers) {
				require.Equal(t, string(want), string(out), "writeFast(%q), legacy", data)
			}
			exact, err := writeFull(data, exactNumbers)
			require.NoError(t, err, "writeFull(%q)", data)
			if !bytes.Contains(exact, []byte("E")) || bytes.Contains(want, []byte("E")) {
				require.Equal(t, string(want), string(exact), "writeFull(%q): no number beyond a double's, so JCS's form", data)
			}
		}
		if !checkFast(data, exactNumbers) {
			return // Canonicalize does not ask writeFast
		}
		out, ok := writeFast(data, exactNumbers)
		if !ok {
			return
		}
		want, err := writeFull(data, exactNumbers)
		require.NoError(t, err, "writeFull(%q), which writeFast wrote as %q", data, out)
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
			require.True(t, checkFast(doc, exactNumbers), "checkFast(%s): writeFast sees only what it accepts", tt.doc)
			out, ok := writeFast(doc, exactNumbers)
			require.Equal(t, tt.fast, ok, "writeFast(%s) decides", tt.doc)
			if ok {
				want, err := writeFull(doc, exactNumbers)
				require.NoError(t, err, "writeFull(%s)", tt.doc)
				require.Equal(t, string(want), string(out), "writeFast(%s)", tt.doc)
			}
		})
	}
}

// The fast writer is worth having because it allocates once, for its
// output, where writeFull (jcs.Transform) allocates per token. Not parallel:
// testing.AllocsPerRun refuses to run beside other tests.
func TestWriteFastAllocatesOnce(t *testing.T) {
	doc := []byte(checkSeeds[0])
	fast := testing.AllocsPerRun(100, func() { _, _ = writeFast(doc, exactNumbers) })
	full := testing.AllocsPerRun(100, func() { _, _ = writeFull(doc, exactNumbers) })
	require.Equal(t, 1.0, fast, "allocations of writeFast on an order body (jcs.Transform: %v)", full)
}
