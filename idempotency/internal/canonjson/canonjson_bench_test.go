package canonjson_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/idempotency/internal/canonjson"
)

// respelledOrderBody is orderBody as another client might send it: other
// whitespace, other key order and the amount as 1.2e3. It costs more than
// orderBody because the canonical form has to undo all three.
const respelledOrderBody = "{\n\t\"currency\" : \"RUB\",\n\t\"amount\" : 1.2e3,\n\t\"items\" : [ { \"qty\" : 2, \"sku\" : \"SKU-1\" } ]\n}"

// BenchmarkCanonicalize measures Canonicalize, which every unsafe
// request pays for before its fingerprint exists. The large body shows how
// the cost grows with size; B/s makes the cases comparable.
//
// It is not named BenchmarkCanonicalize because canonjson_test.go already
// declares a benchmark of that name for the small body.
func BenchmarkCanonicalize(b *testing.B) {
	// The respelled body must mean the same order, or its case measures
	// something else.
	want, err := canonjson.Canonicalize([]byte(orderBody))
	if err != nil {
		b.Fatalf("Canonicalize(orderBody): %v", err)
	}
	if got, err := canonjson.Canonicalize([]byte(respelledOrderBody)); err != nil || !bytes.Equal(got, want) {
		b.Fatalf("respelled body canonicalises to %s (%v), want %s", got, err, want)
	}
	cases := []struct {
		name string
		body []byte
	}{
		{"small", []byte(orderBody)},
		{"respelled", []byte(respelledOrderBody)},
		{"16KiB", largeOrderBody(100)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := canonjson.Canonicalize(c.body); err != nil {
					b.Fatalf("Canonicalize: %v", err)
				}
			}
		})
	}
}

// largeOrderBody is an order of n items, about 166 bytes each, so that 100
// items make a body of about 16 KiB: large for an order, well inside the
// 1 MiB request limit.
func largeOrderBody(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"items":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"sku":"SKU-%04d","qty":%d,"price":%d,"name":"Item %d","note":"%s"}`,
			i, i%9+1, 100+i*7, i, strings.Repeat("gift wrap ", 10))
	}
	sb.WriteString(`],"amount":1200,"currency":"RUB"}`)
	return []byte(sb.String())
}
