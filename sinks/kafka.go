package sinks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
)

// Kafka writes messages with kafka-go's Client: one Produce request per
// topic partition, acks from all in-sync replicas, and the offsets handed
// back. It does not retry: a failed or timed-out produce may or may not
// have been appended, and only the caller, which knows the idempotency
// keys, can check the partition and decide (see the consumer package).
type Kafka struct {
	client *kafka.Client

	mu         sync.Mutex
	partitions map[string]int
}

// NewKafka returns a writer on client. It starts nothing.
func NewKafka(client *kafka.Client) *Kafka {
	return &Kafka{client: client, partitions: map[string]int{}}
}

// ErrAmbiguous wraps a produce failure after which the records may have
// been appended or not.
var ErrAmbiguous = errors.New("produce outcome unknown")

// Partitions returns the partition count of topic, cached.
func (k *Kafka) Partitions(ctx context.Context, topic string) (int, error) {
	k.mu.Lock()
	n, ok := k.partitions[topic]
	k.mu.Unlock()
	if ok {
		return n, nil
	}
	meta, err := k.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	for _, t := range meta.Topics {
		if t.Name == topic {
			if t.Error != nil {
				return 0, fmt.Errorf("metadata of %s: %w", topic, t.Error)
			}
			n = len(t.Partitions)
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("topic %s has no partitions (does it exist?)", topic)
	}
	k.mu.Lock()
	k.partitions[topic] = n
	k.mu.Unlock()
	return n, nil
}

var balancer = &kafka.Murmur2Balancer{}

// PartitionFor is the partition of key among n: murmur2, as Java producers
// and kafka-go's Murmur2Balancer pick it, so that results of one key stay
// in one partition whoever writes them.
func PartitionFor(key []byte, n int) int {
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	return balancer.Balance(kafka.Message{Key: key}, parts...)
}

// Write produces msgs and returns where each landed, in order.
func (k *Kafka) Write(ctx context.Context, msgs []Message) ([]Written, error) {
	out := make([]Written, len(msgs))
	type tp struct {
		topic     string
		partition int
	}
	groups := map[tp][]int{}
	var order []tp
	for i := range msgs {
		m := &msgs[i]
		p := m.Partition
		if p < 0 {
			n, err := k.Partitions(ctx, m.Topic)
			if err != nil {
				return nil, err
			}
			p = PartitionFor(m.Key, n)
		}
		key := tp{m.Topic, p}
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], i)
	}
	for _, key := range order {
		idx := groups[key]
		records := make([]kafka.Record, len(idx))
		for j, i := range idx {
			m := &msgs[i]
			records[j] = kafka.Record{Key: bytesOrNil(m.Key), Value: bytesOrNil(m.Value), Headers: toKafka(m.Headers)}
		}
		res, err := k.client.Produce(ctx, &kafka.ProduceRequest{
			Topic: key.topic, Partition: key.partition, RequiredAcks: kafka.RequireAll,
			Records: kafka.NewRecordReader(records...),
		})
		if err == nil && res.Error != nil {
			err = res.Error
		}
		if err != nil {
			return nil, classifyProduce(key.topic, key.partition, err)
		}
		for j, i := range idx {
			out[i] = Written{Partition: key.partition, Offset: res.BaseOffset + int64(j)}
		}
	}
	return out, nil
}

// classifyProduce tells a produce the broker refused (nothing appended)
// from one whose fate is unknown.
func classifyProduce(topic string, partition int, err error) error {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafka.RequestTimedOut, kafka.NotEnoughReplicasAfterAppend:
			return fmt.Errorf("produce to %s/%d: %w: %w", topic, partition, ErrAmbiguous, err)
		}
		return fmt.Errorf("produce to %s/%d: %w", topic, partition, err)
	}
	return fmt.Errorf("produce to %s/%d: %w: %w", topic, partition, ErrAmbiguous, err)
}

func bytesOrNil(b []byte) kafka.Bytes {
	if b == nil {
		return nil
	}
	return kafka.NewBytes(b)
}

func toKafka(hs []dedupe.Header) []kafka.Header {
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// FromKafka copies fetched headers: kafka-go may reuse their memory once
// the record set is read further.
func FromKafka(hs []kafka.Header) []dedupe.Header {
	out := make([]dedupe.Header, len(hs))
	for i, h := range hs {
		out[i] = dedupe.Header{Key: h.Key, Value: append([]byte(nil), h.Value...)}
	}
	return out
}

// Fetched is a record read back from a topic.
type Fetched struct {
	Offset int64
	Time   time.Time
	Message
}

// Fetch returns the records of one partition from offset, waiting up to
// maxWait for the first, and the partition's high watermark. It reads the
// input for the consumer as well as the output for recovery scans and
// replies, so that one code path turns fetch responses into messages.
func (k *Kafka) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]Fetched, int64, error) {
	res, err := k.client.Fetch(ctx, &kafka.FetchRequest{
		Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: 4 << 20, MaxWait: maxWait,
	})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err != nil {
		return nil, 0, fmt.Errorf("fetch %s/%d from %d: %w", topic, partition, offset, err)
	}
	recs, err := drain(res.Records, offset)
	if err != nil {
		return nil, 0, fmt.Errorf("fetch %s/%d from %d: %w", topic, partition, offset, err)
	}
	for i := range recs {
		recs[i].Topic, recs[i].Partition = topic, partition
	}
	return recs, res.HighWatermark, nil
}

// Read returns the records of one partition from offset up to the high
// watermark at the time of the call (at most max records, 0 for no limit).
func (k *Kafka) Read(ctx context.Context, topic string, partition int, offset int64, max int) ([]Fetched, error) {
	var out []Fetched
	for {
		recs, hw, err := k.Fetch(ctx, topic, partition, offset, 10*time.Millisecond)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			out = append(out, r)
			if max > 0 && len(out) >= max {
				return out, nil
			}
		}
		if len(recs) == 0 || recs[len(recs)-1].Offset+1 >= hw {
			return out, nil
		}
		offset = recs[len(recs)-1].Offset + 1
	}
}

// EndOffsets returns the next offset to be written of each partition of
// topic (the high watermark).
func (k *Kafka) EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, len(partitions))
	for i, p := range partitions {
		reqs[i] = kafka.LastOffsetOf(p)
	}
	res, err := k.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	out := make(map[int]int64, len(partitions))
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.LastOffset
	}
	return out, nil
}

// drain reads a record set, skipping records before from (a fetch returns
// whole batches).
func drain(rr kafka.RecordReader, from int64) ([]Fetched, error) {
	var out []Fetched
	if rr == nil {
		return nil, nil
	}
	for {
		r, err := rr.ReadRecord()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if r.Offset < from {
			continue
		}
		key, err := readBytes(r.Key)
		if err != nil {
			return nil, err
		}
		value, err := readBytes(r.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, Fetched{Offset: r.Offset, Time: r.Time, Message: Message{Key: key, Value: value, Headers: FromKafka(r.Headers)}})
	}
}

func readBytes(b kafka.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	return kafka.ReadAll(b)
}
