package canonjson

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

var checkSeeds = []string{
	`{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`,
	`{"a":1,"a":2}`,
	`{"a":{"a":1},"b":{"a":2}}`,
	`{"a":1,"\u0061":2}`,
	`{"a" : "x", "b":["a","a"]}`,
	`{"k":"a\"b","k":1}`,
	`[9007199254740992,9007199254740993,-9007199254740992,1e16,12345678901234567]`,
	`{"n":0.1,"m":-0,"o":5e-324,"p":1E400}`,
	`"top level string"`,
	`[] []`,
	`{"a":1}x`,
	` {"a" :1 } `,
	strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth),
	strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
	`{"":1,"":2}`,
	`[{"a":1},{"a":1}]`,
}

// FuzzCheckFast holds the fast path to check's verdicts: whatever it
// accepts, check accepts too. (Answering false is always safe; check then
// decides.)
func FuzzCheckFast(f *testing.F) {
	for _, s := range checkSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) {
			return // Canonicalize refuses it before either check
		}
		for _, n := range []numbers{exactNumbers, legacyNumbers} {
			if checkFast(data, n) {
				if err := check(data, n); err != nil {
					t.Fatalf("checkFast accepted %q, check refuses it: %v", data, err)
				}
			}
		}
	})
}

// The fast path must decide the bodies requests carry, or it is only
// overhead: valid documents without escaped keys are accepted at once,
// without allocating.
func TestCheckFastDecidesCommonBodies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		fast bool
	}{
		{name: "order", doc: checkSeeds[0], fast: true},
		{name: "same key in sibling objects", doc: `{"a":{"a":1},"b":{"a":2}}`, fast: true},
		{name: "strings equal to keys", doc: `{"a" : "x", "b":["a","a"]}`, fast: true},
		{name: "deepest allowed nesting", doc: checkSeeds[12], fast: true},
		{name: "numbers", doc: `[9007199254740992,-0,0.1,5e-324,123456789012345]`, fast: true},
		{name: "duplicate key", doc: `{"a":1,"a":2}`},
		{name: "escaped key", doc: `{"\u0061":2}`},
		{name: "integer beyond 2^53", doc: `[9007199254740993]`, fast: true},
		{name: "an exponent of more than 9 digits", doc: `[1e1000000000]`},
		{name: "too deep", doc: checkSeeds[13]},
		{name: "two values", doc: `[] []`},
		{name: "an object of as many keys as decided fast", doc: object(maxFastKeys), fast: true},
		{name: "an object of more keys: check's map decides", doc: object(maxFastKeys + 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.fast, checkFast([]byte(tt.doc), exactNumbers), "checkFast(%s)", tt.doc)
			if tt.fast {
				require.NoError(t, check([]byte(tt.doc), exactNumbers), "check agrees")
			}
		})
	}
}

// The fast path is worth having because it does not allocate per token as
// check does (none at all without -race, which adds some of its own). Not
// parallel: testing.AllocsPerRun refuses to run beside other tests.
func TestCheckFastAllocatesLittle(t *testing.T) {
	doc := []byte(checkSeeds[0])
	fast := testing.AllocsPerRun(100, func() { checkFast(doc, exactNumbers) })
	full := testing.AllocsPerRun(100, func() { _ = check(doc, exactNumbers) })
	require.LessOrEqual(t, fast*10, full, "allocations of checkFast (%v) against check (%v) on an order body", fast, full)
}

// object is a JSON object of n distinct keys.
func object(n int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	b.WriteByte('}')
	return b.String()
}
