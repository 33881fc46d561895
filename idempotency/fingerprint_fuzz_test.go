package idempotency_test

import (
	"errors"
	"net/url"
	"reflect"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
	"github.com/oncekey/oncekey/idempotency/internal/jsonmeaning"
)

// FuzzFingerprint: requests with the same meaning (any JSON spelling of
// the body) get the same fingerprint; requests that differ in method,
// route, path, query or the body's meaning get different ones.
func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/orders", "/orders", "a=1&b=2", []byte(`{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`),
		"POST", "/orders", "/orders", "b=2&a=1", []byte(`{"currency":"RUB","amount":1.2e3,"items":[{"qty":2,"sku":"SKU-1"}]}`))
	f.Add("POST", "/orders/{id}", "/orders/1", "", []byte(`{"a":1}`), "POST", "/orders/{id}", "/orders/2", "", []byte(`{"a":1}`))
	f.Add("PUT", "/x", "/x", "", []byte(`[1,2]`), "PUT", "/x", "/x", "", []byte(`[2,1]`))
	f.Add("POST", "/a", "/a", "", []byte(``), "POST", "/a", "/a", "", []byte(` `))
	f.Add("POST", "/a", "/a", "", []byte(`{"amount":123456789.123456789123}`), "POST", "/a", "/a", "", []byte(`{"amount":123456789.12345679}`))
	f.Add("POST", "/a", "/a", "", []byte(`1.00000000000000000001`), "POST", "/a", "/a", "", []byte(`1.0`))
	f.Fuzz(func(t *testing.T, m1, r1, p1, q1 string, b1 []byte, m2, r2, p2, q2 string, b2 []byte) {
		query1, err1 := url.ParseQuery(q1)
		query2, err2 := url.ParseQuery(q2)
		if err1 != nil || err2 != nil {
			return
		}
		fp1, err1 := idempotency.Request{Method: m1, Route: r1, Path: p1, Query: query1.Encode(), Body: b1}.Fingerprint()
		fp2, err2 := idempotency.Request{Method: m2, Route: r2, Path: p2, Query: query2.Encode(), Body: b2}.Fingerprint()
		if err1 != nil || err2 != nil {
			return // no canonical form: rejected with 400, never fingerprinted
		}
		same, ok := sameJSON(b1, b2)
		if !ok {
			return
		}
		sameRequest := m1 == m2 && r1 == r2 && p1 == p2 && query1.Encode() == query2.Encode() && same
		if sameRequest != (fp1 == fp2) {
			t.Fatalf("same request: %v, same fingerprint: %v\n1: %s %s %s ?%s %q\n2: %s %s %s ?%s %q",
				sameRequest, fp1 == fp2, m1, r1, p1, q1, b1, m2, r2, p2, q2, b2)
		}
	})
}

// sameJSON reports whether two accepted bodies mean the same: both empty,
// or equal as jsonmeaning decodes them (numbers as exact decimals, the
// meaning the fingerprint gives them). ok is false where the test cannot
// tell in reasonable time.
func sameJSON(a, b []byte) (same, ok bool) {
	va, ea := jsonmeaning.Decode(a)
	vb, eb := jsonmeaning.Decode(b)
	if errors.Is(ea, jsonmeaning.ErrHugeExponent) || errors.Is(eb, jsonmeaning.ErrHugeExponent) {
		return false, false
	}
	if ea != nil || eb != nil { // only empty bodies are accepted without JSON
		return (ea != nil) == (eb != nil), true
	}
	return reflect.DeepEqual(va, vb), true
}
