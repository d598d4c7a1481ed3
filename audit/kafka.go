package audit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
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
// reads the same records in the same order. It reads through sinks.Kafka,
// as the consumer does; Scan fetches every partition at once, each fetch
// bounded so that those in flight stay near 64 MB.
type KafkaTopic struct {
	Reader     *sinks.Kafka
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

// Partitions returns the topic's partition count.
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
	n, err := k.Reader.Partitions(ctx, k.Topic)
	if err != nil {
		return fmt.Errorf("topic %s: %w", k.Topic, err)
	}
	if n == 0 {
		return fmt.Errorf("topic %s has no partitions (does it exist?)", k.Topic)
	}
	parts := make([]int, n)
	for p := range parts {
		parts[p] = p
	}
	ends, err := k.Reader.EndOffsets(ctx, k.Topic, parts)
	if err != nil {
		return fmt.Errorf("list offsets of %s: %w", k.Topic, err)
	}
	var starts map[int]int64
	if k.From.Time.IsZero() {
		starts, err = k.Reader.StartOffsets(ctx, k.Topic, parts)
	} else {
		starts, err = k.Reader.OffsetsAt(ctx, k.Topic, parts, k.From.Time)
	}
	if err != nil {
		return fmt.Errorf("list offsets of %s: %w", k.Topic, err)
	}
	for _, p := range parts {
		k.ranges = append(k.ranges, partRange{partition: p, start: max(min(starts[p], ends[p]), 0), end: ends[p]})
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

	m := &merge{chans: chans, heads: make([][]dedupe.Record, len(chans)), done: make([]bool, len(chans))}
	for i := range chans {
		if err := m.refill(i); err != nil {
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
		best := m.earliest()
		if best < 0 {
			break
		}
		if err := fn(&m.heads[best][0]); err != nil {
			return err
		}
		m.heads[best][0] = dedupe.Record{}
		m.heads[best] = m.heads[best][1:]
		read++
		if read%4096 == 0 && time.Since(last) > 200*time.Millisecond {
			last = time.Now()
			report()
		}
		if err := m.refill(best); err != nil {
			return err
		}
	}
	// A partition whose fetches stopped for a cancelled context looks
	// finished: the range was not read to its end.
	if err := ctx.Err(); err != nil {
		return err
	}
	report()
	return nil
}

// merge holds the records each partition's fetches delivered and Scan has
// not yet passed on, to pass them on in the order of their time.
type merge struct {
	chans []chan fetched
	heads [][]dedupe.Record
	done  []bool
}

// refill takes partition i's next batch when its head is used up.
func (m *merge) refill(i int) error {
	for len(m.heads[i]) == 0 && !m.done[i] {
		f, ok := <-m.chans[i]
		if !ok {
			m.done[i] = true
			return nil
		}
		if f.err != nil {
			return f.err
		}
		m.heads[i] = f.recs
	}
	return nil
}

// earliest is the partition whose next record is the earliest (ties by
// partition), -1 when every partition is read.
func (m *merge) earliest() int {
	best := -1
	for i, h := range m.heads {
		if len(h) > 0 && (best < 0 || h[0].Time.Before(m.heads[best][0].Time)) {
			best = i
		}
	}
	return best
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
		got, hw, err := k.Reader.FetchUpTo(ctx, k.Topic, r.partition, off, 100*time.Millisecond, maxBytes)
		if err != nil {
			if ctx.Err() == nil {
				send(fetched{err: err})
			}
			return
		}
		recs := make([]dedupe.Record, 0, len(got))
		for _, f := range got {
			if f.Offset >= r.end {
				break
			}
			recs = append(recs, dedupe.Record{Topic: k.Topic, Partition: r.partition, Offset: f.Offset, Time: f.Time,
				Key: f.Key, Value: f.Value, Headers: f.Headers})
		}
		if len(recs) == 0 {
			// Offsets can be skipped (compaction, transaction markers):
			// an empty answer with nothing left below the end is the end.
			if empty++; empty >= 3 || (hw > 0 && off >= hw) {
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
