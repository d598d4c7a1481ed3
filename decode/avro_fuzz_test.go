package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemstream/idemstream/dedupe"
)

// avroNodeSchema is recursive three ways: an array of itself, an optional
// itself, and itself as a tagged branch.
const avroNodeSchema = `{"type":"record","name":"Node","namespace":"t","fields":[
 {"name":"v","type":"long"},
 {"name":"kids","type":{"type":"array","items":"Node"}},
 {"name":"next","type":["null","Node"]},
 {"name":"alt","type":["null","string","Node"]}]}`

// avroMixSchema has a union of every kind of type, maps of arrays of
// optional records, and a decimal fixed.
const avroMixSchema = `{"type":"record","name":"Mix","fields":[
 {"name":"u","type":["null","boolean","int","long","float","double","bytes","string",
   {"type":"record","name":"P","fields":[{"name":"x","type":"int"}]},
   {"type":"enum","name":"E","symbols":["A","B"]},
   {"type":"fixed","name":"F","size":2},
   {"type":"array","items":"string"},
   {"type":"map","values":["null","double"]}]},
 {"name":"m","type":{"type":"map","values":{"type":"array","items":["null","P"]}}},
 {"name":"d","type":{"type":"fixed","name":"D","size":9,"logicalType":"decimal","precision":20,"scale":3}},
 {"name":"f","type":"float"}]}`

// claimReaderV2 reads claimV1's records through every kind of
// resolution: fields skipped (an array of records, a map, a union with a
// record branch), renamed, promoted, wrapped in a union, an enum symbol
// read as the default, fields added with defaults.
const claimReaderV2 = `{"type":"record","name":"Claim","namespace":"coupon.v2","fields":[
 {"name":"coupon_id","type":"long"},
 {"name":"user","aliases":["user_id"],"type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"channel","type":{"type":"enum","name":"Channel","symbols":["TV","APP","WEB"],"default":"APP"}},
 {"name":"sig","type":{"type":"fixed","name":"Sig","size":4}},
 {"name":"ratio","type":["null","double"]},
 {"name":"big","type":"double"},
 {"name":"small","type":"double"},
 {"name":"region","type":{"type":"record","name":"Region","fields":[{"name":"code","type":"string","default":"eu"}]},"default":{}},
 {"name":"tags","type":{"type":"array","items":"string"},"default":["a"]}]}`

// avroNodeSeed is {"v":1,"kids":[{"v":2,"kids":[],"next":null,"alt":null}],
// "next":{"v":3,"kids":[],"next":null,"alt":"x"},"alt":{"t.Node":{"v":4,...}}}.
func avroNodeSeed() []byte {
	leaf := func(e avroEnc, v int64) avroEnc { return e.long(v).long(0).long(0).long(0) }
	var e avroEnc
	e = leaf(e.long(1).long(1), 2).long(0)
	e = e.long(1).long(3).long(0).long(0).long(1).str("x")
	return leaf(e.long(2), 4)
}

func avroMixSeeds() []avroEnc {
	tail := func(e avroEnc) avroEnc {
		e = e.long(-1).long(7).str("k").long(2).long(0).long(1).long(8).long(0).long(0) // m
		e = e.raw(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0x0c)                 // d
		return e.float(-0.5)
	}
	return []avroEnc{
		tail(avroEnc{}.long(0)),
		tail(avroEnc{}.long(1).boolean(true)),
		tail(avroEnc{}.long(2).long(math.MinInt32)),
		tail(avroEnc{}.long(3).long(math.MinInt64)),
		tail(avroEnc{}.long(4).float(3.25)),
		tail(avroEnc{}.long(5).double(1e300)),
		tail(avroEnc{}.long(6).str("\x00\xff")),
		tail(avroEnc{}.long(7).str("é\"\\\n\u2028")),
		tail(avroEnc{}.long(8).long(9)),
		tail(avroEnc{}.long(9).long(1)),
		tail(avroEnc{}.long(10).raw(1, 2)),
		tail(avroEnc{}.long(11).long(2).str("a").str("b").long(0)),
		tail(avroEnc{}.long(12).long(2).str("a").long(0).str("b").long(1).double(2).long(0)),
	}
}

// avroFuzzProgs compiles the programs the fuzzers decode with.
func avroFuzzProgs(tb testing.TB) map[string]*avroProg {
	progs := map[string]*avroProg{}
	for name, s := range map[string][2]string{
		"claim":    {claimV1, claimV1},
		"claim-v2": {claimV1, claimReaderV2},
		"node":     {avroNodeSchema, avroNodeSchema},
		"mix":      {avroMixSchema, avroMixSchema},
	} {
		w, err := newAvroParser().parse(s[0])
		if err != nil {
			tb.Fatal(err)
		}
		r, err := newAvroParser().parse(s[1])
		if err != nil {
			tb.Fatal(err)
		}
		if progs[name], err = compileAvro(w, r); err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
	}
	return progs
}

// checkAvroDecode decodes data with p and checks what any decoding must
// be: an error wrapping one of the three sentinels, or JSON the
// canonicalizer accepts, the same whatever dst held, and no longer than
// the output limit allows (a value may pass it by its last item).
func checkAvroDecode(t *testing.T, canon *dedupe.Canonicalizer, name string, p *avroProg, data []byte) {
	t.Helper()
	out, err := appendAvroJSON(nil, p, data)
	if err != nil {
		if !errors.Is(err, dedupe.ErrMalformedPayload) && !errors.Is(err, dedupe.ErrNonFiniteNumber) &&
			!errors.Is(err, dedupe.ErrIncompatibleSchema) {
			t.Fatalf("%s: error without a sentinel: %v", name, err)
		}
		return
	}
	if !json.Valid(out) {
		t.Fatalf("%s: not JSON: %s", name, out)
	}
	if _, err := canon.AppendCanonical(nil, out); err != nil {
		t.Fatalf("%s: the canonicalizer refuses %s: %v", name, out, err)
	}
	if len(out) > 2*outputLimit(len(data)) {
		t.Fatalf("%s: %d bytes decode to %d", name, len(data), len(out))
	}
	again, err := appendAvroJSON([]byte("x"), p, data)
	if err != nil || !bytes.Equal(again[1:], out) {
		t.Fatalf("%s: two decodings differ: %v", name, err)
	}
}

// The seeds are records the decoders read; a seed that fails would leave
// the fuzzer mutating an error path.
func TestAvroFuzzSeedsDecode(t *testing.T) {
	progs := avroFuzzProgs(t)
	seeds := map[string][]byte{"claim": claimV1Bytes("t", 5000), "claim-v2": claimV1Bytes("t", 5000), "node": avroNodeSeed()}
	for i, s := range avroMixSeeds() {
		seeds["mix"] = s
		if _, err := appendAvroJSON(nil, progs["mix"], s); err != nil {
			t.Errorf("mix seed %d: %v", i, err)
		}
	}
	for name, data := range seeds {
		out, err := appendAvroJSON(nil, progs[name], data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %s", name, canonical(t, out))
	}
}

// FuzzAvroDecode decodes arbitrary bytes as a claim (read as written, and
// through an evolved reader), as a recursive node and as a record of
// unions, maps and arrays. A decoding never panics or hangs, and either
// fails with a sentinel or gives JSON the canonicalizer accepts.
func FuzzAvroDecode(f *testing.F) {
	progs := avroFuzzProgs(f)
	f.Add(claimV1Bytes("2026-12-05T10:00:00Z", 5000))
	f.Add(claimV1Bytes("", -1))
	f.Add(claimV1Bytes("t\x00\"\\\u00e9", 32767))
	f.Add(avroNodeSeed())
	for _, s := range avroMixSeeds() {
		f.Add([]byte(s))
	}
	f.Add([]byte{0x02, 0x80})
	canon, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for name, p := range progs {
			checkAvroDecode(t, canon, name, p, data)
		}
		checkJSONString(t, data)
	})
}

// appendJSONStringByByte is appendJSONString as it was before it read
// eight bytes at a time: the output of both must be the same bytes.
func appendJSONStringByByte(dst []byte, s []byte) ([]byte, bool) {
	dst = append(dst, '"')
	for _, r := range string(s) {
		switch {
		case r == utf8.RuneError && !utf8.Valid(s):
			return dst, false
		case r == '"' || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return append(dst, '"'), true
}

func checkJSONString(t *testing.T, s []byte) {
	t.Helper()
	got, err := appendJSONString(nil, s)
	want, ok := appendJSONStringByByte(nil, s)
	if ok != (err == nil) || (ok && !bytes.Equal(got, want)) {
		t.Fatalf("%q: got %s, %v; want %s", s, got, err, want)
	}
}

// Each kind of byte that needs attention, at every offset of strings
// longer and shorter than a step of eight.
func TestAppendJSONStringEveryOffset(t *testing.T) {
	for _, special := range []string{"\x00", "\x1f", "\"", "\\", "\x7f", "é", "\u2028", "🎉", "\xff", "\xe2\x80"} {
		for n := 0; n <= 20; n++ {
			for at := 0; at <= n; at++ {
				s := strings.Repeat("a", at) + special + strings.Repeat("b", n-at)
				checkJSONString(t, []byte(s))
			}
		}
	}
}

// FuzzAvroSchema parses arbitrary schema text, resolves it against itself
// and against the claim both ways, and decodes data with what compiles.
// Nothing panics; a schema that does not resolve is an incompatible one.
func FuzzAvroSchema(f *testing.F) {
	claim, err := newAvroParser().parse(claimV1)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(claimV1, claimV1Bytes("t", 1))
	f.Add(claimReaderV2, claimV1Bytes("t", 1))
	f.Add(avroNodeSchema, avroNodeSeed())
	f.Add(avroMixSchema, []byte(avroMixSeeds()[12]))
	f.Add(`["null","string",{"type":"array","items":{"type":"map","values":"long"}}]`, []byte{4, 2, 2, 2, 'k', 4, 0, 0})
	f.Add(`{"type":"record","name":"R","fields":[{"name":"a","type":{"type":"bytes","logicalType":"decimal","precision":4,"scale":4}},`+
		`{"name":"d","type":{"type":"map","values":["string","null"]},"default":{"k":"v"}}]}`, []byte{2, 0x80})
	f.Add(`{"type":"enum","name":"E","symbols":["A","B"],"default":"B"}`, []byte{2})
	f.Add(`"double"`, []byte{0, 0, 0, 0, 0, 0, 0xf0, 0x7f})
	canon, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string, data []byte) {
		s, err := newAvroParser().parse(text)
		if err != nil {
			return
		}
		s.describe(&bytes.Buffer{}, map[*avroSchema]bool{})
		for _, pair := range [][2]*avroSchema{{s, s}, {s, claim}, {claim, s}} {
			p, err := compileAvro(pair[0], pair[1])
			if err != nil {
				if !errors.Is(err, dedupe.ErrIncompatibleSchema) {
					t.Fatalf("compile: error without a sentinel: %v", err)
				}
				continue
			}
			checkAvroDecode(t, canon, "fuzzed schema", p, data)
		}
	})
}

// Each tagged union branch is an object of its own: a record nested 32
// times through one is 65 levels of JSON, one more than the canonicalizer
// reads, and must fail in the decoder, not pass it and fail later.
func TestAvroUnionTagsCountAsNesting(t *testing.T) {
	s := `{"type":"record","name":"N","fields":[{"name":"n","type":["null","string","N"]}]}`
	p := mustAvro(t, s, s)
	nested := func(levels int) []byte {
		var e avroEnc
		for range levels {
			e = e.long(2)
		}
		return e.long(0)
	}
	out, err := appendAvroJSON(nil, p, nested(31)) // 1 + 2×31 = 63 levels
	if err != nil {
		t.Fatal(err)
	}
	canonical(t, out)
	if _, err := appendAvroJSON(nil, p, nested(32)); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("65 levels: got %v", err)
	}
}

// A default's own nesting adds to the depth of the record it fills in.
func TestAvroDefaultsCountAsNesting(t *testing.T) {
	deep, def := `"long"`, `1`
	for range 10 {
		deep, def = `{"type":"array","items":`+deep+`}`, `[`+def+`]`
	}
	writer := `{"type":"record","name":"W","fields":[{"name":"n","type":["null","W"]}]}`
	reader := `{"type":"record","name":"W","fields":[{"name":"n","type":["null","W"]},{"name":"d","type":` + deep + `,"default":` + def + `}]}`
	p := mustAvro(t, writer, reader)
	nested := func(levels int) []byte {
		var e avroEnc
		for range levels - 1 {
			e = e.long(1)
		}
		return e.long(0)
	}
	out, err := appendAvroJSON(nil, p, nested(54)) // 54 + 10 levels
	if err != nil {
		t.Fatal(err)
	}
	canonical(t, out)
	if _, err := appendAvroJSON(nil, p, nested(55)); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("55 + 10 levels: got %v", err)
	}
}

// Skipped blocks nested in skipped blocks count their items against one
// bound: counted per block, a few kilobytes of arrays of arrays of nulls
// kept a decoder busy for minutes.
func TestAvroSkipCountsAcrossBlocks(t *testing.T) {
	writer := `{"type":"record","name":"R","fields":[{"name":"x","type":{"type":"array","items":{"type":"array","items":"null"}}}]}`
	p := mustAvro(t, writer, `{"type":"record","name":"R","fields":[]}`)
	e := avroEnc{}.long(2000)
	for range 2000 {
		e = e.long(60000).long(0) // under the bound, each of them
	}
	e = e.long(0)
	if _, err := appendAvroJSON(nil, p, e); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("got %v", err)
	}
}

// A writer union goes on past a branch the reader cannot read. That
// branch's record must not stay half compiled for the next field of the
// same type, which would then read the record without the reader's
// required field.
func TestAvroFailedBranchLeavesNoHalfProgram(t *testing.T) {
	a := `{"type":"record","name":"A","fields":[{"name":"x","type":"long"}%s]}`
	writer := `{"type":"record","name":"W","fields":[{"name":"u","type":["null",` + fmt.Sprintf(a, "") + `]},{"name":"a","type":"A"}]}`
	reader := `{"type":"record","name":"W","fields":[{"name":"u","type":["null",` + fmt.Sprintf(a, `,{"name":"y","type":"string"}`) + `]},{"name":"a","type":"A"}]}`
	w, err := newAvroParser().parse(writer)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newAvroParser().parse(reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compileAvro(w, r); !errors.Is(err, dedupe.ErrIncompatibleSchema) {
		t.Fatalf("got %v", err)
	}
	// A recursive record still resolves to a cycle, through a union branch
	// that fails beside it.
	node := `{"type":"record","name":"N","fields":[{"name":"v","type":"long"},{"name":"next","type":["null","N","boolean"]}%s]}`
	p := mustAvro(t, fmt.Sprintf(node, ""), fmt.Sprintf(strings.Replace(node, `"boolean"`, `"string"`, 1), `,{"name":"d","type":"int","default":7}`))
	out, err := appendAvroJSON(nil, p, avroEnc{}.long(1).long(1).long(2).long(0))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(canonical(t, out)); got != `{"d":7,"next":{"N":{"d":7,"next":null,"v":2}},"v":1}` {
		t.Fatalf("got %s", got)
	}
	if _, err := appendAvroJSON(nil, p, avroEnc{}.long(1).long(2).boolean(true)); !errors.Is(err, dedupe.ErrIncompatibleSchema) {
		t.Fatalf("boolean branch: got %v", err)
	}
}

func TestAvroMapRepeatsNoKey(t *testing.T) {
	p := mustAvro(t, `{"type":"map","values":"long"}`, `{"type":"map","values":"long"}`)
	keyed := func(keys ...string) avroEnc {
		e := avroEnc{}.long(int64(len(keys)))
		for i, k := range keys {
			e = e.str(k).long(int64(i))
		}
		return e.long(0)
	}
	many := strings.Split("a b c d e f g h i j k l m n o p q r s t", " ")
	for _, c := range []struct {
		name string
		data avroEnc
		ok   bool
	}{
		{"small", keyed("k", "j"), true},
		{"small, repeated", keyed("k", "j", "k"), false},
		{"large", keyed(many...), true},
		{"large, repeated late", keyed(append(many, "c")...), false},
		{"repeated across blocks", avroEnc{}.long(1).str("k").long(1).long(1).str("k").long(2).long(0), false},
	} {
		out, err := appendAvroJSON(nil, p, c.data)
		if c.ok && err == nil {
			canonical(t, out)
		} else if c.ok || !errors.Is(err, dedupe.ErrMalformedPayload) {
			t.Errorf("%s: got %v", c.name, err)
		}
	}
}

// An int is 32 bits however it is read; a long in its place is malformed.
func TestAvroIntOutOfRange(t *testing.T) {
	data := avroEnc{}.long(1 << 31)
	for _, reader := range []string{`"int"`, `"long"`, `"float"`, `"double"`} {
		if _, err := appendAvroJSON(nil, mustAvro(t, `"int"`, reader), data); !errors.Is(err, dedupe.ErrMalformedPayload) {
			t.Errorf("int read as %s: got %v", reader, err)
		}
	}
	if out, err := appendAvroJSON(nil, mustAvro(t, `"long"`, `"long"`), data); err != nil || string(out) != "2147483648" {
		t.Errorf("long: got %s, %v", out, err)
	}
}

// What a schema sets, and not the record, must not make a value huge: a
// decimal's scale, a default filled in from defaults of defaults.
func TestAvroSchemaDoesNotBlowUp(t *testing.T) {
	dec := `{"type":"bytes","logicalType":"decimal","precision":1073741824,"scale":536870912}`
	if _, err := appendAvroJSON(nil, mustAvro(t, dec, dec), avroEnc{}.str("\x01")); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("decimal: got %v", err)
	}
	w, err := newAvroParser().parse(`{"type":"record","name":"R0","fields":[]}`)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newAvroParser().parse(`{"type":"record","name":"R0","fields":[{"name":"d","type":` + dec + `,"default":"\u0001"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compileAvro(w, r); !errors.Is(err, dedupe.ErrIncompatibleSchema) {
		t.Fatalf("decimal default: got %v", err)
	}
	// R0 has two fields of R1, which has two of R2, ...: 2^40 leaves.
	var b strings.Builder
	b.WriteString(`{"type":"record","name":"R0","fields":[`)
	for i := 1; i < 40; i++ {
		fmt.Fprintf(&b, `{"name":"a","default":{},"type":{"type":"record","name":"R%d","fields":[`, i)
	}
	b.WriteString(`{"name":"z","type":"int","default":1}`)
	for i := 39; i >= 1; i-- {
		fmt.Fprintf(&b, `]}},{"name":"b","default":{},"type":"R%d"}`, i)
	}
	b.WriteString(`]}`)
	r, err = newAvroParser().parse(b.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compileAvro(w, r); !errors.Is(err, dedupe.ErrIncompatibleSchema) {
		t.Fatalf("defaults: got %v", err)
	}
}
