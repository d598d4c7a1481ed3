package sinks_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

func newBroker(t *testing.T, partitions int32, topics ...string) (*kafka.Client, *sinks.Kafka) {
	t.Helper()
	client, _ := testenv.FakeKafka(t, partitions, topics...)
	return client, sinks.NewKafka(client)
}

// Fifty results of 30 KiB for one partition are more than the broker takes
// in one request (message.max.bytes, 1 MiB): they go in several, in order.
func TestWriteSplitsRequestsByBytes(t *testing.T) {
	_, k := newBroker(t, 1, "out")
	msgs := make([]sinks.Message, 50)
	for i := range msgs {
		msgs[i] = sinks.Message{Topic: "out", Partition: 0, Key: []byte(fmt.Sprint(i)), Value: bytes.Repeat([]byte{'x'}, 30<<10)}
	}
	written, err := k.Write(context.Background(), msgs)
	if err != nil {
		t.Fatalf("Write of 1.5 MB to one partition: %v", err)
	}
	for i, w := range written {
		if w.Err != nil || w.Offset != int64(i) {
			t.Errorf("message %d: %+v, want offset %d", i, w, i)
		}
	}
	// The broker's limit below ours: requests are halved until they fit.
	k.MaxRequestBytes = 4 << 20
	written, err = k.Write(context.Background(), msgs)
	if err != nil {
		t.Fatalf("Write with a request limit above the broker's: %v", err)
	}
	for i, w := range written {
		if w.Err != nil || w.Offset != int64(50+i) {
			t.Errorf("message %d: %+v, want offset %d", i, w, 50+i)
		}
	}
}

// A record the broker refuses for its size is that record's error alone:
// it is classified poison (a dead letter), and the others are written.
func TestWriteRefusesOneRecordTooLarge(t *testing.T) {
	_, k := newBroker(t, 1, "out")
	msgs := []sinks.Message{
		{Topic: "out", Partition: 0, Value: []byte("small-1")},
		{Topic: "out", Partition: 0, Value: incompressible(1200 << 10)},
		{Topic: "out", Partition: 0, Value: []byte("small-2")},
	}
	written, err := k.Write(context.Background(), msgs)
	if err == nil {
		t.Fatal("Write of a 1.2 MB record succeeded")
	}
	if written[1].Err == nil || dedupe.Classify(written[1].Err) != dedupe.Poison || dedupe.ReasonOf(written[1].Err) != dedupe.ReasonPayloadTooLarge {
		t.Errorf("too large record: %+v (class %v), want poison payload_too_large", written[1], dedupe.Classify(written[1].Err))
	}
	if written[0].Err != nil || written[2].Err != nil || written[0].Offset != 0 || written[2].Offset != 1 {
		t.Errorf("the other records: %+v %+v, want offsets 0 and 1", written[0], written[2])
	}
}

// A topic that does not exist is named as such, so that a caller can
// bound its wait for it (a topic being created is not known everywhere at
// once).
func TestMissingTopicIsNamed(t *testing.T) {
	_, k := newBroker(t, 1, "out")
	_, err := k.Partitions(context.Background(), "no-such-topic")
	if !errors.Is(err, sinks.ErrUnknownTopic) {
		t.Fatalf("partitions of a missing topic: %v, want ErrUnknownTopic", err)
	}
	written, err := k.Write(context.Background(), []sinks.Message{{Topic: "no-such-topic", Partition: -1, Value: []byte("v")}})
	if err == nil || !errors.Is(written[0].Err, sinks.ErrUnknownTopic) {
		t.Fatalf("write to a missing topic: %+v %v, want ErrUnknownTopic", written, err)
	}
}

// Partitions added to a topic are seen once the cached count is old.
func TestPartitionCountIsReadAgain(t *testing.T) {
	client, k := newBroker(t, 2, "out")
	// kafka-go's transport caches metadata too, for MetadataTTL, and gives
	// its own metadata request the TTL as its deadline: a TTL shorter than
	// a loaded machine's round trip would fail the request, not the cache.
	client.Transport = &kafka.Transport{MetadataTTL: 500 * time.Millisecond}
	k.PartitionsTTL = 0
	waitPartitions(t, k, "out", 2)
	res, err := client.CreatePartitions(context.Background(), &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: "out", Count: 4}}})
	if err != nil || res.Errors["out"] != nil {
		t.Fatalf("create partitions: %v %v", err, res)
	}
	waitPartitions(t, k, "out", 4)
}

// waitPartitions polls until the sink counts want partitions of topic.
func waitPartitions(t *testing.T, k *sinks.Kafka, topic string, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, err := k.Partitions(context.Background(), topic)
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions of %s = %d, %v; want %d", topic, n, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StartOffsets is the log start: after DeleteRecords, the first offset
// still held.
func TestStartOffsetsFollowDeletedRecords(t *testing.T) {
	client, k := newBroker(t, 1, "out")
	brokers := client.Addr.String()
	msgs := make([]sinks.Message, 10)
	for i := range msgs {
		msgs[i] = sinks.Message{Topic: "out", Partition: 0, Value: []byte("v")}
	}
	if _, err := k.Write(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	deleteRecords(t, brokers, "out", 0, 7)
	starts, err := k.StartOffsets(context.Background(), "out", []int{0})
	if err != nil || starts[0] != 7 {
		t.Fatalf("start offsets = %v, %v; want 7", starts, err)
	}
	_, _, err = k.Fetch(context.Background(), "out", 0, 3, 10*time.Millisecond)
	if !errors.Is(err, kafka.OffsetOutOfRange) {
		t.Errorf("fetch below the log start: %v, want OffsetOutOfRange", err)
	}
}

// deleteRecords moves the log start of topic/partition to offset, as
// retention or an operator's DeleteRecords does (kafka-go has no call for
// it).
func deleteRecords(t *testing.T, brokers, topic string, partition int32, offset int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 5000
	res, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	for _, rt := range res.Topics {
		for _, rp := range rt.Partitions {
			if rp.ErrorCode != 0 {
				t.Fatalf("delete records of %s/%d: error code %d", topic, rp.Partition, rp.ErrorCode)
			}
		}
	}
}

// Fetched headers are copied: nothing a record keeps points into kafka-go's memory.
func TestFromKafkaCopiesHeaderValues(t *testing.T) {
	in := []kafka.Header{{Key: "Idempotency-Key", Value: []byte("9f8a")}, {Key: "empty"}, {Key: "trace", Value: []byte("abc")}}
	out := sinks.FromKafka(in)
	in[0].Value[0], in[2].Value[0] = 'X', 'X'
	if len(out) != 3 || out[0].Key != "Idempotency-Key" || string(out[0].Value) != "9f8a" ||
		out[1].Key != "empty" || out[1].Value != nil || out[2].Key != "trace" || string(out[2].Value) != "abc" {
		t.Errorf("FromKafka = %q", out)
	}
	out[0].Value = append(out[0].Value, "more"...)
	if string(out[2].Value) != "abc" {
		t.Errorf("appending to one value changed the next: %q", out[2].Value)
	}
}

// Fetched keys and values are copies: the pages kafka-go read them from go
// back to its pool and carry the next fetch. A null key or value stays
// nil, an empty one stays empty.
func TestFetchedRecordsOutliveTheirPages(t *testing.T) {
	client, k := newBroker(t, 1, "in")
	cl, err := kgo.NewClient(kgo.SeedBrokers(client.Addr.String()), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(recs ...*kgo.Record) {
		t.Helper()
		if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const n = 200
	first := make([]*kgo.Record, n)
	for i := range first {
		first[i] = &kgo.Record{Key: []byte(fmt.Sprintf("key-%03d", i)), Value: bytes.Repeat([]byte{byte('a' + i%26)}, 900)}
	}
	first[1].Key, first[2].Key, first[3].Value, first[4].Value = nil, []byte{}, nil, []byte{}
	produce(first...)

	got, _, err := k.Fetch(context.Background(), "in", 0, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Later fetches of new records reuse the pages of the first one.
	for round := 0; round < 3; round++ {
		next := make([]*kgo.Record, n)
		for i := range next {
			next[i] = &kgo.Record{Key: []byte("other"), Value: bytes.Repeat([]byte{'#'}, 900)}
		}
		produce(next...)
		if _, _, err := k.Fetch(context.Background(), "in", 0, int64(n*(round+1)), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) == 0 || got[0].Offset != 1 {
		t.Fatalf("fetch from offset 1 returned %d records starting at %v", len(got), got)
	}
	for _, f := range got {
		want := first[f.Offset]
		if !bytes.Equal(f.Key, want.Key) || !bytes.Equal(f.Value, want.Value) {
			t.Fatalf("record %d: key %q, value %.20q…; want %q, %.20q…", f.Offset, f.Key, f.Value, want.Key, want.Value)
		}
		if (f.Key == nil) != (want.Key == nil) || (f.Value == nil) != (want.Value == nil) {
			t.Errorf("record %d: key nil %v, value nil %v; want %v, %v", f.Offset, f.Key == nil, f.Value == nil, want.Key == nil, want.Value == nil)
		}
	}
	if cap(got[4].Key) != len(got[4].Key) {
		t.Errorf("key of record 5 has room to grow into its value: len %d, cap %d", len(got[4].Key), cap(got[4].Key))
	}
}

// The partitions of one write are in flight together: each produce request
// is held until all four have reached the broker (or 10s have passed,
// which only writes sent one after the other need).
func TestWriteSendsPartitionsSideBySide(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(c.ListenAddrs()...), Timeout: 10 * time.Second})
	var arrived atomic.Int32
	var alone atomic.Bool
	together := make(chan struct{})
	c.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		if arrived.Add(1) == 4 {
			close(together)
		}
		c.SleepControl(func() {
			select {
			case <-together:
			case <-time.After(10 * time.Second):
				alone.Store(true)
			}
		})
		return nil, nil, false
	})
	var msgs []sinks.Message
	for i := range 8 {
		msgs = append(msgs, sinks.Message{Topic: "out", Partition: i % 4, Key: []byte(fmt.Sprint(i)), Value: []byte("v")})
	}
	written, err := k.Write(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range written {
		if w.Err != nil || w.Partition != i%4 || w.Offset != int64(i/4) {
			t.Errorf("message %d: %+v, want partition %d offset %d", i, w, i%4, i/4)
		}
	}
	if alone.Load() || arrived.Load() != 4 {
		t.Errorf("%d produce requests, and one waited 10s for the others: the partitions were written one after the other", arrived.Load())
	}
}

// incompressible returns n random bytes: no codec brings them under a
// limit they exceed.
func incompressible(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// A command of 3 MB that arrived compressed must go back compressed: with
// the default compression its copy (a dead letter, a result) is written,
// without it the broker refuses it for its size.
func TestCompressionWritesWhatArrivedCompressed(t *testing.T) {
	_, k := newBroker(t, 1, "out")
	big := bytes.Repeat([]byte(`{"coupon":"c-1","note":"aaaaaaaaaaaaaaaa"}`), (3<<20)/42)
	msgs := []sinks.Message{{Topic: "out", Partition: 0, Value: big}}
	written, err := k.Write(context.Background(), msgs)
	if err != nil || written[0].Offset != 0 {
		t.Fatalf("compressed write of %d bytes: %+v %v", len(big), written, err)
	}
	got, err := k.Read(context.Background(), "out", 0, 0, 0)
	if err != nil || len(got) != 1 || !bytes.Equal(got[0].Value, big) {
		t.Fatalf("read back: %d records, %v", len(got), err)
	}
	k.Compression = 0
	written, err = k.Write(context.Background(), msgs)
	if err == nil || dedupe.ReasonOf(written[0].Err) != dedupe.ReasonPayloadTooLarge {
		t.Errorf("uncompressed write of %d bytes: %+v %v, want refused for its size", len(big), written, err)
	}
}

func TestParseCompression(t *testing.T) {
	for in, want := range map[string]kafka.Compression{"none": 0, "zstd": kafka.Zstd, "lz4": kafka.Lz4, "snappy": kafka.Snappy, "gzip": kafka.Gzip} {
		if got, err := sinks.ParseCompression(in); err != nil || got != want {
			t.Errorf("ParseCompression(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := sinks.ParseCompression("brotli"); err == nil {
		t.Error("ParseCompression(brotli) succeeded")
	}
}

// A fetch of a partition the topic does not have says so (ErrUnknownTopic),
// and may pass (a partition being created): retryable.
func TestFetchOfAMissingPartitionIsUnknown(t *testing.T) {
	_, k := newBroker(t, 1, "out")
	_, _, err := k.Fetch(context.Background(), "out", 5, 0, 10*time.Millisecond)
	if !errors.Is(err, sinks.ErrUnknownTopic) || !dedupe.IsRetryable(err) {
		t.Errorf("fetch of out/5: %v, want ErrUnknownTopic and retryable", err)
	}
}
