package decode

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
)

// everythingSchema has a field of every Avro type, and logical types a
// producer adds without the mapping knowing them (read as their
// underlying type).
const everythingSchema = `{"type":"record","name":"Everything","namespace":"shop.v1","fields":[
 {"name":"n","type":"null"},
 {"name":"flag","type":"boolean"},
 {"name":"i","type":"int"},
 {"name":"l","type":"long"},
 {"name":"f","type":"float"},
 {"name":"d","type":"double"},
 {"name":"raw","type":"bytes"},
 {"name":"s","type":"string"},
 {"name":"inner","type":{"type":"record","name":"Inner","fields":[{"name":"k","type":"string"},{"name":"v","type":"int"}]}},
 {"name":"color","type":{"type":"enum","name":"Color","symbols":["RED","GREEN","BLUE"]}},
 {"name":"longs","type":{"type":"array","items":"long"}},
 {"name":"prices","type":{"type":"map","values":"double"}},
 {"name":"note","type":["null","string"]},
 {"name":"count","type":["long","null"]},
 {"name":"choice","type":["null","int","string","Inner",{"type":"fixed","name":"Tag","size":2},"bytes","Color",
   {"type":"array","items":"int"},{"type":"map","values":"string"}]},
 {"name":"hash","type":{"type":"fixed","name":"Hash","size":4}},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":20,"scale":4}},
 {"name":"price","type":{"type":"fixed","name":"Money","size":8,"logicalType":"decimal","precision":18,"scale":2}},
 {"name":"grid","type":{"type":"array","items":{"type":"array","items":"Inner"}}},
 {"name":"channel","type":"string","default":"web"},
 {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"id","type":{"type":"string","logicalType":"uuid"}}]}`

// javaField is a field's value in Avro's JSON encoding (what Java reads:
// a union as {"branch": value}, bytes and fixed as one \u00XX a byte)
// and in the mapping (what the decoder must write), both written by hand.
type javaField struct{ name, in, want string }

var everythingBase = []javaField{
	{"n", `null`, `null`},
	{"flag", `true`, `true`},
	{"i", `42`, `42`},
	{"l", `1700000000000`, `1700000000000`},
	{"f", `1.5`, `1.5`},
	{"d", `0.1`, `0.1`},
	{"raw", `"\u0000\u00ff"`, `"AP8="`},
	{"s", `"plain"`, `"plain"`},
	{"inner", `{"k":"a","v":1}`, `{"k":"a","v":1}`},
	{"color", `"GREEN"`, `"GREEN"`},
	{"longs", `[1,2,3]`, `[1,2,3]`},
	{"prices", `{"a":1.25}`, `{"a":1.25}`},
	{"note", `null`, `null`},
	{"count", `{"long":7}`, `7`},
	{"choice", `null`, `null`},
	{"hash", `"\u00de\u00ad\u00be\u00ef"`, `"3q2+7w=="`},
	{"amount", `"\u0007\u00a1\u0020"`, `50.0000`}, // 500000
	{"price", `"\u0000\u0000\u0000\u0000\u0000\u0000\u0007\u00cf"`, `19.99`},
	{"grid", `[[{"k":"x","v":1}],[]]`, `[[{"k":"x","v":1}],[]]`},
	{"channel", `"web"`, `"web"`},
	{"ts", `1700000000123`, `1700000000123`},
	{"id", `"6f1c2b9e-3d4a-4c5b-8e7f-0a1b2c3d4e5f"`, `"6f1c2b9e-3d4a-4c5b-8e7f-0a1b2c3d4e5f"`},
}

// everythingRecords are the base record with some fields changed; each
// record's input and expected output.
func everythingRecords() (in, want []string) {
	cases := [][]javaField{
		nil,
		{{"i", `-2147483648`, `-2147483648`}, {"l", `-9223372036854775808`, `-9223372036854775808`}, {"count", `null`, `null`}},
		{{"i", `2147483647`, `2147483647`}, {"l", `9223372036854775807`, `9223372036854775807`}, {"flag", `false`, `false`}},
		{{"f", `3.4028235e38`, `3.4028235e38`}, {"d", `4.9e-324`, `5e-324`}, {"choice", `{"int":-5}`, `{"int":-5}`}},
		{{"f", `0.1`, `0.1`}, {"d", `-0.0`, `0`}, {"choice", `{"string":"\u0000\"x\"\\"}`, `{"string":"\u0000\"x\"\\"}`}},
		{
			{"s", `"Zoë \u2028 日本語 🎉 \"q\" \\ \u0000\u001f\t\n\u007f"`, `"Zoë \u2028 日本語 🎉 \"q\" \\ \u0000\u001f\t\n\u007f"`},
			{"raw", `"\u0000\u0001\u007f\u0080\u00ff"`, `"AAF/gP8="`}, {"note", `{"string":""}`, `""`},
			{"choice", `{"shop.v1.Inner":{"k":"é","v":-1}}`, `{"shop.v1.Inner":{"k":"é","v":-1}}`},
		},
		{
			{"amount", `"\u00ff"`, `-0.0001`}, {"price", `"\u00ff\u00ff\u00ff\u00ff\u00ff\u00ff\u00cf\u00c7"`, `-123.45`},
			{"choice", `{"shop.v1.Tag":"\u0000\u00ff"}`, `{"shop.v1.Tag":"AP8="}`}, {"note", `{"string":"n"}`, `"n"`},
		},
		{
			// 2^64 needs nine bytes: the decimal no int64 holds.
			{"amount", `"\u0001\u0000\u0000\u0000\u0000\u0000\u0000\u0000\u0000"`, `1844674407370955.1616`},
			{"price", `"\u007f\u00ff\u00ff\u00ff\u00ff\u00ff\u00ff\u00ff"`, `92233720368547758.07`},
			{"choice", `{"bytes":""}`, `{"bytes":""}`}, {"color", `"RED"`, `"RED"`},
		},
		{
			{"amount", `""`, `0.0000`}, {"choice", `{"shop.v1.Color":"BLUE"}`, `{"shop.v1.Color":"BLUE"}`},
			{"grid", `[[],[{"k":"p","v":2},{"k":"q","v":3}],[{"k":"r","v":4}]]`, `[[],[{"k":"p","v":2},{"k":"q","v":3}],[{"k":"r","v":4}]]`},
			{"longs", `[]`, `[]`}, {"prices", `{}`, `{}`},
		},
		{
			{"choice", `{"array":[1,-1,0]}`, `{"array":[1,-1,0]}`}, {"channel", `"app"`, `"app"`},
			{"prices", `{"z":-1e300,"é":2.5e-8,"":0,"a\"b":1}`, `{"z":-1e300,"é":2.5e-8,"":0,"a\"b":1}`},
		},
		{{"choice", `{"map":{"k":"v","":"\u2028"}}`, `{"map":{"k":"v","":"\u2028"}}`}, {"d", `1e308`, `1e308`}},
	}
	for _, c := range cases {
		fields := append([]javaField(nil), everythingBase...)
		for _, o := range c {
			for i := range fields {
				if fields[i].name == o.name {
					fields[i] = o
				}
			}
		}
		var i, w strings.Builder
		for n, f := range fields {
			sep := map[bool]string{true: "{", false: ","}[n == 0]
			fmt.Fprintf(&i, `%s"%s":%s`, sep, f.name, f.in)
			fmt.Fprintf(&w, `%s"%s":%s`, sep, f.name, f.want)
		}
		in, want = append(in, i.String()+"}"), append(want, w.String()+"}")
	}
	return in, want
}

// TestAvroJavaEncoded decodes records that Apache Avro's Java library
// wrote, what real producers send, and compares them with the mapping's
// values written by hand.
func TestAvroJavaEncoded(t *testing.T) {
	in, want := everythingRecords()
	const id = 0x01020304
	framed := testenv.JavaAvro(t, everythingSchema, id, in...)
	dec := openSchemaFile(t, everythingSchema)
	for i, b := range framed {
		if len(b) < 5 || b[0] != 0 || binary.BigEndian.Uint32(b[1:5]) != id {
			t.Fatalf("record %d: no wire-format header: % x", i, b[:min(len(b), 5)])
		}
		got, err := dec.AppendJSON(nil, b[5:])
		if err != nil {
			t.Fatalf("record %d: %v\n% x", i, err, b)
		}
		if !sameJSON(t, got, []byte(want[i])) {
			t.Errorf("record %d:\ngot  %s\nwant %s", i, got, want[i])
		}
		canonical(t, got)
	}
}

// A number beyond a double's or a float's range is an infinity in Java's
// bytes; the mapping has no number for it.
func TestAvroJavaInfinity(t *testing.T) {
	schema := `{"type":"record","name":"R","fields":[{"name":"d","type":"double"},{"name":"f","type":"float"}]}`
	framed := testenv.JavaAvro(t, schema, 1, `{"d":1e309,"f":1}`, `{"d":1,"f":-1e39}`)
	dec := openSchemaFile(t, schema)
	for i, b := range framed {
		if _, err := dec.AppendJSON(nil, b[5:]); !errors.Is(err, dedupe.ErrNonFiniteNumber) {
			t.Errorf("record %d: got %v", i, err)
		}
	}
}

// Java's records read through a reader schema of the next version: a
// field dropped (skipped in the bytes), one added with a default, an int
// and a float promoted.
func TestAvroJavaEncodedEvolved(t *testing.T) {
	in, _ := everythingRecords()
	framed := testenv.JavaAvro(t, everythingSchema, 1, in[0])
	reader := strings.NewReplacer(
		` {"name":"n","type":"null"},`, ``,
		`{"name":"i","type":"int"}`, `{"name":"i","type":"long"}`,
		`{"name":"f","type":"float"}`, `{"name":"f","type":"double"}`,
		` {"name":"grid",`, ` {"name":"added","type":{"type":"map","values":"long"},"default":{"z":1}},{"name":"grid_old","aliases":["grid"],`,
		`{"name":"color","type":{"type":"enum","name":"Color","symbols":["RED","GREEN","BLUE"]}}`, `{"name":"color","type":"Color"}`,
		`{"name":"inner","type":{`, `{"name":"color0","type":{"type":"enum","name":"Color","symbols":["RED","GREEN","BLUE","GOLD"]},"default":"GOLD"},{"name":"inner","type":{`,
	).Replace(everythingSchema)
	got, err := appendAvroJSON(nil, mustAvro(t, everythingSchema, reader), framed[0][5:])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"flag":true,"i":42,"l":1700000000000,"f":1.5,"d":0.1,"raw":"AP8=","s":"plain",` +
		`"inner":{"k":"a","v":1},"color":"GREEN","longs":[1,2,3],"prices":{"a":1.25},"note":null,"count":7,` +
		`"choice":null,"hash":"3q2+7w==","amount":50.0000,"price":19.99,"grid_old":[[{"k":"x","v":1}],[]],` +
		`"channel":"web","ts":1700000000123,"id":"6f1c2b9e-3d4a-4c5b-8e7f-0a1b2c3d4e5f","color0":"GOLD","added":{"z":1}}`
	if !sameJSON(t, got, []byte(want)) {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// openSchemaFile opens a Decoder of unframed Avro of one local schema.
func openSchemaFile(t testing.TB, schema string) *Decoder {
	t.Helper()
	path := filepath.Join(t.TempDir(), "schema.avsc")
	if err := os.WriteFile(path, []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Open(context.Background(), Options{Format: dedupe.PayloadAvro, SchemaFile: path})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// sameJSON compares two JSON texts as values: members in any order,
// numbers by exact decimal value (1.5 and 1.50 are equal, 0.1 and
// 0.10000000149011612 are not).
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	return jsonValueEqual(parseJSONNumbers(t, a), parseJSONNumbers(t, b))
}

func parseJSONNumbers(t *testing.T, text []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%v: %s", err, text)
	}
	return v
}

func jsonValueEqual(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		b, ok := b.(json.Number)
		x, okx := new(big.Rat).SetString(string(a))
		y, oky := new(big.Rat).SetString(string(b))
		return ok && okx && oky && x.Cmp(y) == 0
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !jsonValueEqual(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !jsonValueEqual(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}
