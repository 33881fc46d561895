package canonform_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekey/oncekey/idempotency/internal/canonform"
)

// orderForm is a Stripe-like form body: nested keys, a list, a space.
const orderForm = `amount=1200&currency=rub&items[0][sku]=SKU-1&items[0][qty]=2&metadata[note]=gift+wrap`

func canonical(t *testing.T, body string) string {
	t.Helper()
	out, err := canonform.Canonicalize([]byte(body))
	require.NoError(t, err, "Canonicalize(%q)", body)
	return string(out)
}

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, want string
	}{
		{"already canonical", "a=1&b=2", "a=1&b=2"},
		{"fields keep their order", "b=2&a=1&%41=3", "b=2&a=1&A=3"},
		{"one encoder for every byte", "k%7e=%e2%82%ac+%2a/", "k~=%E2%82%AC+%2A%2F"},
		{"a space is +", "a=x%20y", "a=x+y"},
		{"raw UTF-8 is escaped", "name=Jos\u00e9", "name=Jos%C3%A9"},
		{"repeated key keeps its order", "a[]=2&b=0&a[]=1", "a%5B%5D=2&b=0&a%5B%5D=1"},
		{"= inside a value", "a=b=c", "a=b%3Dc"},
		{"empty value and no = are kept apart", "b=&a", "b=&a"},
		{"empty key", "=1", "=1"},
		{"empty pairs dropped", "&a=1&&b=2&", "a=1&b=2"},
		{"empty body", "", ""},
		{"only separators", "&&&", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := canonical(t, tt.body)
			require.Equal(t, tt.want, got, "Canonicalize(%q)", tt.body)
			require.Equal(t, got, canonical(t, got), "the canonical form is its own canonical form")
		})
	}
}

// TestSameMeaningSameForm: the differences no form parser can see leave
// the canonical form as it is.
func TestSameMeaningSameForm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
	}{
		{"+ and %20", "note=gift+wrap", "note=gift%20wrap"},
		{"%7E and ~", "k=a~b", "k=a%7Eb"},
		{"lower- and upper-case hex", "k=%c3%a9", "k=%C3%A9"},
		{"escaped and raw bytes", "items%5B0%5D%5Bsku%5D=SKU%2D1", "items[0][sku]=SKU-1"},
		{"empty pairs", "a=1&&b=2&", "a=1&b=2"},
		{"leading separator", "&a=1", "a=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, canonical(t, tt.a), canonical(t, tt.b), "%q and %q", tt.a, tt.b)
		})
	}
}

// TestDifferentMeaningDifferentForm: what some parser, or the operation,
// reads differently keeps its own canonical form.
func TestDifferentMeaningDifferentForm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		a, b string
	}{
		{"order of one key's values", "a[]=1&a[]=2", "a[]=2&a[]=1"},
		{"order of different keys", "a=1&b=2", "b=2&a=1"},
		{"order of a repeated key among others", "a=1&b=0&a=2", "a=2&b=0&a=1"},
		{"empty value and no =", "a=", "a"},
		{"changed value", orderForm, strings.Replace(orderForm, "amount=1200", "amount=1201", 1)},
		{"key case", "Amount=1", "amount=1"},
		{"value case", "currency=rub", "currency=RUB"},
		{"an escaped separator is data", "a=1%26b%3D2", "a=1&b=2"},
		{"an escaped + is a plus", "a=1%2B1", "a=1+1"},
		{"a repeated key is not one value", "a=1&a=1", "a=1"},
		{"empty key", "=1", "1"},
		{"fields and none", "a=1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.NotEqual(t, canonical(t, tt.a), canonical(t, tt.b), "%q and %q", tt.a, tt.b)
		})
	}
}

// TestRackAndPHPReadThemDifferently: forms that Rack or PHP read
// differently (rackRead and phpRead, parsers_test.go, follow their rules)
// have different canonical forms, and Legacy, the rule that sorted fields
// by name, gave some of them one. Forms that both read alike but whose
// fields come in another order are kept apart too: keeping the whole
// order is the one rule that needs no list of parsers (a parser of pairs,
// such as Python's parse_qsl, sees any order).
func TestRackAndPHPReadThemDifferently(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, a, b   string
		readAlike    bool // by Rack and by PHP
		legacyShared bool // the sorted rule gave both one form
	}{
		// Rack: a repeated key in "items[][...]" starts a new element: two
		// items, and sorted, three.
		{"Rack's arrays of hashes", "order[items][][sku]=A&order[items][][qty]=1&order[items][][sku]=B&order[items][][qty]=5",
			"order[items][][qty]=1&order[items][][qty]=5&order[items][][sku]=A&order[items][][sku]=B", false, true},
		// PHP: "[]" appends, an index sets: [y] against [y, x].
		{"PHP's appends after an index", "a[]=x&a[0]=y", "a[0]=y&a[]=x", false, true},
		// PHP turns "." of a top-level name into "_": a_b is 2, or 1.
		{"PHP's mangled names", "a.b=1&a_b=2", "a_b=2&a.b=1", false, true},
		// Rack keeps "a.b" and "a_b" apart, PHP does not.
		{"names PHP mangles alike", "a.b=1", "a_b=1", false, false},
		// Rack: nil against "".
		{"no = and an empty value", "a", "a=", false, false},
		// Both: a Hash, or an array, whose keys come in another order.
		{"keys in another order", "a=1&b=2", "b=2&a=1", false, true},
		// Both read {sku: B, qty: 5}, last wins.
		{"duplicates, last wins", "sku=A&sku=B&qty=1&qty=5", "sku=A&qty=1&sku=B&qty=5", true, true},
		// Both read {sku: [A, B], qty: [1, 5]}.
		{"two [] lists, interleaved or not", "sku[]=A&qty[]=1&sku[]=B&qty[]=5", "sku[]=A&sku[]=B&qty[]=1&qty[]=5", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			alike := rackRead(tt.a) == rackRead(tt.b) && phpRead(tt.a) == phpRead(tt.b)
			require.Equal(t, tt.readAlike, alike, "Rack reads %s and %s; PHP reads %s and %s",
				rackRead(tt.a), rackRead(tt.b), phpRead(tt.a), phpRead(tt.b))
			require.NotEqual(t, canonical(t, tt.a), canonical(t, tt.b), "%q and %q", tt.a, tt.b)
			la, err := canonform.Legacy([]byte(tt.a))
			require.NoError(t, err)
			lb, err := canonform.Legacy([]byte(tt.b))
			require.NoError(t, err)
			require.Equal(t, tt.legacyShared, string(la) == string(lb), "the sorted rule's forms of %q and %q: %q, %q", tt.a, tt.b, la, lb)
		})
	}
	// The case, as Rack reads it: two items, and sorted, three.
	require.Equal(t, `{"order"=>{"items"=>[{"sku"=>"A","qty"=>"1"},{"sku"=>"B","qty"=>"5"}]}}`, rackRead(tests[0].a))
	require.Equal(t, `{"order"=>{"items"=>[{"qty"=>"1"},{"qty"=>"5","sku"=>"A"},{"sku"=>"B"}]}}`, rackRead(tests[0].b))
	// What both read alike by its bytes alone still shares a form:
	// brackets escaped or not (both decode a name before reading its
	// brackets), "+" or "%20", empty pairs.
	for _, pair := range [][2]string{
		{"order[items][][sku]=A+B", "order%5Bitems%5D%5B%5D%5Bsku%5D=A%20B"},
		{"a[]=1&&a[]=2&", "a%5B%5D=1&a%5b%5d=2"},
	} {
		require.Equal(t, rackRead(pair[0]), rackRead(pair[1]))
		require.Equal(t, phpRead(pair[0]), phpRead(pair[1]))
		require.Equal(t, canonical(t, pair[0]), canonical(t, pair[1]), "%q and %q", pair[0], pair[1])
	}
}

// TestInvalidFormsAreRefused: a body whose meaning some parser would read
// differently, or not at all, has no canonical form.
func TestInvalidFormsAreRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, reason string
	}{
		{"semicolon separator", "a=1;b=2", "';'"},
		{"semicolon in a value", "a=1;2", "';'"},
		{"escape without digits", "a=%", "percent escape"},
		{"escape with one digit", "a=%4", "percent escape"},
		{"escape not hex", "a=%zz", "percent escape"},
		{"bad escape in a key", "%g1=1", "percent escape"},
		{"escaped invalid UTF-8", "a=%ff", "not UTF-8"},
		{"escaped surrogate half", "a=%ed%a0%80", "not UTF-8"},
		{"truncated UTF-8 sequence", "a=%c3", "not UTF-8"},
		{"raw invalid UTF-8", "a=\xff", "not UTF-8"},
		{"invalid UTF-8 in a key", "\xfe=1", "not UTF-8"},
		{"too many fields", strings.Repeat("a=1&", canonform.MaxFields) + "b=2", "fields"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := canonform.Canonicalize([]byte(tt.body))
			require.ErrorIs(t, err, canonform.ErrInvalid, "Canonicalize(%.60q) = %.60q", tt.body, out)
			require.ErrorContains(t, err, tt.reason)
		})
	}
	t.Run("as many fields as allowed, and empty pairs beside them", func(t *testing.T) {
		t.Parallel()
		_, err := canonform.Canonicalize([]byte(strings.Repeat("a=1&&", canonform.MaxFields)))
		require.NoError(t, err, "empty pairs are not fields")
	})
}
