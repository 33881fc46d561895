package idempotency_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/oncekey/oncekey/idempotency"
)

// BenchmarkFingerprint measures ComputeFingerprint as the middleware calls
// it for POST /orders: canonicalisation plus SHA-256 over the parts. B/s
// makes the small and the large body comparable.
func BenchmarkFingerprint(b *testing.B) {
	cases := []struct {
		name string
		body []byte
	}{
		{"small", []byte(`{"items":[{"sku":"SKU-1","qty":2}],"amount":1200,"currency":"RUB"}`)},
		{"16KiB", benchOrderBody(100)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if _, err := idempotency.ComputeFingerprint(http.MethodPost, "/orders", "/orders", nil, c.body); err != nil {
					b.Fatalf("ComputeFingerprint: %v", err)
				}
			}
		})
	}
}

// BenchmarkParseKey measures ParseKey on a typical key (a UUID) and on the
// longest one allowed, since the check walks every byte.
func BenchmarkParseKey(b *testing.B) {
	cases := []struct {
		name string
		key  string
	}{
		{"uuid", "0190f7a4-6f0e-7c8a-9b1d-2f4e6a8c0b1d"},
		{"max", strings.Repeat("k", idempotency.MaxKeyLength)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := http.Header{}
			h.Set(idempotency.HeaderKey, c.key)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := idempotency.ParseKey(h); err != nil {
					b.Fatalf("ParseKey: %v", err)
				}
			}
		})
	}
}

// benchOrderBody is an order of n items, about 166 bytes each, so that 100
// items make a body of about 16 KiB (the same shape as canonjson's
// benchmark uses).
func benchOrderBody(n int) []byte {
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
