package httpapi

import "testing"

func TestHoldsNUL(t *testing.T) {
	t.Parallel()
	for doc, want := range map[string]bool{
		`{"a":"x\u0000y"}`:     true,
		`{"a":"\u0000"}`:       true,
		`{"a":"\\\u0000"}`:     true,  // an escaped backslash, then NUL
		`{"a":"\\u0000"}`:      false, // the text \u0000, backslash escaped
		`{"a":"\\\\u0000"}`:    false,
		`{"a":"u0000"}`:        false,
		`{"a":"\u00000"}`:      true,
		`{"a":"x","\u0000":1}`: true, // in a key too
		``:                     false,
	} {
		if got := holdsNUL([]byte(doc)); got != want {
			t.Errorf("holdsNUL(%s) = %v, want %v", doc, got, want)
		}
	}
}
