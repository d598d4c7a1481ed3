package dedupe

import (
	"fmt"
	"testing"
)

// loadRules and loadPayload mirror the records internal/load sends through
// the pipeline (internal/load/workload_test.go): compact JSON of about 1 KB
// without escapes, half of it one long plain-text note. That shape differs
// from benchPayload's, so it has a benchmark of its own.
var loadRules = CanonicalRules{
	Volatile:  []string{"/client_time", "/retry_count", "/trace_id", "/items/*/client_ts"},
	Unordered: []string{"/items"},
}

var loadSKUs = []string{"A-1", "B-2", "C-3", "D-4", "E-5", "F-6", "G-7", "H-8"}

// loadPayload builds the first copy of load record k.
func loadPayload(k int) []byte {
	b := make([]byte, 0, 1152)
	b = fmt.Appendf(b, `{"client_time":"2026-06-18T10:%02d:%02d.%03dZ","retry_count":0,"trace_id":"%016x%016x",`,
		k%60, k%60, k%1000, uint64(k)*0x9e3779b97f4a7c15, uint64(k))
	b = fmt.Appendf(b, `"user_id":"u-%d","coupon_id":%d,"campaign":"spring-%d","amount":%d.%02d,"currency":"EUR","items":[`,
		k%100000, 10000+k%500, k%7, 10+k%90, k%100)
	const nItems = 4
	for i := range nItems {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"sku":"%s","qty":%d,"price":%d.%02d,"client_ts":%d}`,
			loadSKUs[(k+i)%len(loadSKUs)], 1+(k+i)%3, 1+(k*i)%50, (k+i)%100, 1718000000000+int64(k)*10+int64(i)+1000)
	}
	b = fmt.Appendf(b, `],"shipping":{"name":"Customer %d","street":"%d Long Street","city":"Springfield","zip":"%05d","country":"DE"},"note":"`,
		k, 1+k%400, k%100000)
	for len(b) < 1000 {
		b = append(b, "deliver to the front desk, ring twice; "...)
	}
	return append(b, `"}`...)
}

func BenchmarkFingerprintLoad(b *testing.B) {
	c, err := NewCanonicalizer(loadRules)
	if err != nil {
		b.Fatal(err)
	}
	payload := loadPayload(12345)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Fingerprint(payload); err != nil {
			b.Fatal(err)
		}
	}
}
