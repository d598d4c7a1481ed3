package decode

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
)

var updateAvroGolden = flag.Bool("update-avro", false, "rewrite the Avro golden files")

// avroEnc writes Avro binary by hand, so the tests do not check the
// decoder against an encoder built on the same reading of the spec.
type avroEnc []byte

func (e avroEnc) long(v int64) avroEnc {
	return binary.AppendUvarint(e, uint64(v<<1)^uint64(v>>63))
}
func (e avroEnc) str(s string) avroEnc   { return append(e.long(int64(len(s))), s...) }
func (e avroEnc) raw(b ...byte) avroEnc  { return append(e, b...) }
func (e avroEnc) boolean(b bool) avroEnc { return append(e, map[bool]byte{true: 1, false: 0}[b]) }
func (e avroEnc) double(f float64) avroEnc {
	return binary.LittleEndian.AppendUint64(e, math.Float64bits(f))
}
func (e avroEnc) float(f float32) avroEnc {
	return binary.LittleEndian.AppendUint32(e, math.Float32bits(f))
}

const claimV1 = `{"type":"record","name":"Claim","namespace":"coupon.v1","fields":[
 {"name":"coupon_id","type":"long"},
 {"name":"user_id","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":10,"scale":2}},
 {"name":"client_time","type":"string"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[
   {"name":"sku","type":"string"},{"name":"qty","type":"int"},{"name":"client_ts","type":"long"}]}}},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"channel","type":{"type":"enum","name":"Channel","symbols":["APP","WEB"],"default":"APP"}},
 {"name":"sig","type":{"type":"fixed","name":"Sig","size":4}},
 {"name":"attrs","type":{"type":"map","values":"string"}},
 {"name":"ratio","type":"double"},
 {"name":"target","type":["null","string","long","Item"]},
 {"name":"big","type":"long"},
 {"name":"small","type":"float"}
]}`

func claimV1Bytes(clientTime string, amountCents int64) []byte {
	var e avroEnc
	e = e.long(12345).str("u-1024")
	e = e.long(2).raw(byte(amountCents>>8), byte(amountCents)) // decimal bytes, two's complement
	e = e.str(clientTime)
	e = e.long(2).str("A-1").long(1).long(1700000000000).str("B-2").long(2).long(1700000000001).long(0)
	e = e.long(1).str("urgent")
	e = e.long(1)
	e = e.raw(0xde, 0xad, 0xbe, 0xef)
	e = e.long(-1).long(6).str("k").str("v\"q").long(0) // a block with its byte size
	e = e.double(0.1)
	e = e.long(3).str("A-9").long(7).long(-5)
	e = e.long(math.MaxInt64)
	e = e.float(1.1)
	return e
}

func mustAvro(t *testing.T, writer, reader string) *avroProg {
	t.Helper()
	w, err := newAvroParser().parse(writer)
	if err != nil {
		t.Fatal(err)
	}
	r := w
	if reader != writer {
		if r, err = newAvroParser().parse(reader); err != nil {
			t.Fatal(err)
		}
	}
	p, err := compileAvro(w, r)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAvroMapping(t *testing.T) {
	p := mustAvro(t, claimV1, claimV1)
	got, err := appendAvroJSON(nil, p, claimV1Bytes("2026-12-05T10:00:00Z", 5000))
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(got) {
		t.Fatalf("not JSON: %s", got)
	}
	want := `{"coupon_id":12345,"user_id":"u-1024","amount":50.00,"client_time":"2026-12-05T10:00:00Z",` +
		`"items":[{"sku":"A-1","qty":1,"client_ts":1700000000000},{"sku":"B-2","qty":2,"client_ts":1700000000001}],` +
		`"note":"urgent","channel":"WEB","sig":"3q2+7w==","attrs":{"k":"v\"q"},"ratio":0.1,` +
		`"target":{"coupon.v1.Item":{"sku":"A-9","qty":7,"client_ts":-5}},"big":9223372036854775807,"small":1.1}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	checkGolden(t, "claim-v1", canonical(t, got))
}

// canonical is the form a fingerprint is taken over: the mapping's output
// run through the JSON canonicalizer.
func canonical(t *testing.T, js []byte) []byte {
	t.Helper()
	c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.AppendCanonical(nil, js)
	if err != nil {
		t.Fatalf("canonicalize %s: %v", js, err)
	}
	return out
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenIn(t, "avro", name, got, *updateAvroGolden, "-update-avro")
}

// goldenIn compares got with testdata/DIR/NAME.golden, or writes it there
// with update: a canonical form that changes changes the fingerprint of
// every stored key.
func goldenIn(t *testing.T, dir, name string, got []byte, update bool, flagName string) {
	t.Helper()
	path := filepath.Join("testdata", dir, name+".golden")
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with %s to create it)", err, flagName)
	}
	if strings.TrimSuffix(string(want), "\n") != string(got) {
		t.Fatalf("canonical form changed: the fingerprint of every stored key would change\ngot  %s\nwant %s", got, want)
	}
}

func TestAvroUnionsAreInjective(t *testing.T) {
	schema := `{"type":"record","name":"R","fields":[{"name":"u","type":["null","string","bytes","long","double"]},{"name":"o","type":["long","null"]}]}`
	p := mustAvro(t, schema, schema)
	seen := map[string]string{}
	cases := map[string]avroEnc{
		"null":        avroEnc{}.long(0).long(1),
		"string 1":    avroEnc{}.long(1).str("1").long(1),
		"bytes 1":     avroEnc{}.long(2).str("1").long(1),
		"long 1":      avroEnc{}.long(3).long(1).long(1),
		"double 1":    avroEnc{}.long(4).double(1).long(1),
		"optional 0":  avroEnc{}.long(0).long(0).long(0),
		"optional 1":  avroEnc{}.long(0).long(0).long(1),
		"string null": avroEnc{}.long(1).str("null").long(1),
	}
	for name, data := range cases {
		js, err := appendAvroJSON(nil, p, data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c := string(canonical(t, js))
		if other, dup := seen[c]; dup {
			t.Fatalf("%s and %s share the canonical form %s", name, other, c)
		}
		seen[c] = name
	}
}

// A union's branches are told apart by their tags, so no two may share
// one: a record named like a kind of type beside that kind, or a named
// type that takes a primitive type's name, is refused with the schema.
func TestAvroUnionTagsAreDistinct(t *testing.T) {
	for name, schema := range map[string]string{
		"record named map": `[{"type":"map","values":"long"},{"type":"record","name":"map","fields":[{"name":"a","type":"long"}]}]`,
		"record named array": `{"type":"record","name":"R","fields":[{"name":"u","type":[{"type":"array","items":"long"},
			{"type":"record","name":"array","fields":[]}]}]}`,
		"enum named string": `["string",{"type":"enum","name":"string","symbols":["A"]}]`,
		"fixed named long":  `{"type":"fixed","name":"long","size":8}`,
	} {
		if _, err := newAvroParser().parse(schema); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	// The same names under a namespace are tagged with it.
	ok := `["string",{"type":"map","values":"long"},{"type":"record","name":"map","namespace":"x","fields":[]},
		{"type":"enum","name":"string","namespace":"x","symbols":["A"]}]`
	if _, err := newAvroParser().parse(ok); err != nil {
		t.Fatal(err)
	}
}

func TestAvroRefusesBadInput(t *testing.T) {
	p := mustAvro(t, claimV1, claimV1)
	good := claimV1Bytes("t", 5000)
	nan := `{"type":"record","name":"R","fields":[{"name":"d","type":"double"}]}`
	cases := []struct {
		name string
		prog *avroProg
		data []byte
		want error
	}{
		{"truncated", p, good[:len(good)-3], dedupe.ErrMalformedPayload},
		{"trailing bytes", p, append(append([]byte{}, good...), 0), dedupe.ErrMalformedPayload},
		{"empty", p, nil, dedupe.ErrMalformedPayload},
		{"negative length", p, avroEnc{}.long(1).long(-4), dedupe.ErrMalformedPayload},
		{"bad utf-8", p, avroEnc{}.long(1).str("\xff\xfe"), dedupe.ErrMalformedPayload},
		{"NaN", mustAvro(t, nan, nan), avroEnc{}.double(math.NaN()), dedupe.ErrNonFiniteNumber},
		{"infinity", mustAvro(t, nan, nan), avroEnc{}.double(math.Inf(-1)), dedupe.ErrNonFiniteNumber},
		{"varint too long", p, avroEnc{}.raw(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), dedupe.ErrMalformedPayload},
	}
	for _, c := range cases {
		_, err := appendAvroJSON(nil, c.prog, c.data)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

func TestAvroBillionNullsEnds(t *testing.T) {
	schema := `{"type":"array","items":"null"}`
	p := mustAvro(t, schema, schema)
	_, err := appendAvroJSON(nil, p, avroEnc{}.long(1<<40).long(0))
	if !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("got %v", err)
	}
	deep := `{"type":"record","name":"N","fields":[{"name":"n","type":["null","N"]}]}`
	var e avroEnc
	for range 100 {
		e = e.long(1)
	}
	e = e.long(0)
	if _, err := appendAvroJSON(nil, mustAvro(t, deep, deep), e); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("100 levels: got %v", err)
	}
}

// A reader's defaults grow every item of an array by what the writer did
// not send: a compatible reader must not make such a record too large to
// decode, as long as the text stays within outputLimit's floor.
func TestAvroDefaultsOnManyItemsDecode(t *testing.T) {
	writer := `{"type":"array","items":{"type":"record","name":"I","fields":[{"name":"q","type":"int"}]}}`
	reader := `{"type":"array","items":{"type":"record","name":"I","fields":[{"name":"q","type":"int"},
	 {"name":"meta","type":{"type":"record","name":"M","fields":[{"name":"a","type":"string"},{"name":"b","type":"string"},
	  {"name":"c","type":"string"},{"name":"d","type":"string"}]},
	  "default":{"a":"first default","b":"second default","c":"third default","d":"fourth default"}}]}}`
	e := avroEnc{}.long(5000)
	for i := range 5000 {
		e = e.long(int64(i % 50)) // a byte each
	}
	e = e.long(0)
	p := mustAvro(t, writer, reader)
	out, err := appendAvroJSON(nil, p, e)
	if err != nil {
		t.Fatalf("%d bytes of Avro: %v", len(e), err)
	}
	if len(out) <= 64*len(e)+1<<16 {
		t.Fatalf("the record decodes to %d bytes: no test of the limit", len(out))
	}
	if got, ok := appendAvroCanonical(nil, p, e, nil); !ok || string(got) != string(canonical(t, out)) {
		t.Fatalf("the canonical writer declined (%v) or differs", ok)
	}
}

// A producer's compatible new schema: a field added with a default, one
// with a default removed, fields reordered, a renamed field read through
// an alias, int widened to long. Records written under either version
// read the same through the reader.
func TestAvroEvolutionReadsTheSame(t *testing.T) {
	v1 := `{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"long"},{"name":"user","type":"string"},{"name":"qty","type":"int"},{"name":"legacy","type":"string","default":"x"}]}`
	v2 := `{"type":"record","name":"Claim","fields":[{"name":"qty","type":"long"},{"name":"user_id","type":"string","aliases":["user"]},{"name":"coupon_id","type":"long"},{"name":"channel","type":"string","default":"app"},{"name":"legacy","type":"string","default":"x"}]}`
	old := avroEnc{}.long(7).str("u-1").long(3).str("x")
	got, err := appendAvroJSON(nil, mustAvro(t, v1, v2), old)
	if err != nil {
		t.Fatal(err)
	}
	v3 := `{"type":"record","name":"Claim","fields":[{"name":"qty","type":"long"},{"name":"user_id","type":"string"},{"name":"coupon_id","type":"long"},{"name":"channel","type":"string","default":"app"}]}`
	fresh := avroEnc{}.long(3).str("u-1").long(7).str("app")
	again, err := appendAvroJSON(nil, mustAvro(t, v3, v2), fresh)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := canonical(t, got), canonical(t, again); string(a) != string(b) {
		t.Fatalf("old %s\nnew %s", a, b)
	}
	if string(canonical(t, got)) != `{"channel":"app","coupon_id":7,"legacy":"x","qty":3,"user_id":"u-1"}` {
		t.Fatalf("got %s", canonical(t, got))
	}
}

func TestAvroIncompatibleSchemas(t *testing.T) {
	reader := `{"type":"record","name":"Claim","fields":[{"name":"amount","type":"long"},{"name":"must","type":"string"}]}`
	for name, writer := range map[string]string{
		"no default":   `{"type":"record","name":"Claim","fields":[{"name":"amount","type":"long"}]}`,
		"narrowing":    `{"type":"record","name":"Claim","fields":[{"name":"amount","type":"double"},{"name":"must","type":"string"}]}`,
		"other record": `{"type":"record","name":"Order","fields":[{"name":"amount","type":"long"},{"name":"must","type":"string"}]}`,
	} {
		w, err := newAvroParser().parse(writer)
		if err != nil {
			t.Fatal(err)
		}
		r, _ := newAvroParser().parse(reader)
		if _, err := compileAvro(w, r); !errors.Is(err, dedupe.ErrIncompatibleSchema) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// A writer whose two fields are one reader field (one by name, one by an
// alias) would write that member twice for every record: the schemas do
// not resolve. A rename that keeps the old name as a field of its own
// does: the writer's old field is the new one, the reader's old one
// takes its default, as Avro's Java library reads it.
func TestAvroTwoWriterFieldsForOneReaderField(t *testing.T) {
	reader := `{"type":"record","name":"R","fields":[{"name":"a","type":"long","aliases":["b"],"default":0},{"name":"b","type":"long","default":0}]}`
	r, err := newAvroParser().parse(reader)
	if err != nil {
		t.Fatal(err)
	}
	both, err := newAvroParser().parse(`{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":"long"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compileAvro(both, r); !errors.Is(err, dedupe.ErrIncompatibleSchema) {
		t.Fatalf("a and b both read as a: got %v", err)
	}
	old := `{"type":"record","name":"R","fields":[{"name":"b","type":"long"}]}`
	got, err := appendAvroJSON(nil, mustAvro(t, old, reader), avroEnc{}.long(7))
	if err != nil || string(canonical(t, got)) != `{"a":7,"b":0}` {
		t.Fatalf("the renamed field: %s %v", got, err)
	}
}

func TestAvroDecimalsAndDefaults(t *testing.T) {
	for _, c := range []struct {
		b     []byte
		scale int
		want  string
	}{
		{[]byte{0x13, 0x88}, 2, "50.00"},
		{[]byte{0xff}, 2, "-0.01"},
		{[]byte{0x80, 0, 0, 0, 0, 0, 0, 0}, 0, "-9223372036854775808"},
		{[]byte{0x01, 0, 0, 0, 0, 0, 0, 0, 0}, 3, "18446744073709551.616"},
		{[]byte{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0, "-18446744073709551617"},
		{nil, 2, "0.00"},
	} {
		if got := string(appendDecimal(nil, c.b, c.scale)); got != c.want {
			t.Errorf("% x scale %d: got %s, want %s", c.b, c.scale, got, c.want)
		}
	}
	reader := `{"type":"record","name":"R","fields":[
	 {"name":"b","type":"bytes","default":"\u00ff\u0001"},
	 {"name":"u","type":["string","null"],"default":"hi"},
	 {"name":"m","type":{"type":"map","values":"long"},"default":{"b":2,"a":1}},
	 {"name":"r","type":{"type":"record","name":"In","fields":[{"name":"x","type":"int","default":4}]},"default":{}}]}`
	writer := `{"type":"record","name":"R","fields":[]}`
	got, err := appendAvroJSON(nil, mustAvro(t, writer, reader), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := string(canonical(t, got)); c != `{"b":"/wE=","m":{"a":1,"b":2},"r":{"x":4},"u":"hi"}` {
		t.Fatalf("got %s", c)
	}
}

// TestAvroReadsNeverMergeTwoValues: resolutions that Avro allows but that
// would make two requests one are refused or kept exact.
func TestAvroReadsNeverMergeTwoValues(t *testing.T) {
	w := `{"type":"record","name":"R","fields":[{"name":"n","type":"long"},{"name":"e","type":{"type":"enum","name":"E","symbols":["A","B","C"]}}]}`
	r := `{"type":"record","name":"R","fields":[{"name":"n","type":"double"},{"name":"e","type":{"type":"enum","name":"E","symbols":["A"],"default":"A"}}]}`
	p := mustAvro(t, w, r)
	a, err := appendAvroJSON(nil, p, avroEnc{}.long(1<<53+1).long(0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := appendAvroJSON(nil, p, avroEnc{}.long(1<<53).long(0))
	if err != nil {
		t.Fatal(err)
	}
	if string(canonical(t, a)) == string(canonical(t, b)) {
		t.Fatalf("2^53+1 and 2^53 read as one double: %s", a)
	}
	for _, sym := range []int64{1, 2} {
		if _, err := appendAvroJSON(nil, p, avroEnc{}.long(1).long(sym)); !errors.Is(err, dedupe.ErrIncompatibleSchema) {
			t.Errorf("symbol %d that the reader lacks: %v, want incompatible, not the default", sym, err)
		}
	}
}
