package idempotency_test

import (
	"encoding/json"
	"net/url"
	"reflect"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
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
	f.Fuzz(func(t *testing.T, m1, r1, p1, q1 string, b1 []byte, m2, r2, p2, q2 string, b2 []byte) {
		query1, err1 := url.ParseQuery(q1)
		query2, err2 := url.ParseQuery(q2)
		if err1 != nil || err2 != nil {
			return
		}
		fp1, err1 := idempotency.ComputeFingerprint(m1, r1, p1, query1, b1)
		fp2, err2 := idempotency.ComputeFingerprint(m2, r2, p2, query2, b2)
		if err1 != nil || err2 != nil {
			return // no canonical form: rejected with 400, never fingerprinted
		}
		sameRequest := m1 == m2 && r1 == r2 && p1 == p2 &&
			query1.Encode() == query2.Encode() && sameJSON(t, b1, b2)
		if sameRequest != (fp1 == fp2) {
			t.Fatalf("same request: %v, same fingerprint: %v\n1: %s %s %s ?%s %q\n2: %s %s %s ?%s %q",
				sameRequest, fp1 == fp2, m1, r1, p1, q1, b1, m2, r2, p2, q2, b2)
		}
	})
}

// sameJSON reports whether two accepted bodies mean the same: both empty,
// or equal as decoded values (numbers as float64, which is the meaning RFC
// 8785 gives them; the canonicaliser rejects integers it could not keep).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	ea := json.Unmarshal(a, &va)
	eb := json.Unmarshal(b, &vb)
	if ea != nil || eb != nil { // only empty bodies are accepted without JSON
		return (ea != nil) == (eb != nil)
	}
	return reflect.DeepEqual(va, vb)
}
