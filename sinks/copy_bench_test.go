package sinks

import (
	"strconv"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
)

// A fetch as the load run's input makes it: 1,000 records of about 1 KB
// with two headers. drain copies each out of kafka-go's pages; the
// records of one fetch live and die together with their batch.
func benchRecords(recs []kafka.Record, keys [][]byte, value []byte) {
	for i := range recs {
		recs[i] = kafka.Record{Offset: int64(i), Key: kafka.NewBytes(keys[i]), Value: kafka.NewBytes(value),
			Headers: []kafka.Header{{Key: "trace", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}, {Key: "client", Value: []byte("app")}}}
	}
}

func BenchmarkDrain(b *testing.B) {
	recs, keys, value := make([]kafka.Record, 1000), make([][]byte, 1000), make([]byte, 1000)
	for i := range keys {
		keys[i] = []byte("key-" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		benchRecords(recs, keys, value)
		rr := kafka.NewRecordReader(recs...)
		b.StartTimer()
		out, err := drain(rr, 0)
		if err != nil || len(out) != len(recs) {
			b.Fatal(len(out), err)
		}
	}
}

// The results of a batch as produce hands them to kafka-go: seven
// headers each (the input's two and idemstream's five).
func BenchmarkKafkaRecords(b *testing.B) {
	msgs := make([]Message, 1000)
	idx := make([]int, len(msgs))
	for i := range msgs {
		hs := make([]dedupe.Header, 7)
		for j := range hs {
			hs[j] = dedupe.Header{Key: "h" + strconv.Itoa(j), Value: []byte("value")}
		}
		msgs[i] = Message{Key: []byte("key"), Value: make([]byte, 1000), Headers: hs}
		idx[i] = i
	}
	b.ReportAllocs()
	for b.Loop() {
		if recs := kafkaRecords(msgs, idx); len(recs) != len(msgs) {
			b.Fatal(len(recs))
		}
	}
}

// Records cut from one block stay apart: appending to one never writes
// into the next, and a record larger than a quarter block has its own.
func TestDrainedRecordsShareBlocksApart(t *testing.T) {
	big := make([]byte, copyBlock/2)
	recs := []kafka.Record{
		{Offset: 0, Key: kafka.NewBytes([]byte("k0")), Value: kafka.NewBytes([]byte("v0"))},
		{Offset: 1, Key: kafka.NewBytes([]byte("k1")), Value: kafka.NewBytes([]byte("v1")), Headers: []kafka.Header{{Key: "h", Value: []byte("x")}}},
		{Offset: 2, Key: nil, Value: kafka.NewBytes(big)},
		{Offset: 3, Key: kafka.NewBytes([]byte{}), Value: nil},
	}
	out, err := drain(kafka.NewRecordReader(recs...), 1)
	if err != nil || len(out) != 3 {
		t.Fatalf("drain from offset 1 = %d records, %v; want 3", len(out), err)
	}
	_ = append(out[0].Key, "!!!!"...)
	_ = append(out[0].Value, "!!!!"...)
	_ = append(out[0].Headers[0].Value, "!!!!"...)
	if string(out[0].Key) != "k1" || string(out[0].Value) != "v1" || string(out[0].Headers[0].Value) != "x" || string(out[1].Value) != string(big) {
		t.Errorf("records = %q %q %q; an append wrote into its neighbour", out[0].Key, out[0].Value, out[0].Headers[0].Value)
	}
	if out[1].Key != nil || len(out[1].Value) != len(big) || cap(out[1].Value) != len(big) {
		t.Errorf("large record: key %v, value %d bytes (cap %d)", out[1].Key, len(out[1].Value), cap(out[1].Value))
	}
	if out[2].Key == nil || len(out[2].Key) != 0 || out[2].Value != nil {
		t.Errorf("empty key and null value = %v, %v; want empty and nil", out[2].Key, out[2].Value)
	}
}

// The first record of a fetch, before any block exists, keeps an empty
// key and value empty, not null: a null value is a tombstone.
func TestDrainKeepsEmptyApartFromNull(t *testing.T) {
	recs := []kafka.Record{
		{Offset: 0, Key: kafka.NewBytes([]byte{}), Value: kafka.NewBytes([]byte{})},
		{Offset: 1, Key: nil, Value: kafka.NewBytes([]byte{})},
		{Offset: 2, Key: kafka.NewBytes([]byte{}), Value: nil},
	}
	out, err := drain(kafka.NewRecordReader(recs...), 0)
	if err != nil || len(out) != 3 {
		t.Fatalf("drain = %d records, %v", len(out), err)
	}
	for i, want := range []struct{ keyNil, valueNil bool }{{false, false}, {true, false}, {false, true}} {
		if got := (out[i].Key == nil); got != want.keyNil || len(out[i].Key) != 0 {
			t.Errorf("record %d: key %#v, want nil %v", i, out[i].Key, want.keyNil)
		}
		if got := (out[i].Value == nil); got != want.valueNil || len(out[i].Value) != 0 {
			t.Errorf("record %d: value %#v, want nil %v", i, out[i].Value, want.valueNil)
		}
	}
}

// Own copies everything a record holds: changing the fetch's memory
// afterwards changes nothing in it, and null stays apart from empty.
func TestOwnSharesNothing(t *testing.T) {
	m := Message{Key: []byte("k"), Value: []byte("v"), Headers: []dedupe.Header{{Key: "a", Value: []byte("x")}, {Key: "empty"}}}
	o := m.Own()
	m.Key[0], m.Value[0], m.Headers[0].Value[0] = 'K', 'V', 'X'
	m.Headers[0].Key = "changed"
	if string(o.Key) != "k" || string(o.Value) != "v" || o.Headers[0].Key != "a" || string(o.Headers[0].Value) != "x" || o.Headers[1].Value != nil {
		t.Errorf("Own = %q %q %q", o.Key, o.Value, o.Headers)
	}
	if e := (Message{Key: []byte{}}).Own(); e.Key == nil || e.Value != nil || e.Headers != nil {
		t.Errorf("Own of an empty key and a null value = %#v", e)
	}
}
