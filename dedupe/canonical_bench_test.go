package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gowebpki/jcs"
)

var benchSizes = []struct {
	name string
	size int
}{
	{"1KB", 1 << 10},
	{"64KB", 64 << 10},
}

// benchPayload returns a deterministic command of about size bytes shaped
// like the traffic the service sees: envelope fields that specRules mark
// volatile, a nested customer object, tags, and an unordered list of items
// with numbers, escapes and a per-item client timestamp.
func benchPayload(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"command": "place_order", "order_id": "ord-7f3a9c21", "client_time": "2024-05-01T12:00:00.123Z", "retry_count": 2, ` +
		`"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "customer": {"id": "cus_0042", "name": "Zo\u00eb O'Brien", ` +
		`"email": "zoe@example.com", "address": {"street": "1 Rue de l\u2019\u00c9glise", "city": "Lyon", "zip": "69001", "country": "FR"}}, ` +
		`"currency": "EUR", "total": 1234.50, "tags": ["mobile", "vip", "promo-spring"], "items": [`)
	const tail = `], "note": "leave at the door \"please\"\nthanks`
	for i := 0; ; i++ {
		item := fmt.Sprintf(`{"sku": "SKU-%05d", "name": "Widget \"Pro\" %d\/2", "qty": %d, "unit_price": %d.%02d, `+
			`"discount": 0.0, "client_ts": %d, "attrs": {"size": "%c", "color": "red", "gift": %t}}`,
			(i*7919)%100000, i, 1+i%5, 3+i*13%97, i*37%100, 1714564800123+int64(i)*17, "SML"[i%3], i%4 == 0)
		if i > 0 && b.Len()+len(item)+2+len(tail)+2 > size {
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(item)
	}
	b.WriteString(tail)
	// Pad the free-text note so every size is exact and runs compare.
	const filler = " Please ring twice."
	for i := 0; b.Len() < size-2; i++ {
		b.WriteByte(filler[i%len(filler)])
	}
	b.WriteString(`"}`)
	return b.Bytes()
}

func BenchmarkFingerprint(b *testing.B) {
	c, err := NewCanonicalizer(specRules)
	if err != nil {
		b.Fatal(err)
	}
	for _, sz := range benchSizes {
		payload := benchPayload(sz.size)
		b.Run(sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Fingerprint(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkJCSBaseline measures what a team would do without this package:
// drop the volatile fields through encoding/json, then canonicalize with
// gowebpki/jcs and hash. The _transform_only variants leave out the
// removal, which jcs cannot do, to show the bare canonicalizer's cost.
func BenchmarkJCSBaseline(b *testing.B) {
	for _, sz := range benchSizes {
		payload := benchPayload(sz.size)
		b.Run(sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := jcsFingerprintWithRemoval(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(sz.name+"_transform_only", func(b *testing.B) {
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				out, err := jcs.Transform(payload)
				if err != nil {
					b.Fatal(err)
				}
				sum := sha256.Sum256(out)
				_ = "sha256:" + hex.EncodeToString(sum[:])
			}
		})
	}
}

func jcsFingerprintWithRemoval(payload []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return "", err
	}
	delete(doc, "client_time")
	delete(doc, "retry_count")
	delete(doc, "trace_id")
	if items, ok := doc["items"].([]any); ok {
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				delete(m, "client_ts")
			}
		}
	}
	stripped, err := json.Marshal(doc)
	if err != nil {
		return "", err
	}
	out, err := jcs.Transform(stripped)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(out)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// TestCanonicalJCSBaselineAgrees makes sure the baseline computes the same thing as
// the benchmarked path, apart from the unordered sort jcs cannot do, so the
// comparison is between equivalent work.
func TestCanonicalJCSBaselineAgrees(t *testing.T) {
	c := newCanon(t, CanonicalRules{Volatile: specRules.Volatile})
	for _, sz := range benchSizes {
		payload := benchPayload(sz.size)
		want, err := jcsFingerprintWithRemoval(payload)
		if err != nil {
			t.Fatal(err)
		}
		if got := fingerprint(t, c, string(payload)); got != want {
			t.Errorf("%s: fingerprint %s, baseline %s", sz.name, got, want)
		}
	}
}
