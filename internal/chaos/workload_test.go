package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// Kinds of input records, carried in the chaos-kind header (headers are
// not fingerprinted, so the test can label records without changing their
// identity).
const (
	kindOriginal = "original" // the first send of a key
	kindRetry    = "retry"    // same command, only /client_time differs
	kindConflict = "conflict" // same key, another amount
	kindInvalid  = "invalid"  // malformed JSON or no key header

	headerSeq  = "chaos-seq"
	headerKind = "chaos-kind"
	keyHeader  = "Idempotency-Key"
)

// planned is one record the producer sends at a moment of the load.
type planned struct {
	seq       int
	at        time.Duration
	kind      string
	key       string // as sent ("" for no header)
	partition int
	body      string
}

type workload struct {
	keys    int
	records []planned // sorted by at
	backlog int       // records[:backlog] are the backlog, sent before the group starts
	byKind  map[string]int
}

// backlogEnd is where the backlog's schedule ends: its keys fall in the
// first second, their copies within three more.
const backlogEnd = 4 * time.Second

// newWorkload plans the load: the backlog's keys all at once (with their
// copies), then the streamed keys spread evenly over the stream's span,
// each followed by its retries and conflicting copies within a few
// seconds.
func newWorkload(rng *rand.Rand, v variant, partitions int) *workload {
	w := &workload{keys: v.backlogKeys + v.streamKeys, byKind: map[string]int{}}
	seq := 0
	add := func(at time.Duration, kind, key string, partition int, body string) {
		w.records = append(w.records, planned{seq: seq, at: at, kind: kind, key: key, partition: partition, body: body})
		w.byKind[kind]++
		seq++
	}
	clientTime := func(at time.Duration, n int) string {
		return time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC).Add(at).Format("15:04:05.000") + "#" + strconv.Itoa(n)
	}
	other := func(p int) int { return (p + 1 + rng.IntN(partitions-1)) % partitions }
	spread := v.stream - 4*time.Second // the last copies still fall inside the stream
	for i := range w.keys {
		key := uuid(rng)
		at := time.Duration(int64(time.Second) * int64(i) / int64(max(v.backlogKeys, 1)))
		if i >= v.backlogKeys {
			at = backlogEnd + time.Duration(int64(spread)*int64(i-v.backlogKeys)/int64(max(v.streamKeys, 1)))
		}
		home := rng.IntN(partitions)
		amount := 10 + rng.IntN(90)
		coupon := rng.IntN(1_000_000)
		user := fmt.Sprintf("u-%d", rng.IntN(100_000))
		body := func(amount string, ct string, reorder bool) string {
			if reorder {
				return fmt.Sprintf(`{ "client_time": %q, "amount": %s, "user_id": %q, "coupon_id": %d }`, ct, amount, user, coupon)
			}
			return fmt.Sprintf(`{"coupon_id":%d,"user_id":%q,"amount":%s,"client_time":%q}`, coupon, user, amount, ct)
		}
		add(at, kindOriginal, key, home, body(strconv.Itoa(amount), clientTime(at, 0), false))

		// Volatile-only retries: 35% of keys get one, 10% a second one.
		retries := 0
		if r := rng.Float64(); r < 0.10 {
			retries = 2
		} else if r < 0.35 {
			retries = 1
		}
		for n := 1; n <= retries; n++ {
			delay := time.Duration(rng.Int64N(int64(3 * time.Second)))
			if rng.IntN(8) == 0 {
				delay = 0 // together with the original: a race across partitions
			}
			p := home
			if rng.IntN(2) == 0 {
				p = other(home) // cross-partition: the store, not the partitioning, decides
			}
			k := key
			if rng.IntN(5) == 0 {
				k = strings.ToUpper(key) // RFC 9562: one key
			}
			a := strconv.Itoa(amount)
			switch rng.IntN(6) {
			case 0:
				a += ".0" // 50.0 is 50
			case 1:
				a = fmt.Sprintf("%de0", amount) // 50e0 is 50
			}
			add(at+delay, kindRetry, k, p, body(a, clientTime(at+delay, n), rng.IntN(3) == 0))
		}

		// About 3% of keys get a conflicting copy: another amount.
		if rng.Float64() < 0.03 {
			delay := time.Duration(rng.Int64N(int64(3 * time.Second)))
			p := home
			if rng.IntN(2) == 0 {
				p = other(home)
			}
			add(at+delay, kindConflict, key, p, body(strconv.Itoa(amount+100), clientTime(at+delay, 9), false))
		}
	}
	// A few invalid records: 0.5% of the keys' count, half malformed, half
	// without a key header.
	for i := range max(2, w.keys/200) {
		at := time.Duration(rng.Int64N(int64(backlogEnd + spread)))
		if i%2 == 0 {
			add(at, kindInvalid, uuid(rng), rng.IntN(partitions), `{"coupon_id":1,"amount":`)
		} else {
			add(at, kindInvalid, "", rng.IntN(partitions), `{"coupon_id":2,"amount":5}`)
		}
	}
	sort.SliceStable(w.records, func(i, j int) bool { return w.records[i].at < w.records[j].at })
	w.backlog = sort.Search(len(w.records), func(i int) bool { return w.records[i].at >= backlogEnd })
	return w
}

func uuid(rng *rand.Rand) string {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// producerStats says what the producer did.
type producerStats struct {
	mu       sync.Mutex
	acked    map[int]bool // seq → acknowledged at least once
	writes   int
	failures int
	retried  int // records sent again after a failed write
	lastErr  string
	maxStall time.Duration // longest time a batch waited to be acknowledged
}

// produce sends the workload on its schedule, in batches, each batch
// retried until acknowledged (or the deadline of one batch passes). A
// failed batch is sent whole again: records of it that were appended
// before the failure are then in the input twice, which the verification
// counts from the input topic (they are replays).
//
// It sends records[from:to], each at its planned moment less base after
// the call.
func produce(ctx context.Context, w *workload, from, to int, base time.Duration, topic string, out *sinks.Kafka, batchDeadline time.Duration, stats *producerStats) error {
	start := time.Now().Add(-base)
	next := from
	records := w.records[:to]
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for next < len(records) {
		elapsed := time.Since(start)
		end := next
		for end < len(records) && records[end].at <= elapsed && end-next < 500 {
			end++
		}
		if end > next {
			msgs := make([]sinks.Message, 0, end-next)
			for _, r := range w.records[next:end] {
				hs := []dedupe.Header{
					{Key: headerSeq, Value: []byte(strconv.Itoa(r.seq))},
					{Key: headerKind, Value: []byte(r.kind)},
				}
				if r.key != "" {
					hs = append(hs, dedupe.Header{Key: keyHeader, Value: []byte(r.key)})
				}
				msgs = append(msgs, sinks.Message{Topic: topic, Partition: r.partition, Value: []byte(r.body), Headers: hs})
			}
			if err := writeRetrying(ctx, out, msgs, batchDeadline, stats); err != nil {
				return fmt.Errorf("records %d..%d of %d: %w", next, end-1, len(records), err)
			}
			stats.mu.Lock()
			for _, r := range w.records[next:end] {
				stats.acked[r.seq] = true
			}
			stats.mu.Unlock()
			next = end
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

func writeRetrying(ctx context.Context, out *sinks.Kafka, msgs []sinks.Message, deadline time.Duration, stats *producerStats) error {
	began := time.Now()
	for attempt := 0; ; attempt++ {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := out.Write(wctx, msgs)
		cancel()
		stats.mu.Lock()
		stats.writes++
		if err != nil {
			stats.failures++
			stats.retried += len(msgs)
			stats.lastErr = err.Error()
		} else if d := time.Since(began); d > stats.maxStall {
			stats.maxStall = d
		}
		stats.mu.Unlock()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(began) > deadline {
			return fmt.Errorf("not acknowledged within %v (%d attempts): %w", deadline, attempt+1, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
