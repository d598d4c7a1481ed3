package dlq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// Reader reads single records back: a dead letter to show, the input
// record a dead letter came from, the first copy a conflict differs
// from. *sinks.Kafka is one.
type Reader interface {
	Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error)
	StartOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error)
	EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error)
	Partitions(ctx context.Context, topic string) (int, error)
}

// ErrGone is a record a topic no longer holds (retention, compaction), or
// never held.
var ErrGone = errors.New("gone from the topic")

// RecordAt reads the record at pos. A record the partition does not hold
// is an error wrapping ErrGone that says why; any other error is the
// broker's.
func RecordAt(ctx context.Context, r Reader, pos Position) (dedupe.Record, error) {
	recs, hw, err := r.Fetch(ctx, pos.Topic, pos.Partition, pos.Offset, 10*time.Millisecond)
	switch {
	case errors.Is(err, kafka.OffsetOutOfRange):
		return dedupe.Record{}, gone(ctx, r, pos)
	case errors.Is(err, sinks.ErrUnknownTopic):
		return dedupe.Record{}, noPartition(ctx, r, pos, err)
	case err != nil:
		return dedupe.Record{}, fmt.Errorf("read %s: %w", pos, err)
	case len(recs) == 0 && pos.Offset >= hw:
		return dedupe.Record{}, fmt.Errorf("%s: %w: the partition ends at offset %d", pos, ErrGone, hw)
	case len(recs) == 0 || recs[0].Offset != pos.Offset:
		// Offsets skipped by compaction, or a transaction marker.
		return dedupe.Record{}, fmt.Errorf("%s: %w: no record at that offset (compacted, or a transaction marker)", pos, ErrGone)
	}
	// A redrive keeps it until it is sent back: in memory of its own, not
	// its fetch's blocks.
	f := recs[0].Own()
	return dedupe.Record{Topic: pos.Topic, Partition: pos.Partition, Offset: recs[0].Offset, Time: recs[0].Time,
		Key: f.Key, Value: f.Value, Headers: f.Headers}, nil
}

// gone says why an offset is out of range: below the partition's start
// (retention, DeleteRecords) or at or past its end.
func gone(ctx context.Context, r Reader, pos Position) error {
	parts := []int{pos.Partition}
	starts, err := r.StartOffsets(ctx, pos.Topic, parts)
	if start, ok := starts[pos.Partition]; err == nil && ok && pos.Offset < start {
		return fmt.Errorf("%s: %w: deleted by retention (the partition now starts at offset %d)", pos, ErrGone, start)
	}
	ends, err := r.EndOffsets(ctx, pos.Topic, parts)
	if end, ok := ends[pos.Partition]; err == nil && ok && pos.Offset >= end {
		return fmt.Errorf("%s: %w: the partition ends at offset %d", pos, ErrGone, end)
	}
	return fmt.Errorf("%s: %w: the offset is outside those the partition holds", pos, ErrGone)
}

// noPartition says why a fetch found no such topic or partition: kafka-go
// says so too of a broker it cannot reach, so the topic's metadata is
// asked for.
func noPartition(ctx context.Context, r Reader, pos Position, fetchErr error) error {
	n, err := r.Partitions(ctx, pos.Topic)
	switch {
	case errors.Is(err, sinks.ErrUnknownTopic):
		return fmt.Errorf("%s: %w: the topic does not exist", pos, ErrGone)
	case err != nil:
		return fmt.Errorf("read %s: %w", pos, err)
	case pos.Partition >= n:
		return fmt.Errorf("%s: %w: the topic has %d partition(s)", pos, ErrGone, n)
	}
	return fmt.Errorf("read %s: %w", pos, fetchErr)
}
