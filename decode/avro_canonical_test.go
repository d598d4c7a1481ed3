package decode

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// progDecoder decodes with one compiled program, both ways: a Decoder
// reads registry or file schemas, and the fuzz programs resolve writer
// schemas a file cannot give. direct counts the records it wrote itself.
type progDecoder struct {
	p      *avroProg
	direct *int
}

func (d progDecoder) AppendJSON(dst, v []byte) ([]byte, error) { return appendAvroJSON(dst, d.p, v) }
func (d progDecoder) Digest() string                           { return "test" }
func (d progDecoder) AppendCanonical(dst, v []byte, rules *dedupe.PathRules) ([]byte, bool) {
	out, ok := appendAvroCanonical(dst, d.p, v, rules)
	if ok {
		*d.direct++
	}
	return out, ok
}

// avroCanonRules are rule sets for each fuzz program: paths to record
// fields, map keys, array indices and union tags, wildcards, volatile
// paths inside unordered arrays and defaults, and no rules.
var avroCanonRules = map[string][]dedupe.CanonicalRules{
	"claim": {
		{Volatile: []string{"/client_time", "/items/*/client_ts"}, Unordered: []string{"/items"}},
		{Volatile: []string{"/attrs/k", "/items/0", "/target/coupon.v1.Item/qty"}, Unordered: []string{"/attrs"}},
		{Volatile: []string{"/*/sku", "/note"}, Unordered: []string{"/*"}},
		{Volatile: []string{"/target/coupon.v1.Item"}, Unordered: []string{"/items/*"}},
	},
	"claim-v2": {
		{Volatile: []string{"/region/code", "/tags/0"}, Unordered: []string{"/tags"}},
		{Volatile: []string{"/region", "/user"}, Unordered: []string{"/sig"}},
		{Volatile: []string{"/*"}},
	},
	"node": {
		{Volatile: []string{"/kids/*/v", "/alt/t.Node/v"}, Unordered: []string{"/kids", "/next/kids"}},
		{Volatile: []string{"/next/next", "/kids/1"}, Unordered: []string{"/*/kids", "/kids/*/kids"}},
		{Volatile: []string{"/alt/string"}, Unordered: []string{"/kids/*/kids/*/kids"}},
	},
	"mix": {
		{Volatile: []string{"/u/string", "/m/*/0"}, Unordered: []string{"/m/*", "/u/array", "/u/map"}},
		{Volatile: []string{"/m/k", "/u/P/x", "/u/map/a"}, Unordered: []string{"/u/P"}},
		{Volatile: []string{"/*/*/*"}, Unordered: []string{"/*"}},
	},
}

// avroCanonPair builds, for a program and its rule sets, the canonicalizer
// that lets the decoder write the canonical form and the one that reads
// the JSON text AppendJSON writes, as the canonicalizer did before.
type avroCanonPair struct {
	direct, text *dedupe.Canonicalizer
}

func avroCanonPairs(tb testing.TB, progs map[string]*avroProg, direct *int) map[string][]avroCanonPair {
	pairs := map[string][]avroCanonPair{}
	for name, p := range progs {
		for _, rules := range append(avroCanonRules[name], dedupe.CanonicalRules{}) {
			text, err := dedupe.NewCanonicalizer(rules)
			if err != nil {
				tb.Fatal(err)
			}
			rules.Payload, rules.Decoder = dedupe.PayloadAvro, progDecoder{p, direct}
			d, err := dedupe.NewCanonicalizer(rules)
			if err != nil {
				tb.Fatal(err)
			}
			pairs[name] = append(pairs[name], avroCanonPair{d, text})
		}
	}
	return pairs
}

// checkCanonicalSame checks that writing the canonical form directly gives
// what canonicalizing the decoded text gives: the same bytes, the same
// fingerprint, and an error exactly where there was one.
func checkCanonicalSame(t *testing.T, name string, p *avroProg, pair avroCanonPair, data []byte) {
	t.Helper()
	var want []byte
	js, err := appendAvroJSON(nil, p, data)
	if err == nil {
		want, err = pair.text.AppendCanonical(nil, js)
	}
	got, gerr := pair.direct.AppendCanonical(nil, data)
	if (err == nil) != (gerr == nil) || !bytes.Equal(got, want) {
		t.Fatalf("%s %v: direct %s (%v)\nfrom text %s (%v)\ntext %s", name, pair.text.Rules(), got, gerr, want, err, js)
	}
	if err != nil {
		return
	}
	fd, err := pair.direct.Fingerprint(data)
	if err != nil {
		t.Fatal(err)
	}
	if ft, _ := pair.text.Fingerprint(js); fd != ft {
		t.Fatalf("%s: fingerprints %s and %s", name, fd, ft)
	}
}

// FuzzAvroCanonicalSame decodes arbitrary bytes under the fuzz schemas
// and rules with volatile and unordered paths: the canonical form the
// decoder writes is the canonicalizer's form of the text AppendJSON
// writes, byte for byte. Fingerprints are stored; this is what lets the
// decoder write them.
func FuzzAvroCanonicalSame(f *testing.F) {
	progs := avroFuzzProgs(f)
	f.Add(claimV1Bytes("2026-12-05T10:00:00Z", 5000))
	f.Add(claimV1Bytes("t\x00\"\\\u00e9\n\u2028", -32768))
	f.Add(avroNodeSeed())
	for _, s := range avroMixSeeds() {
		f.Add([]byte(s))
	}
	var direct int
	pairs := avroCanonPairs(f, progs, &direct)
	f.Fuzz(func(t *testing.T, data []byte) {
		for name, p := range progs {
			for _, pair := range pairs[name] {
				checkCanonicalSame(t, name, p, pair, data)
			}
		}
	})
}

// The seeds are written directly under every rule set, and the benchmark's
// claim is, the way the pipeline reads it.
func TestAvroCanonicalDirect(t *testing.T) {
	progs := avroFuzzProgs(t)
	var direct int
	pairs := avroCanonPairs(t, progs, &direct)
	seeds := map[string][][]byte{"claim": {claimV1Bytes("t", 5000)}, "claim-v2": {claimV1Bytes("t", 5000)}, "node": {avroNodeSeed()}}
	for _, s := range avroMixSeeds() {
		seeds["mix"] = append(seeds["mix"], s)
	}
	n := 0
	for name, data := range seeds {
		for _, d := range data {
			for _, pair := range pairs[name] {
				checkCanonicalSame(t, name, progs[name], pair, d)
				n++
			}
		}
	}
	if direct == 0 {
		t.Fatal("no record was written directly")
	}
	t.Logf("%d of %d records written directly (each twice)", direct/2, n)

	avro, _ := benchClaim()
	c, _, dec := benchCanonicalizers(t)
	if _, ok := dec.AppendCanonical(nil, avro, nil); !ok {
		t.Fatal("the benchmark's claim is not written directly")
	}
	if _, err := c.Fingerprint(avro); err != nil {
		t.Fatal(err)
	}
}

// appendInt writes what strconv does, for every length of number and
// both signs.
func TestAppendIntIsStrconv(t *testing.T) {
	check := func(v int64) {
		if got, want := appendInt([]byte("x"), v), strconv.AppendInt([]byte("x"), v, 10); !bytes.Equal(got, want) {
			t.Fatalf("%d: got %s", v, got)
		}
		if got, want := appendUint(nil, uint64(v)), strconv.AppendUint(nil, uint64(v), 10); !bytes.Equal(got, want) {
			t.Fatalf("%d unsigned: got %s", uint64(v), got)
		}
	}
	for _, v := range []int64{0, 1, -1, 9, 10, 99, 100, math.MaxInt64, math.MinInt64, math.MinInt64 + 1} {
		check(v)
	}
	for p := int64(1); p <= math.MaxInt64/10; p *= 10 {
		for _, v := range []int64{p - 1, p, p + 1, 10*p - 1} {
			check(v)
			check(-v)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		check(int64(rng.Uint64() >> rng.IntN(64)))
	}
}

// The decider fingerprints what the canonicalizer does, by the direct way
// when nothing else reads the decoded payload and by the JSON text when
// the key is a field of it; a record that does not decode is poison either
// way.
func TestAvroDecidePrepareDirect(t *testing.T) {
	avro, js := benchClaim()
	_, cj, dec := benchCanonicalizers(t)
	want, err := cj.Fingerprint(js)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []dedupe.KeySpec{
		{From: dedupe.KeyFromHeader, Name: "Idempotency-Key"},
		{From: dedupe.KeyFromField, Name: "/coupon_id"},
	} {
		rules := benchRules
		rules.Payload, rules.Decoder = dedupe.PayloadAvro, dec
		d, err := dedupe.NewDecider(dedupe.Policy{
			Pipeline: "p", Key: key, Semantics: dedupe.Strict, Rules: rules,
			Window: time.Minute, PendingTimeout: time.Second, FailedTTL: time.Minute,
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		headers := []dedupe.Header{{Key: "Idempotency-Key", Value: []byte("k-1")}}
		p := d.Prepare(&dedupe.Record{Value: avro, Headers: headers})
		if p.Err != nil || p.Fingerprint != want || p.RulesDigest != d.Canonicalizer().RulesDigest() {
			t.Fatalf("%s: %+v, want fingerprint %s", key.From, p, want)
		}
		if p.Key == "" {
			t.Fatalf("%s: no key", key.From)
		}
		bad := d.Prepare(&dedupe.Record{Value: avro[:len(avro)-1], Headers: headers})
		if dedupe.ReasonOf(bad.Err) != dedupe.ReasonOf(&dedupe.SchemaError{Err: dedupe.ErrMalformedPayload}) || bad.Fingerprint != "" {
			t.Fatalf("%s: truncated record: %+v", key.From, bad)
		}
	}
}
