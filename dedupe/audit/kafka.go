package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
)

// From is where a read starts: the earliest record a partition still
// holds, or the first record at or after a time.
type From struct {
	Time time.Time // zero: earliest
}

// ParseFrom reads --from: "earliest", a negative duration before now
// ("-24h"), or an RFC 3339 time.
func ParseFrom(s string, now time.Time) (From, error) {
	switch {
	case s == "" || s == "earliest":
		return From{}, nil
	case strings.HasPrefix(s, "-"):
		d, err := time.ParseDuration(s[1:])
		if err != nil || d <= 0 {
			return From{}, fmt.Errorf("%q: want earliest, -DURATION (-24h) or an RFC 3339 time", s)
		}
		return From{Time: now.Add(-d)}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return From{}, fmt.Errorf("%q: want earliest, -DURATION (-24h) or an RFC 3339 time", s)
	}
	return From{Time: t}, nil
}

func (f From) String() string {
	if f.Time.IsZero() {
		return "earliest"
	}
	return f.Time.Format(time.RFC3339)
}

// Progress is reported while a topic is read.
type Progress struct {
	Pass  int   // 1, or 2 for the second reading
	Read  int64 // records read in this pass
	Total int64 // records the pass will read
}

// KafkaTopic reads every partition of a topic from From to the end
// offsets seen when it first reads, or MaxRecords records, without a
// consumer group and without committing anything: the topic and its
// consumers are left as they were. It can be read again (Scan) and then
// reads the same records in the same order.
type KafkaTopic struct {
	Client     *kafka.Client
	Topic      string
	From       From
	MaxRecords int64
	// Progress, when set, is called now and then from the goroutine that
	// calls Scan, and once at the end of each pass.
	Progress func(Progress)

	once   sync.Once
	ranges []partRange
	err    error
	passes int
}

type partRange struct {
	partition  int
	start, end int64
}

// Partitions resolves the range (if not done yet) and returns the number
// of partitions of the topic.
func (k *KafkaTopic) Partitions(ctx context.Context) (int, error) {
	k.once.Do(func() { k.err = k.resolve(ctx) })
	return len(k.ranges), k.err
}

// Total returns the number of records a pass reads.
func (k *KafkaTopic) Total() int64 {
	var n int64
	for _, r := range k.ranges {
		n += r.end - r.start
	}
	if k.MaxRecords > 0 {
		n = min(n, k.MaxRecords)
	}
	return n
}

func (k *KafkaTopic) resolve(ctx context.Context) error {
	md, err := k.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{k.Topic}})
	if err != nil {
		return fmt.Errorf("metadata of %s: %w", k.Topic, err)
	}
	n := 0
	for _, t := range md.Topics {
		if t.Name == k.Topic {
			if t.Error != nil {
				return fmt.Errorf("topic %s: %w", k.Topic, t.Error)
			}
			n = len(t.Partitions)
		}
	}
	if n == 0 {
		return fmt.Errorf("topic %s has no partitions (does it exist?)", k.Topic)
	}
	list := func(req func(p int) kafka.OffsetRequest) (map[int]kafka.PartitionOffsets, error) {
		reqs := make([]kafka.OffsetRequest, n)
		for p := range n {
			reqs[p] = req(p)
		}
		res, err := k.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{k.Topic: reqs}})
		if err != nil {
			return nil, fmt.Errorf("list offsets of %s: %w", k.Topic, err)
		}
		out := map[int]kafka.PartitionOffsets{}
		for _, po := range res.Topics[k.Topic] {
			if po.Error != nil {
				return nil, fmt.Errorf("list offsets of %s/%d: %w", k.Topic, po.Partition, po.Error)
			}
			out[po.Partition] = po
		}
		return out, nil
	}
	ends, err := list(kafka.LastOffsetOf)
	if err != nil {
		return err
	}
	var starts map[int]kafka.PartitionOffsets
	if k.From.Time.IsZero() {
		starts, err = list(kafka.FirstOffsetOf)
	} else {
		starts, err = list(func(p int) kafka.OffsetRequest { return kafka.TimeOffsetOf(p, k.From.Time) })
	}
	if err != nil {
		return err
	}
	for p := range n {
		end := ends[p].LastOffset
		start := starts[p].FirstOffset
		if !k.From.Time.IsZero() {
			start = end // nothing at or after the time
			for off := range starts[p].Offsets {
				if off >= 0 {
					start = min(off, end)
				}
			}
		}
		k.ranges = append(k.ranges, partRange{partition: p, start: max(start, 0), end: end})
	}
	return nil
}

type fetched struct {
	recs []dedupe.Record
	err  error
}

// Scan reads the range once. Partitions are fetched concurrently and
// merged by record timestamp (ties by partition), each in offset order.
func (k *KafkaTopic) Scan(ctx context.Context, fn func(*dedupe.Record) error) error {
	if _, err := k.Partitions(ctx); err != nil {
		return err
	}
	k.passes++
	pass, total := k.passes, k.Total()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Fetch sizes shrink with the partition count so that the batches in
	// flight stay near 64 MB.
	maxBytes := min(max(64<<20/len(k.ranges), 256<<10), 4<<20)
	chans := make([]chan fetched, len(k.ranges))
	var wg sync.WaitGroup
	for i, r := range k.ranges {
		chans[i] = make(chan fetched, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(chans[i])
			k.fetchLoop(ctx, r, maxBytes, chans[i])
		}()
	}
	defer wg.Wait()
	defer cancel()

	heads := make([][]dedupe.Record, len(chans))
	done := make([]bool, len(chans))
	refill := func(i int) error {
		for len(heads[i]) == 0 && !done[i] {
			f, ok := <-chans[i]
			if !ok {
				done[i] = true
				return nil
			}
			if f.err != nil {
				return f.err
			}
			heads[i] = f.recs
		}
		return nil
	}
	for i := range heads {
		if err := refill(i); err != nil {
			return err
		}
	}
	var read int64
	last := time.Now()
	report := func() {
		if k.Progress != nil {
			k.Progress(Progress{Pass: pass, Read: read, Total: total})
		}
	}
	for k.MaxRecords <= 0 || read < k.MaxRecords {
		best := -1
		for i, h := range heads {
			if len(h) == 0 {
				continue
			}
			if best < 0 || h[0].Time.Before(heads[best][0].Time) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		rec := &heads[best][0]
		if err := fn(rec); err != nil {
			return err
		}
		heads[best][0] = dedupe.Record{}
		heads[best] = heads[best][1:]
		read++
		if read%4096 == 0 && time.Since(last) > 200*time.Millisecond {
			last = time.Now()
			report()
		}
		if err := refill(best); err != nil {
			return err
		}
	}
	report()
	return nil
}

// fetchLoop reads one partition's range in batches.
func (k *KafkaTopic) fetchLoop(ctx context.Context, r partRange, maxBytes int, out chan<- fetched) {
	send := func(f fetched) bool {
		select {
		case out <- f:
			return true
		case <-ctx.Done():
			return false
		}
	}
	off, empty := r.start, 0
	for off < r.end {
		res, err := k.Client.Fetch(ctx, &kafka.FetchRequest{
			Topic: k.Topic, Partition: r.partition, Offset: off,
			MinBytes: 1, MaxBytes: int64(maxBytes), MaxWait: 100 * time.Millisecond,
		})
		if err == nil && res.Error != nil {
			err = res.Error
		}
		var recs []dedupe.Record
		if err == nil {
			recs, err = k.decode(res.Records, r, off)
		}
		if err != nil {
			if ctx.Err() == nil {
				send(fetched{err: fmt.Errorf("fetch %s/%d from %d: %w", k.Topic, r.partition, off, err)})
			}
			return
		}
		if len(recs) == 0 {
			// Offsets can be skipped (compaction, transaction markers):
			// an empty answer with nothing left below the end is the end.
			if empty++; empty >= 3 || (res.HighWatermark > 0 && off >= res.HighWatermark) {
				return
			}
			continue
		}
		empty = 0
		off = recs[len(recs)-1].Offset + 1
		if !send(fetched{recs: recs}) {
			return
		}
	}
}

func (k *KafkaTopic) decode(rr kafka.RecordReader, r partRange, from int64) ([]dedupe.Record, error) {
	if rr == nil {
		return nil, nil
	}
	var out []dedupe.Record
	for {
		rec, err := rr.ReadRecord()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if rec.Offset < from {
			continue // a fetch returns whole batches
		}
		if rec.Offset >= r.end {
			return out, nil
		}
		d := dedupe.Record{Topic: k.Topic, Partition: r.partition, Offset: rec.Offset, Time: rec.Time}
		if rec.Key != nil {
			if d.Key, err = kafka.ReadAll(rec.Key); err != nil {
				return nil, err
			}
		}
		if rec.Value != nil {
			if d.Value, err = kafka.ReadAll(rec.Value); err != nil {
				return nil, err
			}
		}
		if len(rec.Headers) > 0 {
			d.Headers = make([]dedupe.Header, len(rec.Headers))
			for i, h := range rec.Headers {
				d.Headers[i] = dedupe.Header{Key: h.Key, Value: append([]byte(nil), h.Value...)}
			}
		}
		out = append(out, d)
	}
}
