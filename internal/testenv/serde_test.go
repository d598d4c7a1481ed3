package testenv

import (
	"bytes"
	"encoding/hex"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

func TestJavaAvro(t *testing.T) {
	const schema = `{"type":"record","name":"R","fields":[{"name":"a","type":"long"}]}`
	got := JavaAvro(t, schema, 7, `{"a": 1}`, "{\n  \"a\": -2\n}", `{"a": 300}`)
	// 1, -2 and 300 in zig-zag varints: 02, 03, d8 04.
	checkHex(t, got, "00"+"00000007"+"02", "00"+"00000007"+"03", "00"+"00000007"+"d804")

	// The id is big-endian, all four bytes of it.
	got = JavaAvro(t, schema, 0x01020304, `{"a": 0}`)
	checkHex(t, got, "00"+"01020304"+"00")
}

func TestJavaProtobuf(t *testing.T) {
	// message M { int64 a = 1; }
	// message N { message Inner { string b = 1; } }
	field := func(name string, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{
			Name: proto.String(name), JsonName: proto.String(name), Number: proto.Int32(1),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: typ.Enum(),
		}
	}
	set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{{
		Name:    proto.String("testenv/m.proto"),
		Package: proto.String("testenv"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("M"), Field: []*descriptorpb.FieldDescriptorProto{field("a", descriptorpb.FieldDescriptorProto_TYPE_INT64)}},
			{Name: proto.String("N"), NestedType: []*descriptorpb.DescriptorProto{
				{Name: proto.String("Inner"), Field: []*descriptorpb.FieldDescriptorProto{field("b", descriptorpb.FieldDescriptorProto_TYPE_STRING)}},
			}},
		},
	}}}
	descriptors, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}

	// The first message: its indexes [0] are the single byte 00; field 1
	// varint (08) 1 (01). int64 is a string in the JSON mapping, and a
	// number is accepted too.
	got := JavaProtobuf(t, descriptors, "testenv.M", 7, []int{0}, `{"a": 1}`, `{"a": "150"}`)
	checkHex(t, got, "00"+"00000007"+"00"+"0801", "00"+"00000007"+"00"+"089601")

	// N.Inner is [1, 0]: the count 2 then 1 and 0, as zig-zag varints
	// (04 02 00); field 1 length-delimited (0a), 2 bytes, "hi".
	got = JavaProtobuf(t, descriptors, "testenv.N.Inner", 7, []int{1, 0}, `{"b": "hi"}`)
	checkHex(t, got, "00"+"00000007"+"040200"+"0a026869")
}

func checkHex(t *testing.T, got [][]byte, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i := range want {
		w, err := hex.DecodeString(want[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[i], w) {
			t.Errorf("record %d is %x, want %s", i, got[i], want[i])
		}
	}
}
