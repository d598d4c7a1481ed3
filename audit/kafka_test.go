package audit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/audittest"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

func fakeCluster(t *testing.T, partitions int32, topics ...string) *kafka.Client {
	t.Helper()
	client, _ := testenv.FakeKafka(t, partitions, topics...)
	return client
}

func TestKafkaTopicPlantedPatterns(t *testing.T) {
	client := fakeCluster(t, 3, "claims")
	p := audittest.Plant("claims", 3)
	audittest.Produce(t, client, "claims", p.Records)
	var progress []audit.Progress
	src := &audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: "claims", Progress: func(pr audit.Progress) { progress = append(progress, pr) }}
	r, err := audit.Run(context.Background(), src, audit.Options{Policy: audittest.Policy(t)})
	if err != nil {
		t.Fatal(err)
	}
	audittest.Check(t, p, r)
	if r.Partitions != 3 || r.Passes != 2 {
		t.Errorf("partitions %d, passes %d; want 3 and 2", r.Partitions, r.Passes)
	}
	if n := len(progress); n < 2 || progress[n-1].Pass != 2 || progress[n-1].Read != p.Records0 || progress[n-1].Total != p.Records0 {
		t.Errorf("last progress = %+v, want pass 2 with %d of %d", progress, p.Records0, p.Records0)
	}
}

func TestKafkaTopicFromAndMaxRecords(t *testing.T) {
	client := fakeCluster(t, 3, "claims")
	p := audittest.Plant("claims", 3)
	audittest.Produce(t, client, "claims", p.Records)
	ctx := context.Background()

	count := func(src *audit.KafkaTopic) (n int64, first time.Time) {
		t.Helper()
		err := src.Scan(ctx, func(r *dedupe.Record) error {
			if n == 0 || r.Time.Before(first) {
				first = r.Time
			}
			n++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return n, first
	}
	if n, _ := count(&audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: "claims", MaxRecords: 100}); n != 100 {
		t.Errorf("--max-records 100 read %d records", n)
	}
	// The last two records are the keys reused three hours later.
	late := p.Records[len(p.Records)-1].Time.Add(-time.Second)
	n, first := count(&audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: "claims", From: audit.From{Time: late.Add(-2 * time.Second)}})
	if n != 2 || first.Before(late.Add(-2*time.Second)) {
		t.Errorf("--from %s read %d records from %s, want the 2 late ones", late, n, first)
	}
	if n, _ := count(&audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: "claims", From: audit.From{Time: time.Now().Add(time.Hour)}}); n != 0 {
		t.Errorf("--from in the future read %d records", n)
	}

	// The same source read twice gives the same records in the same order.
	src := &audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: "claims", MaxRecords: 300}
	var a, b []string
	for _, into := range []*[]string{&a, &b} {
		if err := src.Scan(ctx, func(r *dedupe.Record) error { *into = append(*into, r.Source()); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if len(a) != 300 || len(a) != len(b) {
		t.Fatalf("two readings: %d and %d records", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("reading twice: record %d is %s, then %s", i, a[i], b[i])
		}
	}

	if _, err := (&audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: "nope"}).Partitions(ctx); err == nil {
		t.Error("a topic that does not exist was read")
	}
}

// A scan whose context ends before it does reports it: the partitions
// whose fetches stopped would otherwise pass for read to their end, and
// an interrupted audit (or dlq summary) for a complete one.
func TestKafkaTopicScanCancelled(t *testing.T) {
	client := fakeCluster(t, 3, "claims")
	p := audittest.Plant("claims", 3)
	audittest.Produce(t, client, "claims", p.Records)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	read := 0
	err := (&audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: "claims"}).Scan(ctx, func(*dedupe.Record) error {
		if read++; read == 10 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a scan cancelled after %d records returned %v, want context.Canceled", read, err)
	}
}

func TestParseFrom(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"earliest":             {},
		"-24h":                 now.Add(-24 * time.Hour),
		"-90m":                 now.Add(-90 * time.Minute),
		"2026-02-28T10:00:00Z": time.Date(2026, 2, 28, 10, 0, 0, 0, time.UTC),
	} {
		got, err := audit.ParseFrom(in, now)
		if err != nil || !got.Time.Equal(want) {
			t.Errorf("ParseFrom(%q) = %v, %v; want %v", in, got.Time, err, want)
		}
	}
	for _, bad := range []string{"latest", "-", "-x", "24h", "yesterday"} {
		if _, err := audit.ParseFrom(bad, now); err == nil {
			t.Errorf("ParseFrom(%q) accepted", bad)
		}
	}
}

// The same planted topic on a real Apache Kafka broker.
func TestRealKafkaPlantedPatterns(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.UniqueName(t, "audit-claims")
	testenv.CreateTopics(t, brokers, 3, topic)
	transport := &kafka.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: transport}
	p := audittest.Plant(topic, 3)
	audittest.Produce(t, client, topic, p.Records)

	r, err := audit.Run(context.Background(), &audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: topic}, audit.Options{Policy: audittest.Policy(t)})
	if err != nil {
		t.Fatal(err)
	}
	audittest.Check(t, p, r)
	if r.Partitions != 3 || r.Passes != 2 {
		t.Errorf("partitions %d, passes %d", r.Partitions, r.Passes)
	}

	// --from a time: offsets by timestamp (ListOffsets with a time).
	late := p.Records[len(p.Records)-1].Time.Add(-3 * time.Second)
	var n int
	if err := (&audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: topic, From: audit.From{Time: late}}).Scan(context.Background(),
		func(*dedupe.Record) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("--from %s read %d records, want the 2 late ones", late.Format(time.RFC3339), n)
	}
}
