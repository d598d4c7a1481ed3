package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestUniqueName(t *testing.T) {
	a, b := UniqueName(t, "orders.in_v1"), UniqueName(t, "orders.in_v1")
	if a == b {
		t.Fatalf("two calls gave %q", a)
	}
	for _, name := range []string{a, b} {
		if !strings.HasPrefix(name, "orders-in-v1-TestUniqueName-") {
			t.Errorf("%q: want the base and the test's name first", name)
		}
		if strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
			t.Errorf("%q: characters other than letters, digits and '-'", name)
		}
	}
}

// testLogger sends kafka-go's error log to the test's log while the test
// runs, and drops it afterwards (a late line would panic the test binary).
type testLogger struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func newTestLogger(t testing.TB) *testLogger {
	l := &testLogger{t: t}
	t.Cleanup(func() { l.mu.Lock(); l.done = true; l.mu.Unlock() })
	return l
}

func (l *testLogger) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Logf("kafka-go: "+format, args...)
	}
}

// TestKafkaGroupRoundTrip proves that kafka-go speaks every API the
// project relies on with the test broker: CreateTopics and Metadata,
// Produce with acks=all and headers, a consumer group's FindCoordinator,
// JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetFetch and
// OffsetCommit, ListOffsets and Fetch.
func TestKafkaGroupRoundTrip(t *testing.T) {
	brokers := KafkaBrokers(t)
	topic, group := UniqueName(t, "roundtrip"), UniqueName(t, "group")
	const partitions, perPartition = 3, 10
	CreateTopics(t, brokers, partitions, topic)
	CreateTopics(t, brokers, partitions, topic) // idempotent
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logger := newTestLogger(t)
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}

	// Produce: round robin puts perPartition records in each partition.
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		ErrorLogger:  logger,
	}
	var out []kafka.Message
	for i := range partitions * perPartition {
		out = append(out, kafka.Message{
			Key:   fmt.Appendf(nil, "key-%d", i),
			Value: fmt.Appendf(nil, "value-%d", i),
			Headers: []kafka.Header{
				{Key: "idem-key", Value: fmt.Appendf(nil, "k%d", i)},
				{Key: "seq", Value: fmt.Appendf(nil, "%d", i)},
			},
		})
	}
	if err := w.WriteMessages(ctx, out...); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close writer: %v", err)
	}

	// Consume in a group, from the first offset, and commit synchronously.
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        brokers,
		GroupID:        group,
		Topic:          topic,
		StartOffset:    kafka.FirstOffset,
		MinBytes:       1,
		MaxBytes:       1 << 20,
		MaxWait:        100 * time.Millisecond,
		CommitInterval: 0,
		ErrorLogger:    logger,
	})
	got := map[string]kafka.Message{}
	next := map[int]int64{} // partition -> next offset after the last read
	for len(got) < len(out) {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			_ = r.Close()
			t.Fatalf("fetch after %d of %d records: %v", len(got), len(out), err)
		}
		got[string(m.Key)] = m
		next[m.Partition] = max(next[m.Partition], m.Offset+1)
		if err := r.CommitMessages(ctx, m); err != nil {
			_ = r.Close()
			t.Fatalf("commit %s/%d@%d: %v", m.Topic, m.Partition, m.Offset, err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatalf("close reader: %v", err)
	}
	for _, m := range out {
		g, ok := got[string(m.Key)]
		if !ok {
			t.Fatalf("record %s not consumed", m.Key)
		}
		if string(g.Value) != string(m.Value) {
			t.Errorf("record %s: value %q, want %q", m.Key, g.Value, m.Value)
		}
		if len(g.Headers) != 2 || g.Headers[0].Key != "idem-key" || string(g.Headers[0].Value) != string(m.Headers[0].Value) ||
			g.Headers[1].Key != "seq" || string(g.Headers[1].Value) != string(m.Headers[1].Value) {
			t.Errorf("record %s: headers %v, want %v", m.Key, g.Headers, m.Headers)
		}
	}
	if len(next) != partitions {
		t.Fatalf("records came from partitions %v, want all %d", next, partitions)
	}
	for p, n := range next {
		if n != perPartition {
			t.Errorf("partition %d: read up to offset %d, want %d", p, n, perPartition)
		}
	}

	// The broker kept the commits.
	checkCommitted(ctx, t, client, group, topic, next)

	// One more record in each partition, then the group again through the
	// explicit generation API: the assignment resumes at the committed
	// offsets, and a generation's commit lands.
	w = &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond, ErrorLogger: logger,
	}
	var more []kafka.Message
	for i := range partitions {
		more = append(more, kafka.Message{Key: fmt.Appendf(nil, "more-%d", i), Value: []byte("more")})
	}
	if err := w.WriteMessages(ctx, more...); err != nil {
		t.Fatalf("produce more: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close writer: %v", err)
	}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:          group,
		Brokers:     brokers,
		Topics:      []string{topic},
		StartOffset: kafka.FirstOffset,
		ErrorLogger: logger,
	})
	if err != nil {
		t.Fatalf("consumer group: %v", err)
	}
	defer cg.Close()
	gen, err := cg.Next(ctx)
	if err != nil {
		t.Fatalf("join group %s: %v", group, err)
	}
	assigned := gen.Assignments[topic]
	if len(assigned) != partitions {
		t.Fatalf("generation %d assigned %v, want all %d partitions", gen.ID, assigned, partitions)
	}
	commit := map[int]int64{}
	for _, a := range assigned {
		if a.Offset != next[a.ID] {
			t.Errorf("partition %d assigned at offset %d, want the committed %d", a.ID, a.Offset, next[a.ID])
		}
		pr := kafka.NewReader(kafka.ReaderConfig{
			Brokers: brokers, Topic: topic, Partition: a.ID, MinBytes: 1, MaxBytes: 1 << 20,
			MaxWait:     100 * time.Millisecond,
			ErrorLogger: logger,
		})
		if err := pr.SetOffset(a.Offset); err != nil {
			t.Fatalf("seek partition %d: %v", a.ID, err)
		}
		m, err := pr.ReadMessage(ctx)
		_ = pr.Close()
		if err != nil {
			t.Fatalf("read partition %d at %d: %v", a.ID, a.Offset, err)
		}
		if !strings.HasPrefix(string(m.Key), "more-") {
			t.Errorf("partition %d at %d: record %s, want a more-* one", a.ID, a.Offset, m.Key)
		}
		commit[a.ID] = m.Offset + 1
	}
	if err := gen.CommitOffsets(map[string]map[int]int64{topic: commit}); err != nil {
		t.Fatalf("commit generation %d: %v", gen.ID, err)
	}
	if err := cg.Close(); err != nil && !errors.Is(err, kafka.ErrGroupClosed) {
		t.Fatalf("leave group: %v", err)
	}
	checkCommitted(ctx, t, client, group, topic, commit)
}

func checkCommitted(ctx context.Context, t *testing.T, client *kafka.Client, group, topic string, want map[int]int64) {
	t.Helper()
	var ids []int
	for p := range want {
		ids = append(ids, p)
	}
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	if res.Error != nil {
		t.Fatalf("offset fetch: %v", res.Error)
	}
	seen := 0
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Errorf("offset fetch partition %d: %v", p.Partition, p.Error)
			continue
		}
		seen++
		if p.CommittedOffset != want[p.Partition] {
			t.Errorf("partition %d: committed %d, want %d", p.Partition, p.CommittedOffset, want[p.Partition])
		}
	}
	if seen != len(want) {
		t.Errorf("offset fetch returned %v, want %d partitions", res.Topics[topic], len(want))
	}
}
