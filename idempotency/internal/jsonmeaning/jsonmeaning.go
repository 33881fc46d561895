// Package jsonmeaning decodes a JSON document into what it means to the
// fingerprint, for the tests that hold the canonical form and the
// fingerprint to it: values as encoding/json decodes them, but each number
// as its exact decimal value, never a double's.
package jsonmeaning

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"regexp"
)

// Number is a number's exact value in lowest terms (big.Rat's RatString):
// a type of its own, so that it never equals a string.
type Number string

// ErrHugeExponent is what Decode answers for a document with a number
// whose exponent has 4 digits or more: its exact value would cost what
// its exponent says, which a test cannot afford.
var ErrHugeExponent = errors.New("an exponent of 4 digits or more")

var hugeExponent = regexp.MustCompile(`[eE][+-]?0*[1-9][0-9]{3}`)

// Decode decodes doc, one JSON value, each number as a Number. Two
// documents mean the same exactly when their values are reflect.DeepEqual.
func Decode(doc []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one value")
	}
	return exact(v)
}

func exact(v any) (any, error) {
	switch v := v.(type) {
	case json.Number:
		if hugeExponent.MatchString(string(v)) {
			return nil, ErrHugeExponent
		}
		r, ok := new(big.Rat).SetString(string(v))
		if !ok {
			return nil, fmt.Errorf("number %s", v)
		}
		return Number(r.RatString()), nil
	case []any:
		for i := range v {
			var err error
			if v[i], err = exact(v[i]); err != nil {
				return nil, err
			}
		}
	case map[string]any:
		for k := range v {
			var err error
			if v[k], err = exact(v[k]); err != nil {
				return nil, err
			}
		}
	}
	return v, nil
}
