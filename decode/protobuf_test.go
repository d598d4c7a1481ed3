package decode

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemstream/idemstream/dedupe"
)

var updateProtoGolden = flag.Bool("update-proto", false, "rewrite the Protobuf golden files")

const pbClaimProto = `syntax = "proto3";
package coupon.v1;

import "google/protobuf/timestamp.proto";
import "coupon/v1/item.proto";

message Claim {
  string coupon_id = 1;
  string user_id = 2;
  int64 amount = 3;
  string client_time = 4;
  int32 retry_count = 5;
  string trace_id = 6;
  repeated Item items = 7;
  map<string, string> attributes = 8;
  optional string note = 9;
  google.protobuf.Timestamp issued_at = 10;
  Channel channel = 11;
  bytes signature = 12;
  double ratio = 13;
  oneof target {
    string store_id = 14;
    uint64 region_id = 15;
  }
  map<int64, string> tags = 16;
  uint64 big = 17;
  sint64 delta = 18;
  repeated int64 codes = 19;
  float weight = 20;

  enum Channel {
    CHANNEL_UNSPECIFIED = 0;
    APP = 1;
    WEB = 2;
  }
}
`

const pbItemProto = `syntax = "proto3";
package coupon.v1;

message Item {
  string sku = 1;
  int32 qty = 2;
  string client_ts = 3;
}
`

// pbEventsProto has nested messages for the message-index tests.
const pbEventsProto = `syntax = "proto3";
package coupon.v1;

message Ping {}

message Envelope {
  message Inner { string x = 1; }
  Inner inner = 1;
  map<string, int32> counts = 2;
  message Second { Inner inner = 1; }
}
`

// pbLegacyProto is proto2: groups, closed enums, required fields, explicit
// presence everywhere, every scalar kind, and a recursive message.
const pbLegacyProto = `syntax = "proto2";
package legacy;

enum Kind {
  KIND_Z = 0;
  KIND_A = 1;
  KIND_B = 2;
}

message Node {
  optional int32 v = 1;
  optional Node child = 2;
  repeated Node kids = 3;
  optional group Extra = 4 {
    optional string note = 1;
    repeated int32 nums = 2;
  }
  optional string label = 5 [default = "x"];
  required int64 id = 6;
  optional Kind kind = 7;
  repeated sint32 packed = 8 [packed = true];
  map<bool, Node> flags = 9;
  repeated fixed64 fx = 10;
  optional sfixed32 sf = 11;
  optional fixed32 f32 = 12;
  optional uint32 u32 = 13;
  optional bool ok = 14;
  optional bytes raw = 15;
  oneof pick {
    Node left = 16;
    string right = 17;
  }
  map<uint32, string> names = 18;
  map<sfixed64, Kind> kinds = 19;
  optional sint32 s32 = 20;
  optional sfixed64 sf64 = 21;
  optional uint64 u64 = 22;
  optional double d = 23;
}
`

func pbSources() map[string]string {
	return map[string]string{
		"coupon/v1/claim.proto":  pbClaimProto,
		"coupon/v1/item.proto":   pbItemProto,
		"coupon/v1/events.proto": pbEventsProto,
		"legacy/node.proto":      pbLegacyProto,
	}
}

func pbCompile(t testing.TB, main string, sources map[string]string) *protoSchema {
	t.Helper()
	s, err := compileProto(main, sources)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pbMessage(t testing.TB, s *protoSchema, name string) protoreflect.MessageDescriptor {
	t.Helper()
	md, ok := s.messageByName(protoreflect.FullName(name))
	if !ok {
		t.Fatalf("no message %s", name)
	}
	return md
}

func pbClaimMD(t testing.TB) protoreflect.MessageDescriptor {
	return pbMessage(t, pbCompile(t, "coupon/v1/claim.proto", pbSources()), "coupon.v1.Claim")
}

// pbSet sets the fields of m from name/value pairs. A value is a Go scalar
// (converted to the field's kind), a []any for a list, a map[any]any for a
// map, a func(protoreflect.Message) for a message, or a protoreflect.Value.
func pbSet(m protoreflect.Message, kv ...any) protoreflect.Message {
	for i := 0; i < len(kv); i += 2 {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(kv[i].(string)))
		if fd == nil {
			panic("no field " + kv[i].(string))
		}
		switch v := kv[i+1].(type) {
		case []any:
			l := m.Mutable(fd).List()
			for _, e := range v {
				l.Append(pbValue(fd, e, l.NewElement))
			}
		case map[any]any:
			mp := m.Mutable(fd).Map()
			for k, e := range v {
				mp.Set(pbValue(fd.MapKey(), k, nil).MapKey(), pbValue(fd.MapValue(), e, mp.NewValue))
			}
		default:
			m.Set(fd, pbValue(fd, v, func() protoreflect.Value { return m.NewField(fd) }))
		}
	}
	return m
}

func pbValue(fd protoreflect.FieldDescriptor, v any, newMsg func() protoreflect.Value) protoreflect.Value {
	switch v := v.(type) {
	case protoreflect.Value:
		return v
	case func(protoreflect.Message):
		nv := newMsg()
		v(nv.Message())
		return nv
	case int:
		switch fd.Kind() {
		case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
			return protoreflect.ValueOfInt32(int32(v))
		case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
			return protoreflect.ValueOfUint32(uint32(v))
		case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
			return protoreflect.ValueOfUint64(uint64(v))
		case protoreflect.EnumKind:
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(v))
		case protoreflect.FloatKind:
			return protoreflect.ValueOfFloat32(float32(v))
		case protoreflect.DoubleKind:
			return protoreflect.ValueOfFloat64(float64(v))
		}
		return protoreflect.ValueOfInt64(int64(v))
	case float64:
		if fd.Kind() == protoreflect.FloatKind {
			return protoreflect.ValueOfFloat32(float32(v))
		}
	}
	return protoreflect.ValueOf(v)
}

func pbNew(md protoreflect.MessageDescriptor, kv ...any) protoreflect.Message {
	return pbSet(dynamicpb.NewMessage(md), kv...)
}

func pbMarshal(t testing.TB, m protoreflect.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(m.Interface())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pbDecode(t testing.TB, md protoreflect.MessageDescriptor, data []byte) []byte {
	t.Helper()
	out, err := appendProtoJSON(nil, md, data)
	if err != nil {
		t.Fatalf("decode %x: %v", data, err)
	}
	if !json.Valid(out) {
		t.Fatalf("not JSON: %s", out)
	}
	return out
}

// pbJSONEqual compares JSON texts as values, numbers by their literal
// text, so that 64-bit values are compared exactly.
func pbJSONEqual(t testing.TB, got []byte, want string) {
	t.Helper()
	parse := func(b []byte) any {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("parse %s: %v", b, err)
		}
		return v
	}
	if g, w := parse(got), parse([]byte(want)); !reflect.DeepEqual(g, w) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// pbCanonical is what a fingerprint is taken over: the output run through
// the JSON canonicalizer.
func pbCanonical(t testing.TB, js []byte) []byte {
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

// pbClaimDefaults is the JSON of an empty Claim: every implicit-presence
// field with its default, no explicit-presence field.
const pbClaimDefaults = `"coupon_id":"","user_id":"","amount":0,"client_time":"","retry_count":0,"trace_id":"",` +
	`"items":[],"attributes":{},"channel":"CHANNEL_UNSPECIFIED","signature":"","ratio":0,"tags":{},` +
	`"big":0,"delta":0,"codes":[],"weight":0`

// pbClaimWith is the JSON of a Claim whose fields are the defaults but for
// the members in over (a JSON object's members, without braces).
func pbClaimWith(over string) string { return pbWith(pbClaimDefaults, over) }

// pbNodeDefaults are the members of an empty legacy.Node: its repeated
// fields and maps.
const pbNodeDefaults = `"kids":[],"packed":[],"flags":{},"fx":[],"names":{},"kinds":{}`

func pbNodeWith(over string) string { return pbWith(pbNodeDefaults, over) }

// pbWith is the JSON object of the members defaults, replaced or joined by
// the members over.
func pbWith(defaults, over string) string {
	var base, ov map[string]json.RawMessage
	if err := json.Unmarshal([]byte("{"+defaults+"}"), &base); err != nil {
		panic(err)
	}
	if err := json.Unmarshal([]byte("{"+over+"}"), &ov); err != nil {
		panic(err)
	}
	for k, v := range ov {
		base[k] = v
	}
	b, err := json.Marshal(base)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func pbItem(sku string, qty int) func(protoreflect.Message) {
	return func(m protoreflect.Message) { pbSet(m, "sku", sku, "qty", qty) }
}

func TestProtoMapping(t *testing.T) {
	md := pbClaimMD(t)
	cases := []struct {
		name string
		kv   []any
		want string // members over the defaults
	}{
		{"empty", nil, ``},
		{"scalars", []any{"coupon_id", "C-1", "user_id", "u\"1\\\n\x01é", "amount", 1250, "retry_count", -3,
			"ratio", 0.25, "weight", 1e6, "channel", 2},
			`"coupon_id":"C-1","user_id":"u\"1\\\n\u0001é","amount":1250,"retry_count":-3,"ratio":0.25,` +
				`"weight":1e+06,"channel":"WEB"`},
		{"optional present and empty", []any{"note", ""}, `"note":""`},
		{"optional present", []any{"note", "hi"}, `"note":"hi"`},
		{"oneof string", []any{"store_id", "S-9"}, `"store_id":"S-9"`},
		{"oneof zero", []any{"region_id", 0}, `"region_id":0`},
		{"64-bit extremes", []any{"big", uint64(math.MaxUint64), "amount", int64(math.MinInt64),
			"delta", int64(math.MinInt64), "region_id", uint64(math.MaxUint64)},
			`"big":18446744073709551615,"amount":-9223372036854775808,"delta":-9223372036854775808,` +
				`"region_id":18446744073709551615`},
		{"64-bit max", []any{"amount", int64(math.MaxInt64), "delta", int64(math.MaxInt64)},
			`"amount":9223372036854775807,"delta":9223372036854775807`},
		{"enum unknown number", []any{"channel", 7}, `"channel":7`},
		{"enum negative number", []any{"channel", -2}, `"channel":-2`},
		{"bytes", []any{"signature", []byte{0xff, 0, 0x10}}, `"signature":"/wAQ"`},
		{"nested", []any{"items", []any{pbItem("A-1", 2), pbItem("", 0)},
			"issued_at", func(m protoreflect.Message) { pbSet(m, "seconds", 1700000000, "nanos", 5) }},
			`"items":[{"sku":"A-1","qty":2,"client_ts":""},{"sku":"","qty":0,"client_ts":""}],` +
				`"issued_at":{"seconds":1700000000,"nanos":5}`},
		{"empty nested message", []any{"issued_at", func(protoreflect.Message) {}},
			`"issued_at":{"seconds":0,"nanos":0}`},
		{"maps", []any{"attributes", map[any]any{"k": "v", "": "empty", "a/b~": "x"},
			"tags", map[any]any{int64(-5): "neg", int64(0): "zero", int64(math.MaxInt64): "max"}},
			`"attributes":{"k":"v","":"empty","a/b~":"x"},` +
				`"tags":{"-5":"neg","0":"zero","9223372036854775807":"max"}`},
		{"repeated", []any{"codes", []any{int64(3), int64(-1), int64(0)}}, `"codes":[3,-1,0]`},
		{"negative zero", []any{"ratio", math.Copysign(0, -1)}, `"ratio":-0`},
		{"smallest double", []any{"ratio", math.SmallestNonzeroFloat64}, `"ratio":5e-324`},
		{"float32 precision", []any{"weight", 0.1}, `"weight":0.1`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := pbDecode(t, md, pbMarshal(t, pbNew(md, c.kv...)))
			pbJSONEqual(t, got, pbClaimWith(c.want))
			pbCanonical(t, got)
		})
	}
}

// TestProtoPresence: absent and default are one request for implicit
// presence, two for explicit presence.
func TestProtoPresence(t *testing.T) {
	md := pbClaimMD(t)
	dec := func(kv ...any) string { return string(pbCanonical(t, pbDecode(t, md, pbMarshal(t, pbNew(md, kv...))))) }
	if dec() != dec("amount", 0, "coupon_id", "", "channel", 0) {
		t.Error("an implicit field set to its default differs from the field absent")
	}
	// Some encoders write implicit defaults anyway.
	explicit := protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 0)
	if string(pbCanonical(t, pbDecode(t, md, explicit))) != dec() {
		t.Error("an implicit default written on the wire differs from the field absent")
	}
	pairs := [][2][]any{
		{{}, {"note", ""}},
		{{}, {"issued_at", func(protoreflect.Message) {}}},
		{{}, {"store_id", ""}},
		{{"store_id", ""}, {"region_id", 0}},
		{{"ratio", 0.0}, {"ratio", math.SmallestNonzeroFloat64}},
		{{"channel", 0}, {"channel", 3}},
		{{"codes", []any{}}, {"codes", []any{int64(0)}}},
		{{"attributes", map[any]any{}}, {"attributes", map[any]any{"": ""}}},
	}
	for _, p := range pairs {
		if a, b := dec(p[0]...), dec(p[1]...); a == b {
			t.Errorf("%v and %v give one JSON: %s", p[0], p[1], a)
		}
	}
}

// pbField appends a tag and a value of the wire type the value's Go type
// names: uint64 varint, uint32 fixed32, pbFixed64 fixed64, []byte or string
// length-delimited.
type pbFixed64 uint64

func pbField(b []byte, num protowire.Number, v any) []byte {
	switch v := v.(type) {
	case uint64:
		return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
	case uint32:
		return protowire.AppendFixed32(protowire.AppendTag(b, num, protowire.Fixed32Type), v)
	case pbFixed64:
		return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), uint64(v))
	case string:
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
	case []byte:
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	panic(fmt.Sprintf("pbField %T", v))
}

func pbFields(kv ...any) []byte {
	var b []byte
	for i := 0; i < len(kv); i += 2 {
		b = pbField(b, protowire.Number(kv[i].(int)), kv[i+1])
	}
	return b
}

// TestProtoWireSemantics: encodings Protobuf reads as one message give one
// JSON, and the wire's last-wins, merge and oneof rules hold.
func TestProtoWireSemantics(t *testing.T) {
	md := pbClaimMD(t)
	item := func(kv ...any) []byte { return pbFields(kv...) }
	entry := func(k, v any) []byte { return pbFields(1, k, 2, v) }
	packed := func(vs ...int64) []byte {
		var b []byte
		for _, v := range vs {
			b = protowire.AppendVarint(b, uint64(v))
		}
		return b
	}
	cases := []struct {
		name string
		wire []byte
		want string
	}{
		{"packed", pbFields(19, packed(1, -2, 3)), `"codes":[1,-2,3]`},
		{"unpacked", pbFields(19, uint64(1), 19, uint64(math.MaxUint64-1), 19, uint64(3)), `"codes":[1,-2,3]`},
		{"packed and unpacked mixed", pbFields(19, packed(1), 1, "c", 19, uint64(math.MaxUint64-1), 19, packed(3)),
			`"codes":[1,-2,3],"coupon_id":"c"`},
		{"empty packed", pbFields(19, []byte{}), `"codes":[]`},
		{"last scalar wins", pbFields(3, uint64(1), 1, "a", 3, uint64(2), 1, "b"), `"amount":2,"coupon_id":"b"`},
		{"messages merge", pbFields(10, item(1, uint64(5)), 10, item(2, uint64(7)), 10, item(1, uint64(6))),
			`"issued_at":{"seconds":6,"nanos":7}`},
		{"repeated messages do not merge", pbFields(7, item(1, "a"), 7, item(2, uint64(2))),
			`"items":[{"sku":"a","qty":0,"client_ts":""},{"sku":"","qty":2,"client_ts":""}]`},
		{"oneof last member wins", pbFields(14, "s", 15, uint64(9)), `"region_id":9`},
		{"oneof member set again", pbFields(15, uint64(9), 14, "s", 15, uint64(8)), `"region_id":8`},
		{"duplicate map keys", pbFields(8, entry("k", "1"), 8, entry("j", "2"), 8, entry("k", "3")),
			`"attributes":{"k":"3","j":"2"}`},
		{"map entry key or value missing", pbFields(8, pbFields(2, "v"), 16, pbFields(1, uint64(4))),
			`"attributes":{"":"v"},"tags":{"4":""}`},
		{"map entry fields repeated", pbFields(8, pbFields(1, "a", 2, "x", 1, "b", 2, "y")),
			`"attributes":{"b":"y"}`},
		{"unknown fields skipped", pbFields(1, "c", 99, uint64(1), 100, "x", 101, uint32(1), 102, pbFixed64(2)),
			`"coupon_id":"c"`},
		{"unknown group skipped", append(protowire.AppendTag(pbFields(1, "c"), 50, protowire.StartGroupType),
			append(pbFields(1, "in"), protowire.AppendTag(nil, 50, protowire.EndGroupType)...)...),
			`"coupon_id":"c"`},
		{"unknown fields in nested message skipped", pbFields(7, item(1, "a", 9, "zz")),
			`"items":[{"sku":"a","qty":0,"client_ts":""}]`},
		{"int32 read from a 64-bit varint", pbFields(5, uint64(math.MaxUint64)), `"retry_count":-1`},
		{"non-minimal varint", []byte{0x28, 0x85, 0x80, 0x80, 0x00}, `"retry_count":5`},
		{"enum read from a 64-bit varint", pbFields(11, uint64(1<<32+2)), `"channel":"WEB"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pbJSONEqual(t, pbDecode(t, md, c.wire), pbClaimWith(c.want))
			pbMatchesRuntime(t, md, c.wire)
		})
	}
}

func TestProtoRefusesBadInput(t *testing.T) {
	md := pbClaimMD(t)
	items := func(i int, bad []byte) []byte {
		var b []byte
		for range i {
			b = pbField(b, 7, pbFields(1, "ok"))
		}
		return pbField(b, 7, bad)
	}
	cases := []struct {
		name  string
		wire  []byte
		is    error
		where string
	}{
		{"truncated tag", []byte{0x80}, dedupe.ErrMalformedPayload, "top-level"},
		{"truncated varint", []byte{0x18, 0xff}, dedupe.ErrMalformedPayload, "at /amount"},
		{"varint too long", append([]byte{0x18}, bytes.Repeat([]byte{0xff}, 10)...), dedupe.ErrMalformedPayload, "/amount"},
		{"truncated string", []byte{0x0a, 0x05, 'a'}, dedupe.ErrMalformedPayload, "/coupon_id"},
		{"truncated fixed64", []byte{0x69, 1, 2, 3}, dedupe.ErrMalformedPayload, "/ratio"},
		{"field number zero", []byte{0x00, 0x01}, dedupe.ErrMalformedPayload, "top-level"},
		{"field number too large", protowire.AppendTag(nil, protowire.MaxValidNumber+1, protowire.VarintType),
			dedupe.ErrMalformedPayload, "top-level"},
		{"wire type 6", []byte{0x0e}, dedupe.ErrMalformedPayload, ""},
		{"stray end group", protowire.AppendTag(nil, 50, protowire.EndGroupType), dedupe.ErrMalformedPayload, ""},
		{"unterminated group", protowire.AppendTag(nil, 50, protowire.StartGroupType), dedupe.ErrMalformedPayload, ""},
		{"string as varint", pbFields(1, uint64(1)), dedupe.ErrMalformedPayload, "/coupon_id"},
		{"int64 as bytes", pbFields(3, "1"), dedupe.ErrMalformedPayload, "/amount"},
		{"message as varint", pbFields(10, uint64(1)), dedupe.ErrMalformedPayload, "/issued_at"},
		{"double as fixed32", pbFields(13, uint32(1)), dedupe.ErrMalformedPayload, "/ratio"},
		{"bad wire type deep", items(2, pbFields(2, "x")), dedupe.ErrMalformedPayload, "at /items/2/qty"},
		{"bad packed varint", pbFields(19, []byte{1, 0xff}), dedupe.ErrMalformedPayload, "at /codes/1"},
		{"invalid UTF-8", pbFields(2, "a\xffb"), dedupe.ErrMalformedPayload, "at /user_id"},
		{"invalid UTF-8 deep", items(1, pbFields(1, "\xc3")), dedupe.ErrMalformedPayload, "at /items/1/sku"},
		{"invalid UTF-8 overwritten", pbFields(2, "\xff", 2, "ok"), dedupe.ErrMalformedPayload, "/user_id"},
		{"map key with a wrong wire type", pbFields(8, pbFields(1, "a", 1, uint64(1))), dedupe.ErrMalformedPayload,
			"string map key has wire type varint, not length-delimited at /attributes"},
		{"invalid UTF-8 map key", pbFields(8, pbFields(1, "\xff")), dedupe.ErrMalformedPayload, "/attributes"},
		{"invalid UTF-8 map value", pbFields(8, pbFields(1, "k/~", 2, "\xff")), dedupe.ErrMalformedPayload,
			"at /attributes/k~1~0"},
		{"garbage in merged message", pbFields(10, pbFields(1, uint64(1)), 10, []byte{0xff}),
			dedupe.ErrMalformedPayload, "/issued_at"},
		{"garbage in cleared oneof member", pbFields(14, "\xff", 15, uint64(1)), dedupe.ErrMalformedPayload, "/store_id"},
		{"garbage in replaced map entry", pbFields(8, pbFields(1, "k", 2, []byte{0xff}), 8, pbFields(1, "k")),
			dedupe.ErrMalformedPayload, "/attributes"},
		{"NaN", pbFields(13, pbFixed64(math.Float64bits(math.NaN()))), dedupe.ErrNonFiniteNumber, "at /ratio"},
		{"+Inf", pbFields(13, pbFixed64(math.Float64bits(math.Inf(1)))), dedupe.ErrNonFiniteNumber, "at /ratio"},
		{"-Inf", pbFields(13, pbFixed64(math.Float64bits(math.Inf(-1)))), dedupe.ErrNonFiniteNumber, "at /ratio"},
		{"float NaN", pbFields(20, math.Float32bits(float32(math.NaN()))), dedupe.ErrNonFiniteNumber, "at /weight"},
		{"float -Inf", pbFields(20, math.Float32bits(float32(math.Inf(-1)))), dedupe.ErrNonFiniteNumber, "at /weight"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := appendProtoJSON([]byte("prefix"), md, c.wire)
			if !errors.Is(err, c.is) {
				t.Fatalf("got %q, %v; want %v", out, err, c.is)
			}
			if !strings.Contains(err.Error(), c.where) {
				t.Errorf("error %q does not say %q", err, c.where)
			}
			if string(out) != "prefix" {
				t.Errorf("dst changed to %q", out)
			}
		})
	}
	// A NaN that a later occurrence replaces is not in the message.
	wire := pbFields(13, pbFixed64(math.Float64bits(math.NaN())), 13, pbFixed64(math.Float64bits(2)))
	pbJSONEqual(t, pbDecode(t, md, wire), pbClaimWith(`"ratio":2`))
}

// TestProtoTruncations: every strict prefix of a message either decodes
// (it ends between fields) or is refused as malformed.
func TestProtoTruncations(t *testing.T) {
	md := pbClaimMD(t)
	data := pbMarshal(t, pbBenchClaim(md))
	for n := range len(data) {
		_, err := appendProtoJSON(nil, md, data[:n])
		if err != nil && !errors.Is(err, dedupe.ErrMalformedPayload) {
			t.Fatalf("prefix %d: %v", n, err)
		}
		pbMatchesRuntime(t, md, data[:n])
	}
}

// A local .proto imports its siblings as protoc -I <root> reads them: the
// import path from the file's directory or the nearest one above it; an
// import that is nowhere, or that climbs out with "..", is refused.
func TestProtoLocalFileImports(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) string {
		path := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("proto/coupon/v1/item.proto", pbItemProto)
	claim := write("proto/coupon/v1/claim.proto", pbClaimProto)
	d, err := Open(context.Background(), Options{Format: dedupe.PayloadProtobuf, SchemaFile: claim, Message: "coupon.v1.Claim"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.AppendJSON(nil, pbFields(1, "C-1", 7, pbFields(1, "A-1", 2, uint64(3))))
	if err != nil || !strings.Contains(string(got), `"items":[{"sku":"A-1","qty":3,"client_ts":""}]`) {
		t.Fatalf("%s %v", got, err)
	}
	for name, text := range map[string]string{
		"missing": `syntax = "proto3"; import "coupon/v1/nowhere.proto"; message M {}`,
		"climbs":  `syntax = "proto3"; import "../proto/coupon/v1/item.proto"; message M {}`,
	} {
		path := write("other/"+name+".proto", text)
		if _, err := Open(context.Background(), Options{Format: dedupe.PayloadProtobuf, SchemaFile: path}); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
}

// TestProtoTextIsBounded: proto3 sends no field at its default, so an
// item of a few bytes writes every default of its message. Records of
// such sparse items decode; a record that would expand past protoLimit
// (empty items by the hundred thousand, an occurrence repeated for the
// last one to win, long enum names in a packed field) is malformed_payload
// and stops there, instead of taking gigabytes or seconds.
func TestProtoTextIsBounded(t *testing.T) {
	var fields strings.Builder
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&fields, "  int64 a_field_name_of_about_thirty_chars_%02d = %d;\n", i, i)
	}
	long := strings.Repeat("A_VERY_LONG_ENUM_VALUE_NAME_", 7)
	src := "syntax = \"proto3\";\npackage wide;\nmessage Item {\n" + fields.String() + "}\n" +
		"enum E { E_ZERO = 0; " + long + " = 1; }\n" +
		"message Cmd { repeated Item items = 1; oneof pick { Item a = 2; int32 b = 3; } map<string, Item> byKey = 4; repeated E es = 5; }\n"
	md := pbMessage(t, pbCompile(t, "wide.proto", map[string]string{"wide.proto": src}), "wide.Cmd")
	sparse := bytes.Repeat(pbFields(1, pbFields(17, uint64(5))), 2000) // one field set in each item
	if out := pbDecode(t, md, sparse); len(out) <= outputLimit(len(sparse)) {
		t.Fatalf("2,000 sparse items decode to %d bytes: no test of the sparse bound", len(out))
	}
	entry := pbFields(1, "", 2, []byte{})
	for name, data := range map[string][]byte{
		"empty items":             bytes.Repeat([]byte{0x0a, 0x00}, 100_000),
		"a oneof member repeated": append(bytes.Repeat([]byte{0x12, 0x00}, 500_000), pbFields(3, uint64(1))...),
		"a map key repeated":      bytes.Repeat(pbField(nil, 4, entry), 300_000),
		"long enum names, packed": pbField(nil, 5, bytes.Repeat([]byte{1}, 600_000)),
	} {
		if _, err := appendProtoJSON(nil, md, data); !errors.Is(err, dedupe.ErrMalformedPayload) || !strings.Contains(err.Error(), "decodes to more than") {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// TestProtoNesting: the output nests no deeper than the canonicalizer
// accepts (dedupe.MaxNestingDepth containers, arrays and maps included); a
// deeper message is malformed. Every Node writes its repeated fields, so
// the deepest Node is one level above the limit.
func TestProtoNesting(t *testing.T) {
	md := pbMessage(t, pbCompile(t, "legacy/node.proto", pbSources()), "legacy.Node")
	nest := func(levels int, field protowire.Number) []byte {
		b := pbFields(6, uint64(1))
		for range levels - 1 {
			b = pbField(pbFields(6, uint64(1)), field, b)
		}
		return b
	}
	for _, c := range []struct {
		name   string
		field  protowire.Number
		levels int // the most Nodes that nest
	}{
		{"child", 2, dedupe.MaxNestingDepth - 1},
		{"kids", 3, dedupe.MaxNestingDepth / 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := pbDecode(t, md, nest(c.levels, c.field))
			pbCanonical(t, out)
			if d := pbJSONDepth(out); d != dedupe.MaxNestingDepth {
				t.Fatalf("depth %d, want %d", d, dedupe.MaxNestingDepth)
			}
			_, err := appendProtoJSON(nil, md, nest(c.levels+1, c.field))
			if !errors.Is(err, dedupe.ErrMalformedPayload) || !strings.Contains(err.Error(), "nesting") {
				t.Fatalf("got %v", err)
			}
		})
	}
	// An unknown group is skipped however deep it nests (up to protowire's
	// own limit).
	var deep []byte
	for range 200 {
		deep = protowire.AppendTag(deep, 90, protowire.StartGroupType)
	}
	for range 200 {
		deep = protowire.AppendTag(deep, 90, protowire.EndGroupType)
	}
	pbJSONEqual(t, pbDecode(t, md, deep), pbNodeWith(""))
}

func pbJSONDepth(b []byte) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			most = max(most, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return most
}

// TestProtoLegacy covers proto2: groups, explicit presence of every
// scalar, closed enums, bool map keys, recursion.
func TestProtoLegacy(t *testing.T) {
	md := pbMessage(t, pbCompile(t, "legacy/node.proto", pbSources()), "legacy.Node")
	node := func(kv ...any) func(protoreflect.Message) {
		return func(m protoreflect.Message) { pbSet(m, kv...) }
	}
	m := pbNew(md, "id", -1, "v", 7, "extra", node("note", "g", "nums", []any{1, 2}), "label", "x",
		"kind", 2, "packed", []any{-1, 1}, "flags", map[any]any{true: node("id", 2), false: node()},
		"fx", []any{uint64(math.MaxUint64)}, "sf", -5, "f32", math.MaxUint32, "u32", 4, "ok", false,
		"raw", []byte{}, "left", node("id", 3, "right", "r"), "names", map[any]any{uint32(math.MaxUint32): "m"},
		"kinds", map[any]any{int64(-1): 1}, "s32", math.MinInt32, "sf64", math.MinInt64,
		"u64", uint64(math.MaxUint64), "d", -1.5, "kids", []any{node("id", 4), node("id", 5, "child", node("id", 6))})
	got := pbDecode(t, md, pbMarshal(t, m))
	want := pbNodeWith(`"v":7,"kids":[` + pbNodeWith(`"id":4`) + `,` + pbNodeWith(`"id":5,"child":`+pbNodeWith(`"id":6`)) +
		`],"extra":{"note":"g","nums":[1,2]},"label":"x","id":-1,"kind":"KIND_B","packed":[-1,1],` +
		`"flags":{"true":` + pbNodeWith(`"id":2`) + `,"false":` + pbNodeWith(``) + `},` +
		`"fx":[18446744073709551615],"sf":-5,"f32":4294967295,"u32":4,"ok":false,"raw":"",` +
		`"left":` + pbNodeWith(`"id":3,"right":"r"`) + `,"names":{"4294967295":"m"},"kinds":{"-1":"KIND_A"},` +
		`"s32":-2147483648,"sf64":-9223372036854775808,"u64":18446744073709551615,"d":-1.5`)
	pbJSONEqual(t, got, want)
	pbMatchesRuntime(t, md, pbMarshal(t, m))
	pbCheckGolden(t, "legacy-node", pbCanonical(t, got))

	// A closed enum's undeclared number is kept, not treated as absent.
	pbJSONEqual(t, pbDecode(t, md, pbFields(7, uint64(9))), pbNodeWith(`"kind":9`))
	// A missing map value is its default.
	pbJSONEqual(t, pbDecode(t, md, pbFields(19, pbFields(1, pbFixed64(3)))), pbNodeWith(`"kinds":{"3":"KIND_Z"}`))
	// The group's end tag must match it.
	bad := protowire.AppendTag(protowire.AppendTag(nil, 4, protowire.StartGroupType), 5, protowire.EndGroupType)
	if _, err := appendProtoJSON(nil, md, bad); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("mismatched end group: %v", err)
	}
	// A group field sent as a length-delimited message is a wrong wire type.
	if _, err := appendProtoJSON(nil, md, pbFields(4, pbFields(1, "g"))); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Fatalf("group as bytes: %v", err)
	}
}

// TestProtoEditions: editions features map onto the same rules: presence
// from field_presence, delimited messages read as groups, closed enums.
func TestProtoEditions(t *testing.T) {
	const text = `edition = "2023";
package ed;
option features.field_presence = IMPLICIT;
enum Closed {
  option features.enum_type = CLOSED;
  C_ONE = 1;
}
message Inner { int32 a = 1; }
message E {
  int32 plain = 1;
  int32 explicit = 2 [features.field_presence = EXPLICIT];
  Inner delimited = 3 [features.message_encoding = DELIMITED];
  Closed closed = 4 [features.field_presence = EXPLICIT];
  repeated int32 expanded = 5 [features.repeated_field_encoding = EXPANDED];
}
`
	md := pbMessage(t, pbCompile(t, "ed.proto", map[string]string{"ed.proto": text}), "ed.E")
	if k := md.Fields().ByName("delimited").Kind(); k != protoreflect.GroupKind {
		t.Fatalf("delimited is %v", k)
	}
	pbJSONEqual(t, pbDecode(t, md, nil), `{"plain":0,"expanded":[]}`)
	m := pbNew(md, "explicit", 0, "delimited", func(m protoreflect.Message) { pbSet(m, "a", 4) }, "closed", 1,
		"expanded", []any{1, 2})
	pbJSONEqual(t, pbDecode(t, md, pbMarshal(t, m)),
		`{"plain":0,"explicit":0,"delimited":{"a":4},"closed":"C_ONE","expanded":[1,2]}`)
	pbMatchesRuntime(t, md, pbMarshal(t, m))
	packed := pbFields(5, []byte{1, 2})
	pbJSONEqual(t, pbDecode(t, md, packed), `{"plain":0,"expanded":[1,2]}`)
	pbJSONEqual(t, pbDecode(t, md, pbFields(4, uint64(7))), `{"plain":0,"closed":7,"expanded":[]}`)
}

func pbCheckGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	goldenIn(t, "protobuf", name, got, *updateProtoGolden, "-update-proto")
}

// TestProtoGolden pins the canonical form of a few claims: a change here
// changes fingerprints.
func TestProtoGolden(t *testing.T) {
	md := pbClaimMD(t)
	for _, c := range []struct {
		name string
		msg  protoreflect.Message
	}{
		{"claim-empty", pbNew(md)},
		{"claim-full", pbBenchClaim(md)},
		{"claim-extremes", pbNew(md, "big", uint64(math.MaxUint64), "amount", int64(math.MinInt64), "channel", 9,
			"ratio", math.Copysign(0, -1), "weight", float32(3.4028235e38), "region_id", uint64(0),
			"tags", map[any]any{int64(math.MinInt64): "\u2028\x00"}, "signature", []byte{0xfb, 0xff})},
	} {
		t.Run(c.name, func(t *testing.T) {
			pbCheckGolden(t, c.name, pbCanonical(t, pbDecode(t, md, pbMarshal(t, c.msg))))
		})
	}
}

const pbClaimV1 = `syntax = "proto3";
package coupon.v1;
message Claim { string coupon_id = 1; string user_id = 2; int64 amount = 3; string client_time = 4; }
`

const pbClaimV2 = `syntax = "proto3";
package coupon.v1;
import "coupon/v1/item.proto";
message Claim {
  string coupon_id = 1; string user_id = 2; int64 amount = 3; string client_time = 4;
  string channel = 5; repeated Item items = 6;
}
`

func pbVersion(t *testing.T, text string) protoreflect.MessageDescriptor {
	t.Helper()
	s := pbCompile(t, "claim.proto", map[string]string{"claim.proto": text, "coupon/v1/item.proto": pbItemProto})
	return pbMessage(t, s, "coupon.v1.Claim")
}

func TestProtoEvolution(t *testing.T) {
	v1, v2 := pbVersion(t, pbClaimV1), pbVersion(t, pbClaimV2)
	old := pbMarshal(t, pbNew(v1, "coupon_id", "C", "user_id", "U", "amount", 5, "client_time", "t0"))
	pbJSONEqual(t, pbDecode(t, v2, old),
		`{"coupon_id":"C","user_id":"U","amount":5,"client_time":"t0","channel":"","items":[]}`)
	pbJSONEqual(t, pbDecode(t, v1, old), `{"coupon_id":"C","user_id":"U","amount":5,"client_time":"t0"}`)

	// A v2 record read with v1 is the v1 record: the new fields are skipped.
	newer := pbMarshal(t, pbNew(v2, "coupon_id", "C", "user_id", "U", "amount", 5, "client_time", "t0",
		"channel", "web", "items", []any{pbItem("A", 1)}))
	if a, b := pbDecode(t, v1, newer), pbDecode(t, v1, old); !bytes.Equal(pbCanonical(t, a), pbCanonical(t, b)) {
		t.Fatalf("v2 read as v1: %s, v1: %s", a, b)
	}

	for _, c := range [][2]protoreflect.MessageDescriptor{{v1, v2}, {v2, v1}, {v1, v1}, {v2, v2}} {
		if err := checkProtoCompatible(c[0], c[1]); err != nil {
			t.Errorf("%v", err)
		}
	}
	bad := pbVersion(t, strings.Replace(pbClaimV1, "int64 amount", "string amount", 1))
	err := checkProtoCompatible(bad, v2)
	if !errors.Is(err, dedupe.ErrIncompatibleSchema) || !strings.Contains(err.Error(), "/amount") {
		t.Fatalf("string amount read as int64: %v", err)
	}
}

func TestCheckProtoCompatible(t *testing.T) {
	const item = `message Item { string sku = 1; int32 qty = 2; }` + "\n"
	schema := func(body string) protoreflect.MessageDescriptor {
		text := "syntax = \"proto3\";\npackage p;\n" + item +
			"message Other { int32 qty = 2; }\nenum E { E0 = 0; }\nenum F { F0 = 0; }\nmessage M {\n" + body + "\n}\n"
		return pbMessage(t, pbCompile(t, "m.proto", map[string]string{"m.proto": text}), "p.M")
	}
	cases := []struct {
		writer, reader string
		where          string // "" when compatible
	}{
		{`string a = 1;`, `string a = 1;`, ""},
		{`string a = 1;`, `int64 b = 2;`, ""},
		{`int32 a = 1;`, `int64 a = 1;`, ""},
		{`uint32 a = 1;`, `int64 a = 1;`, ""},
		{`sint32 a = 1;`, `sint64 a = 1;`, ""},
		{`string a = 1;`, `bytes a = 1;`, ""},
		{`int32 a = 1;`, `optional int32 a = 1;`, ""},
		{`repeated int32 a = 1;`, `repeated int64 renamed = 1;`, ""},
		{`Item a = 1;`, `Item a = 1;`, ""},
		{`oneof o { string a = 1; int32 b = 2; }`, `oneof p { string a = 1; int32 b = 2; }`, ""},
		{`string a = 1; int32 b = 2;`, `string a = 1; oneof o { int32 b = 2; }`, ""},
		{`map<string, Item> a = 1;`, `map<string, Item> a = 1;`, ""},
		{`E a = 1;`, `E a = 1;`, ""},
		{`int64 a = 1;`, `string a = 1;`, "/a "},
		{`string a = 1;`, `int64 a = 1;`, "/a "},
		{`int64 a = 1;`, `int32 a = 1;`, "/a "},
		{`int32 a = 1;`, `sint32 a = 1;`, "/a "},
		{`bytes a = 1;`, `string a = 1;`, "/a "},
		{`Item a = 1;`, `int64 a = 1;`, "/a "},
		{`Item a = 1;`, `Other a = 1;`, "/a "},
		{`E a = 1;`, `F a = 1;`, "/a "},
		{`E a = 1;`, `int32 a = 1;`, "/a "},
		{`repeated int32 a = 1;`, `int32 a = 1;`, "/a "},
		{`int32 a = 1;`, `repeated int32 a = 1;`, "/a "},
		{`repeated Item a = 1;`, `map<string, Item> a = 1;`, "/a "},
		{`map<string, int32> a = 1;`, `map<int32, int32> a = 1;`, "/a "},
		{`map<string, int32> a = 1;`, `map<string, string> a = 1;`, "/a/*"},
		{`repeated Item a = 1;`, `repeated Other a = 1;`, "/a/*"},
		{`string a = 1; int32 b = 2;`, `oneof o { string a = 1; int32 b = 2; }`, "oneof /o"},
	}
	for _, c := range cases {
		err := checkProtoCompatible(schema(c.writer), schema(c.reader))
		switch {
		case c.where == "" && err != nil:
			t.Errorf("%s read as %s: %v", c.writer, c.reader, err)
		case c.where != "" && (!errors.Is(err, dedupe.ErrIncompatibleSchema) || !strings.Contains(err.Error(), c.where)):
			t.Errorf("%s read as %s: got %v, want an incompatibility at %q", c.writer, c.reader, err, c.where)
		}
	}

	// A nested message is checked too, and a recursive one ends.
	rec := func(qty string) protoreflect.MessageDescriptor {
		text := "syntax = \"proto3\";\npackage p;\nmessage M { M next = 1; repeated N ns = 2; }\nmessage N { M back = 1; " + qty + " qty = 2; }\n"
		return pbMessage(t, pbCompile(t, "r.proto", map[string]string{"r.proto": text}), "p.M")
	}
	if err := checkProtoCompatible(rec("int32"), rec("int32")); err != nil {
		t.Fatal(err)
	}
	if err := checkProtoCompatible(rec("string"), rec("int32")); !errors.Is(err, dedupe.ErrIncompatibleSchema) ||
		!strings.Contains(err.Error(), "/ns/*/qty") {
		t.Fatalf("nested: %v", err)
	}
}

func TestProtoMessageByIndexes(t *testing.T) {
	s := pbCompile(t, "coupon/v1/events.proto", pbSources())
	for _, c := range []struct {
		indexes []int
		want    protoreflect.FullName
	}{
		{nil, "coupon.v1.Ping"},
		{[]int{}, "coupon.v1.Ping"},
		{[]int{0}, "coupon.v1.Ping"},
		{[]int{1}, "coupon.v1.Envelope"},
		{[]int{1, 0}, "coupon.v1.Envelope.Inner"},
		{[]int{1, 1}, "coupon.v1.Envelope.CountsEntry"}, // map entries are nested types
		{[]int{1, 2}, "coupon.v1.Envelope.Second"},
		{[]int{2}, ""},
		{[]int{-1}, ""},
		{[]int{1, 3}, ""},
		{[]int{0, 0}, ""},
		{[]int{1, 0, 0}, ""},
	} {
		md, err := s.messageByIndexes(c.indexes)
		switch {
		case c.want == "" && !errors.Is(err, dedupe.ErrMalformedPayload):
			t.Errorf("%v: got %v, %v; want malformed", c.indexes, md, err)
		case c.want != "" && (err != nil || md.FullName() != c.want):
			t.Errorf("%v: got %v, %v; want %s", c.indexes, md, err, c.want)
		}
	}
	if _, err := pbCompile(t, "empty.proto", map[string]string{"empty.proto": `syntax = "proto3";`}).
		messageByIndexes(nil); !errors.Is(err, dedupe.ErrMalformedPayload) {
		t.Errorf("a file without messages: %v", err)
	}
}

func TestProtoMessageByName(t *testing.T) {
	s := pbCompile(t, "coupon/v1/events.proto", pbSources())
	for _, name := range []protoreflect.FullName{"coupon.v1.Ping", "coupon.v1.Envelope", "coupon.v1.Envelope.Second"} {
		if md, ok := s.messageByName(name); !ok || md.FullName() != name {
			t.Errorf("%s: got %v, %v", name, md, ok)
		}
	}
	for _, name := range []protoreflect.FullName{"coupon.v1.Claim", "Ping", "coupon.v1.Envelope.Nope", ""} {
		if md, ok := s.messageByName(name); ok {
			t.Errorf("%s: found %v", name, md.FullName())
		}
	}
	// Imported files' messages are not the main file's.
	if _, ok := pbCompile(t, "coupon/v1/claim.proto", pbSources()).messageByName("coupon.v1.Item"); ok {
		t.Error("found an imported message")
	}
}

func TestCompileProto(t *testing.T) {
	for _, c := range []struct {
		name    string
		sources map[string]string
		says    string
	}{
		{"syntax error", map[string]string{"a.proto": `syntax = "proto3"; message {`}, "a.proto"},
		{"missing import", map[string]string{"a.proto": `syntax = "proto3"; import "b.proto";`}, "b.proto"},
		{"unknown type", map[string]string{"a.proto": `syntax = "proto3"; message A { B b = 1; }`}, "a.proto"},
		{"missing main", map[string]string{}, "a.proto"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := compileProto("a.proto", c.sources)
			if !errors.Is(err, dedupe.ErrIncompatibleSchema) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("got %v", err)
			}
		})
	}
	// Every well-known type resolves without being given, and the
	// compiler's copy wins over one that is.
	text := `syntax = "proto3"; import "google/protobuf/any.proto"; import "google/protobuf/duration.proto";
import "google/protobuf/struct.proto"; import "google/protobuf/wrappers.proto"; import "google/protobuf/empty.proto";
import "google/protobuf/field_mask.proto"; import "google/protobuf/timestamp.proto";
message A { google.protobuf.Any a = 1; google.protobuf.Duration d = 2; google.protobuf.Struct s = 3;
  google.protobuf.Int64Value i = 4; google.protobuf.Empty e = 5; google.protobuf.FieldMask f = 6;
  google.protobuf.Timestamp t = 7; }`
	a := pbMessage(t, pbCompile(t, "a.proto", map[string]string{"a.proto": text}), "A")
	b := pbMessage(t, pbCompile(t, "a.proto", map[string]string{"a.proto": text,
		"google/protobuf/timestamp.proto": `syntax = "proto3"; package google.protobuf; message Timestamp { string x = 1; }`}), "A")
	if protoDigest(a) != protoDigest(b) {
		t.Error("a given timestamp.proto replaced the standard one")
	}
	// Well-known types are ordinary messages.
	wire := pbFields(7, pbFields(1, uint64(12), 2, uint64(3)), 4, pbFields(1, uint64(9)), 3,
		pbFields(1, pbFields(1, "k", 2, pbFields(3, "v"))))
	pbJSONEqual(t, pbDecode(t, a, wire), `{"t":{"seconds":12,"nanos":3},"i":{"value":9},`+
		`"s":{"fields":{"k":{"string_value":"v"}}}}`)
}

func TestProtoDigest(t *testing.T) {
	compile := func(claim string) *protoSchema {
		src := pbSources()
		src["coupon/v1/claim.proto"] = claim
		return pbCompile(t, "coupon/v1/claim.proto", src)
	}
	a := protoDigest(pbMessage(t, compile(pbClaimProto), "coupon.v1.Claim"))
	if len(a) != 64 || strings.ToLower(a) != a {
		t.Fatalf("digest %q", a)
	}
	same := []string{
		pbClaimProto,
		"// a comment changes nothing\n" + strings.ReplaceAll(pbClaimProto, "  ", "\t"),
	}
	for _, text := range same {
		if b := protoDigest(pbMessage(t, compile(text), "coupon.v1.Claim")); b != a {
			t.Errorf("digest changed: %s", text)
		}
	}
	differ := map[string]protoreflect.MessageDescriptor{
		"renamed field": pbMessage(t, compile(strings.Replace(pbClaimProto, "user_id", "user", 1)), "coupon.v1.Claim"),
		"another type":  pbMessage(t, compile(strings.Replace(pbClaimProto, "int64 amount", "sint64 amount", 1)), "coupon.v1.Claim"),
		"file changed":  pbMessage(t, compile(pbClaimProto+"message Extra {}\n"), "coupon.v1.Claim"),
		"other message": pbMessage(t, compile(pbClaimProto+"message Extra {}\n"), "coupon.v1.Extra"),
	}
	src := pbSources()
	src["coupon/v1/item.proto"] = strings.Replace(pbItemProto, "int32 qty", "int64 qty", 1)
	differ["changed import"] = pbMessage(t, pbCompile(t, "coupon/v1/claim.proto", src), "coupon.v1.Claim")
	seen := map[string]string{a: "original"}
	for name, md := range differ {
		d := protoDigest(md)
		if prev, ok := seen[d]; ok {
			t.Errorf("%s has the digest of %s", name, prev)
		}
		seen[d] = name
	}
}

// pbReferenceJSON writes m with the mapping, from the Protobuf runtime's
// reading of it: the reference the wire walk is checked against.
func pbReferenceJSON(b []byte, m protoreflect.Message) []byte {
	b = append(b, '{')
	fields := m.Descriptor().Fields()
	n := 0
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !fd.IsList() && !fd.IsMap() && fd.HasPresence() && !m.Has(fd) {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = strconv.AppendQuote(b, string(fd.Name()))
		b = append(b, ':')
		v := m.Get(fd)
		switch {
		case fd.IsList():
			b = append(b, '[')
			for j := range v.List().Len() {
				if j > 0 {
					b = append(b, ',')
				}
				b = pbReferenceValue(b, fd, v.List().Get(j))
			}
			b = append(b, ']')
		case fd.IsMap():
			var keys []protoreflect.MapKey
			v.Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool { keys = append(keys, k); return true })
			slices.SortFunc(keys, func(x, y protoreflect.MapKey) int { return strings.Compare(x.String(), y.String()) })
			b = append(b, '{')
			for j, k := range keys {
				if j > 0 {
					b = append(b, ',')
				}
				kj, _ := json.Marshal(k.String())
				b = append(append(b, kj...), ':')
				b = pbReferenceValue(b, fd.MapValue(), v.Map().Get(k))
			}
			b = append(b, '}')
		default:
			b = pbReferenceValue(b, fd, v)
		}
	}
	return append(b, '}')
}

func pbReferenceValue(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) []byte {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return pbReferenceJSON(b, v.Message())
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return strconv.AppendQuote(b, string(ev.Name()))
		}
		return strconv.AppendInt(b, int64(v.Enum()), 10)
	case protoreflect.BytesKind:
		return strconv.AppendQuote(b, base64.StdEncoding.EncodeToString(v.Bytes()))
	case protoreflect.StringKind:
		s, _ := json.Marshal(v.String())
		return append(b, s...)
	case protoreflect.FloatKind:
		return strconv.AppendFloat(b, v.Float(), 'g', -1, 32)
	case protoreflect.DoubleKind:
		return strconv.AppendFloat(b, v.Float(), 'g', -1, 64)
	}
	return append(b, v.String()...) // integers and bools
}

// pbMatchesRuntime checks the wire walk against the Protobuf runtime: what
// the runtime refuses the walk refuses, and what the walk decodes is, after
// canonicalization, the runtime's message written by the reference.
func pbMatchesRuntime(t testing.TB, md protoreflect.MessageDescriptor, data []byte) {
	t.Helper()
	got, err := appendProtoJSON(nil, md, data)
	m := dynamicpb.NewMessage(md)
	rerr := pbRuntimeUnmarshal(data, m)
	switch {
	case rerr != nil && err == nil:
		t.Fatalf("the runtime refuses %x (%v), the walk gives %s", data, rerr, got)
	case err != nil:
		return // the walk refuses more: wrong wire types, NaN, nesting
	}
	want := pbReferenceJSON(nil, m)
	if g, w := pbCanonical(t, got), pbCanonical(t, want); !bytes.Equal(g, w) {
		t.Fatalf("%x:\nwalk    %s\nruntime %s", data, g, w)
	}
}

// pbRuntimeUnmarshal is the runtime's reading of data, with a panic made
// an error: its reflection path (dynamicpb's) panics on a map entry whose
// key repeats with a wrong wire type, which the walk refuses.
func pbRuntimeUnmarshal(data []byte, m protoreflect.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("runtime panic: %v", r)
		}
	}()
	return proto.UnmarshalOptions{AllowPartial: true}.Unmarshal(data, m.Interface())
}

// pbBenchClaim is a claim of about 1 KB as JSON: a dozen scalars, a map,
// a timestamp and eight items.
func pbBenchClaim(md protoreflect.MessageDescriptor) protoreflect.Message {
	var items []any
	for i := range 8 {
		items = append(items, func(m protoreflect.Message) {
			pbSet(m, "sku", fmt.Sprintf("SKU-%06d-BLUE-XL", i), "qty", i+1, "client_ts", "2024-05-01T10:00:00.123Z")
		})
	}
	return pbNew(md, "coupon_id", "CPN-2024-SPRING-000123", "user_id", "user-8f14e45fceea167a5a36dedd4bea2543",
		"amount", 129900, "client_time", "2024-05-01T10:00:00.000Z", "retry_count", 2,
		"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736", "items", items,
		"attributes", map[any]any{"campaign": "spring", "source": "push"}, "note", "first claim",
		"issued_at", func(m protoreflect.Message) { pbSet(m, "seconds", 1714557600, "nanos", 123000000) },
		"channel", 1, "signature", bytes.Repeat([]byte{0xa5}, 32), "ratio", 0.125, "store_id", "store-0042",
		"tags", map[any]any{int64(1): "vip"}, "big", uint64(1)<<63, "delta", -42, "codes", []any{int64(7), int64(11)},
		"weight", 1.5)
}

func TestProtoBenchClaimSize(t *testing.T) {
	md := pbClaimMD(t)
	data := pbMarshal(t, pbBenchClaim(md))
	out := pbDecode(t, md, data)
	pbMatchesRuntime(t, md, data)
	if len(out) < 900 || len(out) > 1300 {
		t.Fatalf("the benchmark's claim is %d bytes as JSON, want about 1 KB", len(out))
	}
}

func BenchmarkProtoDecode(b *testing.B) {
	md := pbClaimMD(b)
	data := pbMarshal(b, pbBenchClaim(md))
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		var err error
		if dst, err = appendProtoJSON(dst[:0], md, data); err != nil {
			b.Fatal(err)
		}
	}
}
