package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// t0 is the time of the test topics' first record.
var t0 = time.Date(2026, 3, 1, 9, 58, 12, 0, time.UTC)

func header(k, v string) dedupe.Header { return dedupe.Header{Key: k, Value: []byte(v)} }

// command is an input record of topic "in" at partition/offset.
func command(partition int, offset int64, key, body string, extra ...dedupe.Header) dedupe.Record {
	hs := append([]dedupe.Header{header("Idempotency-Key", key)}, extra...)
	return dedupe.Record{Topic: "in", Partition: partition, Offset: offset, Key: []byte("mk-" + key), Value: []byte(body), Headers: hs,
		Time: t0.Add(time.Duration(offset) * time.Second)}
}

// letter is the dead letter idemstream writes for in, as the consumer
// builds it (internal/envelope), read back from "dlq" at offset.
type letter struct {
	in      dedupe.Record
	reason  dedupe.Reason
	cause   error
	fp      string
	first   string // a conflict's first source
	firstFP string
	paths   []string
	at      time.Time
}

func (l letter) message() sinks.Message {
	o := &dedupe.Outcome{Fingerprint: l.fp}
	if l.reason != dedupe.ReasonMissingKey && l.reason != dedupe.ReasonInvalidKey {
		o.Key, _ = sinks.HeaderValue(l.in.Headers, "Idempotency-Key")
	}
	o.Decision.Entry.Fingerprint, o.Decision.Entry.FirstSource = l.firstFP, l.first
	cause := l.cause
	if cause == nil {
		cause = errors.New(string(l.reason))
	}
	return envelope.DeadLetter("dlq", &l.in, o, l.reason, cause, l.paths)
}

func (l letter) record(partition int, offset int64) dedupe.Record {
	m := l.message()
	at := l.at
	if at.IsZero() {
		at = l.in.Time.Add(time.Second)
	}
	return dedupe.Record{Topic: "dlq", Partition: partition, Offset: offset, Key: m.Key, Value: m.Value, Headers: m.Headers, Time: at}
}

func failed(in dedupe.Record) letter {
	return letter{in: in, reason: dedupe.ReasonHandlerFailed, fp: fingerprint(in.Value), cause: errors.New("coupon service: 503 Service Unavailable")}
}

func conflict(in dedupe.Record, first string, paths ...string) letter {
	return letter{in: in, reason: dedupe.ReasonConflict, fp: fingerprint(in.Value), first: first, firstFP: "sha256:first-" + first, paths: paths,
		cause: errors.New("key reused with another body inside the window")}
}

// fingerprint is the fingerprint under rules without volatile fields.
func fingerprint(body []byte) string {
	c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{})
	if err != nil {
		panic(err)
	}
	fp, err := c.Fingerprint(body)
	if err != nil {
		return ""
	}
	return fp
}

// cluster is an in-process Kafka with the test's topics.
func cluster(t *testing.T, partitions int32, topics ...string) *sinks.Kafka {
	t.Helper()
	k, _ := clusterClient(t, partitions, topics...)
	return k
}

// clusterClient is cluster, with the client it reads and writes through.
func clusterClient(t *testing.T, partitions int32, topics ...string) (*sinks.Kafka, *kafka.Client) {
	t.Helper()
	client, _ := testenv.FakeKafka(t, partitions, topics...)
	return sinks.NewKafka(client), client
}

// putAt writes m to its partition with the timestamp at, as the host
// that wrote it stamped it, and returns its offset.
func putAt(t *testing.T, c *kafka.Client, at time.Time, m sinks.Message) int64 {
	t.Helper()
	rec := kafka.Record{Time: at, Value: kafka.NewBytes(m.Value)}
	if m.Key != nil {
		rec.Key = kafka.NewBytes(m.Key)
	}
	for _, h := range m.Headers {
		rec.Headers = append(rec.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	res, err := c.Produce(context.Background(), &kafka.ProduceRequest{Topic: m.Topic, Partition: m.Partition, RequiredAcks: kafka.RequireAll,
		Records: kafka.NewRecordReader(rec)})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err != nil {
		t.Fatal(err)
	}
	return res.BaseOffset
}

// put writes msgs to their partitions, in order, and returns where each
// landed.
func put(t *testing.T, k *sinks.Kafka, msgs ...sinks.Message) []sinks.Written {
	t.Helper()
	w, err := k.Write(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// inputMessage is the message that puts rec on "in" at its partition.
func inputMessage(rec dedupe.Record) sinks.Message {
	return sinks.Message{Topic: "in", Partition: rec.Partition, Key: rec.Key, Value: rec.Value, Headers: rec.Headers}
}

func readAll(t *testing.T, k *sinks.Kafka, topic string) []sinks.Fetched {
	t.Helper()
	n, err := k.Partitions(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []sinks.Fetched
	for p := range n {
		recs, err := k.Read(context.Background(), topic, p, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, recs...)
	}
	return out
}

func uuidOf(i int) string { return fmt.Sprintf("9f8a2c1d-3e4f-4a5b-8c6d-%012d", i) }
