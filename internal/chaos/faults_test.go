package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// groupProgress reads the end offsets of topic and the group's committed
// offsets.
func groupProgress(ctx context.Context, client *kafka.Client, group, topic string, partitions int) (ends, committed map[int]int64, err error) {
	var reqs []kafka.OffsetRequest
	var ids []int
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
		ids = append(ids, p)
	}
	lo, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, nil, fmt.Errorf("list offsets: %w", err)
	}
	ends = map[int]int64{}
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("list offsets of partition %d: %w", po.Partition, po.Error)
		}
		ends[po.Partition] = po.LastOffset
	}
	of, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return nil, nil, fmt.Errorf("offset fetch: %w", err)
	}
	if of.Error != nil {
		return nil, nil, fmt.Errorf("offset fetch: %w", of.Error)
	}
	committed = map[int]int64{}
	for _, po := range of.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("offset fetch of partition %d: %w", po.Partition, po.Error)
		}
		committed[po.Partition] = po.CommittedOffset
	}
	if len(ends) != partitions || len(committed) != partitions {
		return nil, nil, fmt.Errorf("answers for %d and %d partitions, want %d", len(ends), len(committed), partitions)
	}
	return ends, committed, nil
}

// waitCommitted polls until the group has committed at least target on
// every partition (target nil: the end of every partition, read at each
// poll). It returns how long that took, or an error naming the partitions
// behind when the deadline passes.
func waitCommitted(ctx context.Context, client *kafka.Client, group, topic string, partitions int, target map[int]int64, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var last string
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ends, committed, err := groupProgress(qctx, client, group, topic, partitions)
		cancel()
		if err == nil {
			want := target
			if want == nil {
				want = ends
			}
			var behind []string
			for p := range partitions {
				if w := want[p]; w > 0 && committed[p] < w {
					behind = append(behind, fmt.Sprintf("p%d committed %d of %d", p, committed[p], w))
				}
			}
			if len(behind) == 0 {
				return time.Since(start), nil
			}
			sort.Strings(behind)
			last = strings.Join(behind, ", ")
		} else {
			last = err.Error()
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("group %s not caught up after %v: %s", group, timeout, last)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// progress watches the group's committed offsets and records stalls: the
// time a partition spent behind its end offset without its committed
// offset moving.
type progress struct {
	mu     sync.Mutex
	start  time.Time
	since  map[int]time.Time // last advance, or last seen caught up
	last   map[int]int64
	asked  time.Time // when the latest poll asked
	stalls []stall   // closed stalls longer than stallNoise
	polls  int
}

type stall struct {
	partition int
	from, to  time.Duration // since start
}

func (s stall) length() time.Duration { return s.to - s.from }

const stallNoise = 2 * time.Second

func newProgress(start time.Time) *progress {
	return &progress{start: start, since: map[int]time.Time{}, last: map[int]int64{}}
}

// watch polls every interval until ctx ends.
func (pg *progress) watch(ctx context.Context, client *kafka.Client, group, topic string, partitions int) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		// The time before the query: a commit it reads happened before
		// the answer, and a wait for progress after a fault must not take
		// a commit from before the fault for one after it.
		asked := time.Now()
		qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		ends, committed, err := groupProgress(qctx, client, group, topic, partitions)
		cancel()
		if err == nil {
			pg.observe(asked, ends, committed)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (pg *progress) observe(now time.Time, ends, committed map[int]int64) {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	pg.polls++
	pg.asked = now
	for p, c := range committed {
		since, seen := pg.since[p]
		switch {
		case !seen:
			pg.since[p] = now
		case c > pg.last[p] || c >= ends[p]:
			if d := now.Sub(since); d > stallNoise {
				pg.stalls = append(pg.stalls, stall{partition: p, from: since.Sub(pg.start), to: now.Sub(pg.start)})
			}
			pg.since[p] = now
		}
		pg.last[p] = c
	}
}

// longest returns the longest stall inside [from, to] (since start), open
// stalls included, each cut to the window.
func (pg *progress) longest(from, to time.Duration) stall {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	all := append([]stall(nil), pg.stalls...)
	now := time.Since(pg.start)
	for p, since := range pg.since {
		all = append(all, stall{partition: p, from: since.Sub(pg.start), to: now})
	}
	var best stall
	for _, s := range all {
		if s.to < from || s.from > to {
			continue
		}
		// Only the part inside the window counts.
		s.from, s.to = max(s.from, from), min(s.to, to)
		if s.length() > best.length() {
			best = s
		}
	}
	return best
}

// waitAdvanced waits until every partition has committed (or been seen
// caught up) after t, for up to timeout; it returns how long after t that
// was, and false at the timeout. The first poll asked after t is the
// baseline: a commit made just before t (the target of a kill often
// committed a moment before it) shows up in that poll, and must not pass
// for progress after the fault.
func (pg *progress) waitAdvanced(ctx context.Context, t time.Time, timeout time.Duration) (time.Duration, bool) {
	deadline := t.Add(timeout)
	var base time.Time
	for {
		pg.mu.Lock()
		if base.IsZero() && pg.asked.After(t) {
			base = pg.asked
		}
		all := !base.IsZero() && len(pg.since) > 0
		for _, since := range pg.since {
			if !since.After(base) {
				all = false
			}
		}
		pg.mu.Unlock()
		if all {
			return time.Since(t), true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Since(t), false
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// over lists the closed stalls longer than d.
func (pg *progress) over(d time.Duration) []stall {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	var out []stall
	for _, s := range pg.stalls {
		if s.length() > d {
			out = append(out, s)
		}
	}
	return out
}
