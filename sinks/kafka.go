package sinks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/partition"
)

// Kafka writes messages with kafka-go's Client: requests per topic
// partition of at most MaxRequestBytes, acks from all in-sync replicas, and
// the offsets handed back. It does not retry: a failed or timed-out produce
// may or may not have been appended, and only the caller, which knows the
// idempotency keys, can check the partition and decide (see the consumer
// package).
type Kafka struct {
	client *kafka.Client
	// MaxRequestBytes bounds the records of one produce request (about
	// their size uncompressed), below the brokers' message.max.bytes
	// (1 MiB by default). A larger single record is sent alone.
	MaxRequestBytes int
	// PartitionsTTL is how long a topic's partition count is reused before
	// it is read again, so that added partitions are seen.
	PartitionsTTL time.Duration
	// Compression of every request (kafka.compression; DefaultCompression).
	// A command that arrived in a compressed batch may be far larger than
	// message.max.bytes once decompressed: written back uncompressed, its
	// result or dead letter would be refused.
	Compression kafka.Compression

	mu         sync.Mutex
	partitions map[string]partitionCount
	dialer     *kafka.Dialer // set by Connect
}

type partitionCount struct {
	n    int
	read time.Time
}

// NewKafka returns a writer on client. It starts nothing.
func NewKafka(client *kafka.Client) *Kafka {
	return &Kafka{client: client, MaxRequestBytes: 512 << 10, PartitionsTTL: 30 * time.Second, Compression: DefaultCompression,
		partitions: map[string]partitionCount{}}
}

// DefaultCompression is lz4: the codec producers pick most for throughput,
// and the cheapest in CPU of those that shrink JSON several times.
const DefaultCompression = kafka.Lz4

// ParseCompression reads a kafka.compression value: zstd, lz4, snappy,
// gzip or none.
func ParseCompression(s string) (kafka.Compression, error) {
	switch s {
	case "none":
		return 0, nil
	case "zstd":
		return kafka.Zstd, nil
	case "lz4":
		return kafka.Lz4, nil
	case "snappy":
		return kafka.Snappy, nil
	case "gzip":
		return kafka.Gzip, nil
	}
	return 0, fmt.Errorf("%q: want zstd, lz4, snappy, gzip or none", s)
}

// ErrAmbiguous wraps a produce failure after which the records may have
// been appended or not.
var ErrAmbiguous = errors.New("produce outcome unknown")

// ErrUnknownTopic wraps a metadata answer that a topic does not exist.
// It may pass (a topic being created is not yet known to every broker), so
// it is retryable; a caller that must not wait for ever bounds the wait.
var ErrUnknownTopic = errors.New("unknown topic")

// errNotSent marks messages that were not sent because an earlier request
// of their partition failed: their order must hold.
var errNotSent = fmt.Errorf("%w: not sent, an earlier request of the partition failed", dedupe.ErrBrokerUnavailable)

// Partitions returns the partition count of topic, read again after
// PartitionsTTL.
func (k *Kafka) Partitions(ctx context.Context, topic string) (int, error) {
	k.mu.Lock()
	c, ok := k.partitions[topic]
	k.mu.Unlock()
	if ok && time.Since(c.read) < k.PartitionsTTL {
		return c.n, nil
	}
	meta, err := k.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("metadata of %s: %w: %w", topic, dedupe.ErrBrokerUnavailable, err)
	}
	n := 0
	for _, t := range meta.Topics {
		if t.Name == topic {
			if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				return 0, fmt.Errorf("metadata of %s: %w: %w: %w", topic, ErrUnknownTopic, dedupe.ErrBrokerUnavailable, t.Error)
			}
			if t.Error != nil {
				return 0, fmt.Errorf("metadata of %s: %w", topic, classifyTopicError(t.Error))
			}
			n = len(t.Partitions)
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("topic %s has no partitions (does it exist?): %w", topic, dedupe.ErrBrokerRefused)
	}
	k.mu.Lock()
	k.partitions[topic] = partitionCount{n: n, read: time.Now()}
	k.mu.Unlock()
	return n, nil
}

// classifyTopicError tells a request the cluster refuses for good from one
// that may pass. Only errors that say so are final: kafka-go reports a
// request to a broker that died as error -1 (UNKNOWN) on every partition
// it led, and a broker restart must pause a pipeline, never stop it.
func classifyTopicError(err error) error {
	if refusedForGood(err) {
		return fmt.Errorf("%w: %w", dedupe.ErrBrokerRefused, err)
	}
	return fmt.Errorf("%w: %w", dedupe.ErrBrokerUnavailable, err)
}

// refusedForGood: authorization, an invalid topic, an unsupported request,
// failed authentication. Retrying cannot cure these; an operator must.
func refusedForGood(err error) bool {
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return false
	}
	switch kerr {
	case kafka.TopicAuthorizationFailed, kafka.GroupAuthorizationFailed, kafka.ClusterAuthorizationFailed,
		kafka.BrokerAuthorizationFailed, kafka.TransactionalIDAuthorizationFailed, kafka.DelegationTokenAuthorizationFailed,
		kafka.InvalidTopic, kafka.UnsupportedVersion, kafka.SASLAuthenticationFailed, kafka.InvalidRequiredAcks,
		kafka.UnsupportedForMessageFormat, kafka.InvalidRecord:
		return true
	}
	return false
}

// Write produces msgs and returns where each landed, in order. The
// messages of one topic partition go in order, in requests of at most
// MaxRequestBytes; after a request fails, the later ones of its partition
// are not sent. The error is nil when every message was acknowledged;
// otherwise it joins the failures, and each message that was not
// acknowledged carries its own in Written.Err: wrapping ErrAmbiguous when
// it may have been appended, dedupe.ErrPayloadTooLarge when the broker
// refused that record for its size (a request of several is split until
// the record is alone), dedupe.ErrBrokerRefused when retrying cannot help,
// dedupe.ErrBrokerUnavailable otherwise.
func (k *Kafka) Write(ctx context.Context, msgs []Message) ([]Written, error) {
	out := make([]Written, len(msgs))
	type tp struct {
		topic     string
		partition int
	}
	groups := map[tp][]int{}
	var order []tp
	var errs []error
	for i := range msgs {
		m := &msgs[i]
		p := m.Partition
		if p < 0 {
			n, err := k.Partitions(ctx, m.Topic)
			if err != nil {
				out[i] = Written{Partition: -1, Offset: dedupe.NoPosition, Err: err}
				errs = append(errs, err)
				continue
			}
			p = partition.For(m.Key, n)
		}
		key := tp{m.Topic, p}
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], i)
	}
	// The partitions are written side by side, each in order: written one
	// after the other, a batch whose results spread over six partitions
	// would wait for six acknowledgements in a row. Each partition fills
	// only its own elements of out.
	perPartition := make([]error, len(order))
	if len(order) == 1 {
		perPartition[0] = k.writePartition(ctx, order[0].topic, order[0].partition, msgs, groups[order[0]], out)
	} else {
		var wg sync.WaitGroup
		for g, key := range order {
			wg.Go(func() {
				perPartition[g] = k.writePartition(ctx, key.topic, key.partition, msgs, groups[key], out)
			})
		}
		wg.Wait()
	}
	for _, err := range perPartition {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// writePartition writes msgs[idx...] to one partition in requests of at
// most MaxRequestBytes, filling out.
func (k *Kafka) writePartition(ctx context.Context, topic string, partition int, msgs []Message, idx []int, out []Written) error {
	var firstErr error
	fail := func(rest []int, err error) {
		for _, i := range rest {
			out[i] = Written{Partition: partition, Offset: dedupe.NoPosition, Err: err}
		}
		if firstErr == nil && len(rest) > 0 {
			firstErr = err
		}
	}
	limit := len(idx) // records per request, halved while the broker finds requests too large
	for len(idx) > 0 {
		n, size := 0, 0
		for n < len(idx) && n < limit && (n == 0 || size+recordSize(&msgs[idx[n]]) <= k.MaxRequestBytes) {
			size += recordSize(&msgs[idx[n]])
			n++
		}
		err := k.produce(ctx, topic, partition, msgs, idx[:n], out)
		switch {
		case err == nil:
			idx = idx[n:]
		case errors.Is(err, dedupe.ErrPayloadTooLarge) && n > 1:
			// The broker's limit is below ours; a refused request
			// appended nothing.
			limit = n / 2
		case errors.Is(err, dedupe.ErrPayloadTooLarge):
			// That record alone is too large: the others go on.
			fail(idx[:1], err)
			idx = idx[1:]
		default:
			fail(idx[:n], err)
			fail(idx[n:], errNotSent)
			return firstErr
		}
	}
	return firstErr
}

func (k *Kafka) produce(ctx context.Context, topic string, partition int, msgs []Message, idx []int, out []Written) error {
	res, err := k.client.Produce(ctx, &kafka.ProduceRequest{
		Topic: topic, Partition: partition, RequiredAcks: kafka.RequireAll, Compression: k.Compression,
		Records: kafka.NewRecordReader(kafkaRecords(msgs, idx)...),
	})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err != nil {
		return classifyProduce(topic, partition, len(idx), err)
	}
	for j, i := range idx {
		out[i] = Written{Partition: partition, Offset: res.BaseOffset + int64(j)}
	}
	return nil
}

// recordSize estimates a record's bytes in a produce request.
func recordSize(m *Message) int {
	n := len(m.Key) + len(m.Value) + 24
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value) + 4
	}
	return n
}

// classifyProduce is the one place that tells what a failed produce
// means: refused for good (nothing appended, retrying cannot help),
// refused for now (nothing appended), or of unknown outcome. Only errors
// a broker returns before it appends count as "nothing appended"; any
// other, once the request was sent, may come after an append: a leader
// that loses its leadership while an acks=all produce waits for its
// followers answers NOT_LEADER_OR_FOLLOWER, and the new leader may hold
// the records.
func classifyProduce(topic string, partition, records int, err error) error {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge:
			return fmt.Errorf("produce of %d record(s) to %s/%d: %w: %w", records, topic, partition, dedupe.ErrPayloadTooLarge, err)
		case kafka.UnknownTopicOrPartition:
			return fmt.Errorf("produce to %s/%d: %w: %w: %w", topic, partition, ErrUnknownTopic, dedupe.ErrBrokerUnavailable, err)
		case kafka.NotEnoughReplicas, kafka.LeaderNotAvailable, kafka.InvalidMessage, kafka.ThrottlingQuotaExceeded:
			// Checked before the append.
			return fmt.Errorf("produce to %s/%d: %w: %w", topic, partition, dedupe.ErrBrokerUnavailable, err)
		}
		if refusedForGood(kerr) {
			return fmt.Errorf("produce to %s/%d: %w: %w", topic, partition, dedupe.ErrBrokerRefused, err)
		}
		return fmt.Errorf("produce to %s/%d: %w: %w: %w", topic, partition, dedupe.ErrBrokerUnavailable, ErrAmbiguous, err)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("produce to %s/%d: %w: %w", topic, partition, ErrAmbiguous, err)
	}
	return fmt.Errorf("produce to %s/%d: %w: %w: %w", topic, partition, dedupe.ErrBrokerUnavailable, ErrAmbiguous, err)
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
	return k.FetchUpTo(ctx, topic, partition, offset, maxWait, 0)
}

// FetchUpTo is Fetch with its own bound on the bytes returned (at least one
// whole batch comes back, whatever its size; 0 or less: 4 MiB).
func (k *Kafka) FetchUpTo(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration, maxBytes int) ([]Fetched, int64, error) {
	if maxBytes <= 0 {
		maxBytes = 4 << 20
	}
	res, err := k.client.Fetch(ctx, &kafka.FetchRequest{
		Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: int64(maxBytes), MaxWait: maxWait,
	})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err != nil {
		if errors.Is(err, kafka.OffsetOutOfRange) {
			return nil, 0, fmt.Errorf("fetch %s/%d from %d: %w", topic, partition, offset, err)
		}
		if errors.Is(err, kafka.UnknownTopicOrPartition) || errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, protocol.ErrNoPartition) {
			return nil, 0, fmt.Errorf("fetch %s/%d from %d: %w: %w: %w", topic, partition, offset, ErrUnknownTopic, dedupe.ErrBrokerUnavailable, err)
		}
		return nil, 0, fmt.Errorf("fetch %s/%d from %d: %w", topic, partition, offset, classifyTopicError(err))
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
	return k.listOffsets(ctx, topic, partitions, kafka.LastOffsetOf, func(po kafka.PartitionOffsets) int64 { return po.LastOffset })
}

// StartOffsets returns the first offset each partition of topic still
// holds (the log start offset, after retention or DeleteRecords).
func (k *Kafka) StartOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	return k.listOffsets(ctx, topic, partitions, kafka.FirstOffsetOf, func(po kafka.PartitionOffsets) int64 { return po.FirstOffset })
}

// OffsetsAt returns, for each partition of topic, the offset of its first
// record with a timestamp at or after t, or the end offset when there is
// none.
func (k *Kafka) OffsetsAt(ctx context.Context, topic string, partitions []int, t time.Time) (map[int]int64, error) {
	// One request for the times and one for the ends: a partition may
	// appear once per request.
	ends, err := k.EndOffsets(ctx, topic, partitions)
	if err != nil {
		return nil, err
	}
	found, err := k.listOffsets(ctx, topic, partitions, func(p int) kafka.OffsetRequest { return kafka.TimeOffsetOf(p, t) },
		func(po kafka.PartitionOffsets) int64 {
			at := int64(-1)
			for off := range po.Offsets {
				if off >= 0 && (at < 0 || off < at) {
					at = off
				}
			}
			return at
		})
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(partitions))
	for _, p := range partitions {
		at, ok := found[p]
		if !ok || at < 0 {
			at = ends[p]
		}
		out[p] = at
	}
	return out, nil
}

func (k *Kafka) listOffsets(ctx context.Context, topic string, partitions []int, of func(int) kafka.OffsetRequest, pick func(kafka.PartitionOffsets) int64) (map[int]int64, error) {
	reqs := make([]kafka.OffsetRequest, len(partitions))
	for i, p := range partitions {
		reqs[i] = of(p)
	}
	res, err := k.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w: %w", topic, dedupe.ErrBrokerUnavailable, err)
	}
	out := make(map[int]int64, len(partitions))
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, po.Partition, classifyTopicError(po.Error))
		}
		out[po.Partition] = pick(po)
	}
	return out, nil
}

// release hands a record's references to the fetch response's pages back
// to kafka-go: a page (64 KiB) returns to its pool when every record on it
// is released, and is otherwise left to the collector, so that each fetch
// allocates and zeroes new ones.
func release(key, value kafka.Bytes) {
	if key != nil {
		_ = key.Close()
	}
	if value != nil {
		_ = value.Close()
	}
}

// Dialer is the dialer of a consumer group on the same cluster with the
// same TLS and SASL (nil for a Kafka not made by Connect).
func (k *Kafka) Dialer() *kafka.Dialer { return k.dialer }

// Close closes the connections of a kafka.Transport that are idle (a
// request in flight keeps its own); the Kafka may still be used, and opens
// new ones.
func (k *Kafka) Close() error {
	if t, ok := k.client.Transport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	return nil
}
