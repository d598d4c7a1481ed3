package decode

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
)

// benchClaimSchema is the coupon claim the fingerprint benchmarks read: a
// dozen scalars, eight items of four fields, a map.
const benchClaimSchema = `{"type":"record","name":"Claim","namespace":"coupon.v1","fields":[
 {"name":"coupon_id","type":"string"},
 {"name":"user_id","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":2}},
 {"name":"currency","type":"string"},
 {"name":"client_time","type":"string"},
 {"name":"retry_count","type":"int"},
 {"name":"channel","type":{"type":"enum","name":"Channel","symbols":["APP","WEB","POS"]}},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"signature","type":{"type":"fixed","name":"Sig","size":16}},
 {"name":"ratio","type":"double"},
 {"name":"store_id","type":"string"},
 {"name":"issued_at","type":"long"},
 {"name":"accepted","type":"boolean"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
   {"name":"sku","type":"string"},
   {"name":"qty","type":"int"},
   {"name":"unit_price","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
   {"name":"client_ts","type":"long"}]}}},
 {"name":"attributes","type":{"type":"map","values":"string"}}]}`

var benchRules = dedupe.CanonicalRules{Volatile: []string{"/client_time"}, Unordered: []string{"/items"}}

// benchClaim returns one claim as Avro binary (written by hand) and as
// the JSON text a producer of JSON would send for it: the mapping's
// output, spaced as people write it.
func benchClaim() (avro, js []byte) {
	var e avroEnc
	e = e.str("CPN-2024-SPRING-000123").str("user-8f14e45fceea167a5a36dedd4bea2543")
	e = e.long(3).raw(0x01, 0xfb, 0x6c) // 129900: 1299.00
	e = e.str("EUR").str("2024-05-01T10:00:00.000Z").long(2)
	e = e.long(1)                                      // WEB
	e = e.long(1).str("first claim, \"spring\" promo") // note
	e = e.raw([]byte(strings.Repeat("\xa5\x5a", 8))...)
	e = e.double(0.125).str("store-0042").long(1714557600123).boolean(true)
	var items []string
	e = e.long(8)
	for i := range 8 {
		sku, cents, ts := fmt.Sprintf("SKU-%06d-XL", 1000+i*37), int64(499+i*250), int64(1714557600123+i*17)
		e = e.str(sku).long(int64(i+1)).long(2).raw(byte(cents>>8), byte(cents)).long(ts)
		items = append(items, fmt.Sprintf(`{"sku": %q, "qty": %d, "unit_price": %d.%02d, "client_ts": %d}`, sku, i+1, cents/100, cents%100, ts))
	}
	e = e.long(0)
	e = e.long(3).str("campaign").str("spring").str("source").str("push").str("segment").str("vip").long(0)
	js = []byte(`{"coupon_id": "CPN-2024-SPRING-000123", "user_id": "user-8f14e45fceea167a5a36dedd4bea2543", ` +
		`"amount": 1299.00, "currency": "EUR", "client_time": "2024-05-01T10:00:00.000Z", "retry_count": 2, ` +
		`"channel": "WEB", "note": "first claim, \"spring\" promo", ` +
		`"signature": "pVqlWqVapVqlWqVapVqlWg==", "ratio": 0.125, "store_id": "store-0042", "issued_at": 1714557600123, ` +
		`"accepted": true, "items": [` + strings.Join(items, ", ") + `], ` +
		`"attributes": {"campaign": "spring", "source": "push", "segment": "vip"}}`)
	return e, js
}

// benchCanonicalizers are the two pipelines of the benchmark: Avro read
// through a local schema file (unframed, no registry), and JSON.
func benchCanonicalizers(tb testing.TB) (avro, js *dedupe.Canonicalizer, dec *Decoder) {
	dec = openSchemaFile(tb, benchClaimSchema)
	rules := benchRules
	rules.Payload, rules.Decoder = dedupe.PayloadAvro, dec
	avro, err := dedupe.NewCanonicalizer(rules)
	if err != nil {
		tb.Fatal(err)
	}
	if js, err = dedupe.NewCanonicalizer(benchRules); err != nil {
		tb.Fatal(err)
	}
	return avro, js, dec
}

// The two benchmarks fingerprint the same command: the Avro claim and the
// JSON claim are one request.
func TestBenchClaimIsOneRequest(t *testing.T) {
	avro, js := benchClaim()
	ca, cj, dec := benchCanonicalizers(t)
	fa, err := ca.Fingerprint(avro)
	if err != nil {
		t.Fatal(err)
	}
	fj, err := cj.Fingerprint(js)
	if err != nil {
		t.Fatal(err)
	}
	if fa != fj {
		decoded, _ := dec.AppendJSON(nil, avro)
		t.Fatalf("avro %s, json %s\ndecoded %s", fa, fj, decoded)
	}
	if len(js) < 900 || len(js) > 1300 {
		t.Fatalf("the claim is %d bytes as JSON, want about 1 KB", len(js))
	}
	t.Logf("avro %d bytes, json %d bytes", len(avro), len(js))
}

func BenchmarkAvroFingerprint(b *testing.B) {
	avro, _ := benchClaim()
	c, _, _ := benchCanonicalizers(b)
	b.SetBytes(int64(len(avro)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Fingerprint(avro); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJSONFingerprint(b *testing.B) {
	_, js := benchClaim()
	_, c, _ := benchCanonicalizers(b)
	b.SetBytes(int64(len(js)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Fingerprint(js); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAvroFingerprintParts splits BenchmarkAvroFingerprint, which
// writes the canonical form in the decoder: that alone (direct), and the
// SHA-256 of its output alone. decode and canonicalize are the way
// through JSON text that it replaced, and that DecodeJSON and a key read
// from the payload still take: decoding alone, and the fingerprint of the
// decoded text alone. All count the Avro input's bytes, so that the times
// of direct and sha256, or of decode and canonicalize, add up to a whole.
func BenchmarkAvroFingerprintParts(b *testing.B) {
	avro, _ := benchClaim()
	ca, c, dec := benchCanonicalizers(b)
	decoded, err := dec.AppendJSON(nil, avro)
	if err != nil {
		b.Fatal(err)
	}
	canon, err := ca.AppendCanonical(nil, avro)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(int64(len(avro)))
		b.ReportAllocs()
		dst := make([]byte, 0, 4096)
		for b.Loop() {
			if dst, err = ca.AppendCanonical(dst[:0], avro); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sha256", func(b *testing.B) {
		b.SetBytes(int64(len(avro)))
		b.ReportAllocs()
		for b.Loop() {
			sha256.Sum256(canon)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(avro)))
		b.ReportAllocs()
		dst := make([]byte, 0, 4096)
		for b.Loop() {
			if dst, err = dec.AppendJSON(dst[:0], avro); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("canonicalize", func(b *testing.B) {
		b.SetBytes(int64(len(avro)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Fingerprint(decoded); err != nil {
				b.Fatal(err)
			}
		}
	})
}
