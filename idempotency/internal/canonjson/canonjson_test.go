package canonjson_test

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/idempotency/internal/canonjson"
)

// orderBody is the shape of a real request body; the fuzz seeds and the
// benchmark use it too.
const orderBody = `{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`

// mustCanonicalize fails the test, naming the input, if doc has no
// canonical form.
func mustCanonicalize(t testing.TB, doc string) []byte {
	t.Helper()
	out, err := canonjson.Canonicalize([]byte(doc))
	if err != nil {
		t.Fatalf("Canonicalize(%q): unexpected error: %v", doc, err)
	}
	return out
}

func TestCanonicalizeSameMeaningSameBytes(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		a, b string
	}{
		{"key order", `{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{"order body reordered", orderBody, `{"currency":"RUB","amount":1200,"items":[{"qty":2,"sku":"SKU-1"}]}`},
		{"whitespace", `{"a":[1,2],"b":{"c":null}}`, " \t\r\n{ \"b\" : { \"c\" : null } ,\n\t\"a\" : [ 1 , 2 ] }\r\n "},
		{"number 1.0 vs 1", `1.0`, `1`},
		{"number 1e0 vs 1", `1e0`, `1`},
		{"number 10E-1 vs 1", `10E-1`, `1`},
		{"number 1E+2 vs 100", `1E+2`, `100`},
		{"number 4.50 vs 4.5", `4.50`, `4.5`},
		{"number 2e-3 vs 0.002", `2e-3`, `0.002`},
		{"negative zero vs zero", `-0`, `0`},
		{"negative zero float vs zero", `-0.0e5`, `0`},
		{"2^53 as decimal vs integer", `9007199254740992.0`, `9007199254740992`},
		{"2^53 with exponent vs integer", `9.007199254740992e15`, `9007199254740992`},
		{"-2^53 with exponent vs integer", `-9007199254740992E0`, `-9007199254740992`},
		{"string escape \\u0041 vs A", `"\u0041"`, `"A"`},
		{"string escape \\/ vs /", `"a\/b"`, `"a/b"`},
		{"string escape of non-ASCII", `"\u20ac"`, `"€"`},
		{"string surrogate pair vs literal", `"\ud83d\ude00"`, `"😀"`},
		{"upper vs lower hex escape", `"\u00E9"`, `"\u00e9"`},
		{"escaped key", `{"\u0061":1}`, `{"a":1}`},
		{"nested objects", `{"x":{"z":[{"q":1,"p":2}],"y":true}}`, `{"x":{"y":true,"z":[{"p":2,"q":1}]}}`},
		{"nested arrays", `[[1,[2.0,[3e0]]],[]]`, `[ [ 1, [ 2, [ 3 ] ] ], [ ] ]`},
		{"empty containers", `{"a":{},"b":[]}`, `{ "b" : [ ], "a" : { } }`},
		{"unicode keys", `{"é":1,"e":2,"z":3}`, `{"z":3,"e":2,"\u00e9":1}`},
		{
			// RFC 8785 §3.2.3: keys sort by UTF-16 code units, so the
			// emoji (D83D DE00) sorts before U+FB33 although its code point
			// is larger.
			"RFC 8785 sorting example",
			`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}",
		},
		{"empty vs whitespace body", ``, " \t\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := mustCanonicalize(t, tt.a)
			b := mustCanonicalize(t, tt.b)
			if !bytes.Equal(a, b) {
				t.Fatalf("same meaning, different canonical form:\n  %q -> %q\n  %q -> %q", tt.a, a, tt.b, b)
			}
		})
	}
}

func TestCanonicalizeExactBytes(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
		want string
	}{
		{"order body", orderBody, `{"amount":1200,"currency":"RUB","items":[{"qty":2,"sku":"SKU-1"}]}`},
		{"keys sorted, whitespace dropped", `{"b":1, "a":[1,2]}`, `{"a":[1,2],"b":1}`},
		{"nested objects sorted", `{"b":{"d":1,"c":2},"a":[{"f":1,"e":2}]}`, `{"a":[{"e":2,"f":1}],"b":{"c":2,"d":1}}`},
		{"literals", ` [ true , false , null ] `, `[true,false,null]`},
		{"top-level scalar", " 42\n", `42`},
		{"top-level string", `"x"`, `"x"`},
		{"2^53", `9007199254740992`, `9007199254740992`},
		{"-2^53", `-9007199254740992`, `-9007199254740992`},
		{
			// RFC 8785 §3.2.2 example, but 333333333.33333329, which is
			// not the shortest spelling of its double, is exact.
			"RFC 8785 example",
			`{"numbers":[333333333.33333329,4.50,2e-3,0.000000000000000000000000001,1E30],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`,
			`{"literals":[null,true,false],"numbers":[33333333333333329E-8,4.5,0.002,1e-27,1e+30],"string":"€$\u000f\nA'B\"\\\\\"/"}`,
		},
		{"ES6 number forms", `[1E2,0.000001,0.0000001,5e-324,-5E-324,123.4560]`, `[100,0.000001,1e-7,5e-324,-5e-324,123.456]`},
		{"control characters escaped in lower-case hex", `"\u001F\b\f\t"`, `"\u001f\b\f\t"`},
		{"non-ASCII and DEL emitted raw", `"\u00e9\u007f\u2028"`, "\"é\x7f\u2028\""},
		{"empty body", ``, ``},
		{"whitespace body", " \n\t\r ", ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := mustCanonicalize(t, tt.in)
			if string(got) != tt.want {
				t.Fatalf("Canonicalize(%q)\n   got %q\n  want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestCanonicalizeNumbersAreExact: a number is its exact decimal value.
// Where that value is the shortest spelling of a double, it is written as
// RFC 8785 writes the double, so ordinary bodies keep their JCS form (and
// each case's legacy form says so); any other value is written as
// significand "E" exponent, which JCS never writes, so it never meets a
// double's form.
func TestCanonicalizeNumbersAreExact(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
		legacy         string // Legacy's form; "" where Legacy refuses it
	}{
		{"decimal beyond a double", `123456789.123456789123`, `123456789123456789123E-12`, `123456789.12345679`},
		{"its double", `123456789.12345679`, `123456789.12345679`, `123456789.12345679`},
		{"one and a tiny fraction", `1.00000000000000000001`, `100000000000000000001E-20`, `1`},
		{"one", `1.0`, `1`, `1`},
		{"one with exponent", `10E-1`, `1`, `1`},
		{"negative zero", `-0.0`, `0`, `0`},
		{"negative exact", `-0.1000000000000000055511151231257827`, `-1000000000000000055511151231257827E-34`, `-0.1`},
		{"0.1", `0.10`, `0.1`, `0.1`},
		{"2^53", `9007199254740992`, `9007199254740992`, `9007199254740992`},
		{"2^53+1, which no double is", `9007199254740993`, `9007199254740993E0`, ""},
		{"-(2^53+1)", `-9007199254740993`, `-9007199254740993E0`, ""},
		{"2^53+2, a double", `9007199254740994`, `9007199254740994`, ""},
		{"2^53+2 with a fraction", `9007199254740994.0`, `9007199254740994`, ""},
		{"1e16", `1e16`, `10000000000000000`, ""},
		{"2^63", `9223372036854775808`, `9223372036854775808E0`, ""},
		{"1E30", `1E30`, `1e+30`, ""},
		{"largest double", `1.7976931348623157e308`, `1.7976931348623157e+308`, ""},
		{"beyond a double's range", `1e400`, `1E400`, ""},
		{"below a double's range", `1e-400`, `1E-400`, `0`},
		{"400 digits", strings.Repeat("9", 400), strings.Repeat("9", 400) + "E0", ""},
		{"exponent with leading zeros", `[1e0000000000000000000005]`, `[100000]`, `[100000]`},
		{"nested, with an escape (the full writer)", `{"\u0061":[123456789.123456789123,2.50]}`, `{"a":[123456789123456789123E-12,2.5]}`, `{"a":[123456789.12345679,2.5]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := requireCanonical(t, tt.in, tt.want)
			if again := mustCanonicalize(t, string(got)); !bytes.Equal(again, got) {
				t.Fatalf("Canonicalize(%q) = %q, which canonicalises to %q", truncate(tt.in), got, again)
			}
			legacy, err := canonjson.Legacy([]byte(tt.in))
			if tt.legacy == "" {
				if !errors.Is(err, canonjson.ErrInvalid) {
					t.Fatalf("Legacy(%q) = %q, %v; want ErrInvalid", truncate(tt.in), legacy, err)
				}
				return
			}
			if err != nil || string(legacy) != tt.legacy {
				t.Fatalf("Legacy(%q) = %q, %v; want %q", truncate(tt.in), legacy, err, tt.legacy)
			}
		})
	}
}

func TestCanonicalizeDifferentMeaningDifferentBytes(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		a, b string
	}{
		{"array order", `[1,2]`, `[2,1]`},
		{"number vs string", `1`, `"1"`},
		{"number vs string in object", `{"a":1}`, `{"a":"1"}`},
		{"2^53 vs 2^53-1", `9007199254740992`, `9007199254740991`},
		{"-2^53 vs -(2^53-1)", `-9007199254740992`, `-9007199254740991`},
		{"true vs string", `true`, `"true"`},
		{"null vs string", `null`, `"null"`},
		{"null vs missing key", `{"a":null}`, `{}`},
		{"empty object vs empty array", `{}`, `[]`},
		{"empty string vs empty body", `""`, ``},
		{"key case", `{"a":1}`, `{"A":1}`},
		{"string case", `"abc"`, `"ABC"`},
		{"nested value", `{"a":{"b":[1,{"c":true}]}}`, `{"a":{"b":[1,{"c":false}]}}`},
		{"nested array order", `{"a":[[1,2],[3]]}`, `{"a":[[3],[1,2]]}`},
		{"nesting level", `[[1]]`, `[1]`},
		{"small fraction", `0.1`, `0.10000000000000002`},
		{"order amount", orderBody, `{"items":[{"sku":"SKU-1","qty":2}],"amount":1201,"currency":"RUB"}`},
		{"order quantity", orderBody, `{"items":[{"sku":"SKU-1","qty":3}],"amount":1200,"currency":"RUB"}`},
		{"escaped vs literal backslash-u", `"\\u0041"`, `"A"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := mustCanonicalize(t, tt.a)
			b := mustCanonicalize(t, tt.b)
			if bytes.Equal(a, b) {
				t.Fatalf("different meaning, same canonical form %q:\n  a = %q\n  b = %q", a, tt.a, tt.b)
			}
		})
	}
}

// nestedArrays returns depth nested arrays around a number.
func nestedArrays(depth int) string {
	return strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth)
}

// nestedObjects returns depth nested objects around a number.
func nestedObjects(depth int) string {
	return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
}

func TestCanonicalizeRejects(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
	}{
		{"not JSON", `hello`},
		{"unterminated object", `{"a":1`},
		{"unterminated string", `"abc`},
		{"trailing comma", `[1,2,]`},
		{"missing colon", `{"a" 1}`},
		{"single-quoted string", `{'a':1}`},
		{"leading zero", `[01]`},
		{"leading plus", `[+1]`},
		{"bare decimal point", `[1.]`},
		{"hex number", `[0x10]`},
		{"NaN", `NaN`},
		{"Infinity", `[Infinity]`},
		{"raw control character in string", "\"a\x01b\""},
		{"raw newline in string", "\"a\nb\""},
		{"unknown escape", `"\x41"`},
		{"lone high surrogate", `"\ud800"`},
		{"lone low surrogate", `"\udc00"`},
		{"high surrogate then non-surrogate", `"\ud800\u0041"`},
		{"trailing garbage", `{"a":1}x`},
		{"trailing garbage after scalar", `1 x`},
		{"two top-level objects", `{} {}`},
		{"two top-level objects without space", `{}{}`},
		{"two top-level numbers", `1 2`},
		{"two top-level strings", `"a" "b"`},
		{"non-UTF-8 byte in string", "\"\xff\""},
		{"non-UTF-8 byte in key", "{\"\xfe\":1}"},
		{"truncated UTF-8 sequence", "\"\xe2\x82\""},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
		{"overlong UTF-8 encoding", "\"\xc0\xaf\""},
		{"non-UTF-8 byte outside string", "[1]\xff"},
		{"non-JSON whitespace only", "\u00a0"},
		{"duplicate top-level key", `{"a":1,"a":2}`},
		{"duplicate top-level key same value", `{"a":1,"b":2,"a":1}`},
		{"duplicate nested key", `{"x":{"a":1,"a":2}}`},
		{"duplicate key in array element", `[{"a":1},{"b":1,"b":1}]`},
		{"duplicate key spelled with escape", `{"a":1,"\u0061":2}`},
		{"an exponent of 10 digits", `1e1000000000`},
		{"a negative exponent of 10 digits", `[1E-0001000000000]`},
		// Only RFC 8259 whitespace makes an empty body (fuzz regression:
		// "\f" was trimmed by bytes.TrimSpace and accepted as no body).
		{"form feed only", "\f"},
		{"vertical tab only", "\v"},
		{"form feed around value", "\f1\f"},
		{"arrays MaxDepth+1 deep", nestedArrays(canonjson.MaxDepth + 1)},
		{"objects MaxDepth+1 deep", nestedObjects(canonjson.MaxDepth + 1)},
		{"mixed MaxDepth+1 deep", `{"a":` + nestedArrays(canonjson.MaxDepth) + `}`},
		{"very deep arrays", strings.Repeat("[", 100000)},
		{"an object of MaxMembers+1 members", membersObject(canonjson.MaxMembers + 1)},
		{"MaxValues+1 values", "[" + strings.Repeat("1,", canonjson.MaxValues) + "1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := canonjson.Canonicalize([]byte(tt.in))
			if !errors.Is(err, canonjson.ErrInvalid) {
				t.Fatalf("Canonicalize(%q) = %q, %v; want an error wrapping ErrInvalid", truncate(tt.in), out, err)
			}
			if out != nil {
				t.Fatalf("Canonicalize(%q) returned %q alongside error %v; want nil", truncate(tt.in), out, err)
			}
		})
	}
}

// membersObject is an object of n members "k0":0, "k1":1, ...
func membersObject(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	b.WriteString("}")
	return b.String()
}

// The bounds hold at their limits, and a hostile megabyte is refused for
// about what reading it costs: no map of its keys, no token of each.
//
// Not parallel: it reads the process's allocation counter, which the
// parallel tests, paused until the sequential ones are done, leave alone.
func TestCanonicalizeBoundsValuesAndMembers(t *testing.T) {
	mustCanonicalize(t, membersObject(canonjson.MaxMembers))
	mustCanonicalize(t, "["+strings.Repeat("1,", canonjson.MaxValues-1)+"1]")

	hostile := []byte(membersObject(80_000)) // about 1 MB
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := canonjson.Canonicalize(hostile)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, canonjson.ErrInvalid) {
		t.Fatalf("an object of 80,000 members: %v; want ErrInvalid", err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 64<<10 {
		t.Fatalf("refusing a %d-byte object of 80,000 members allocated %d bytes; want under 64 KiB", len(hostile), allocated)
	}
}

func TestCanonicalizeAcceptsMaxDepth(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
		want string
	}{
		{"arrays", nestedArrays(canonjson.MaxDepth), nestedArrays(canonjson.MaxDepth)},
		{"objects", nestedObjects(canonjson.MaxDepth), nestedObjects(canonjson.MaxDepth)},
		{"mixed", `{"a":` + nestedArrays(canonjson.MaxDepth-1) + `}`, `{"a":` + nestedArrays(canonjson.MaxDepth-1) + `}`},
		{"arrays, with whitespace", strings.Repeat("[ ", canonjson.MaxDepth) + strings.Repeat("] ", canonjson.MaxDepth), strings.Repeat("[", canonjson.MaxDepth) + strings.Repeat("]", canonjson.MaxDepth)},
		{"many siblings at MaxDepth", strings.Repeat("[", canonjson.MaxDepth-1) + "[],[],[]" + strings.Repeat("]", canonjson.MaxDepth-1), strings.Repeat("[", canonjson.MaxDepth-1) + "[],[],[]" + strings.Repeat("]", canonjson.MaxDepth-1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			requireCanonical(t, tt.in, tt.want)
		})
	}
}

// requireCanonical fails the test unless in's canonical form is want, and
// returns it.
func requireCanonical(t *testing.T, in, want string) []byte {
	t.Helper()
	got := mustCanonicalize(t, in)
	if string(got) != want {
		t.Fatalf("Canonicalize(%q)\n   got %q\n  want %q", truncate(in), truncate(string(got)), truncate(want))
	}
	return got
}

// truncate keeps failure messages readable for the long generated inputs.
func truncate(s string) string {
	const limit = 80
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
