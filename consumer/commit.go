package consumer

import (
	"context"
	"sync"
)

// sharedCommitter sends the partitions' commits one OffsetCommit request
// at a time, and those that arrive while a request is in flight together
// in the next one: one request per round instead of one per partition per
// batch. It was first written for kafka-go's consumer group, whose single
// connection to the coordinator made concurrent commits spin for their
// responses (about 5% of the consumer's CPU in the load run); the group
// member commits through kafka-go's Client, and the rounds still save the
// coordinator a request per partition.
//
// Each partition commits from its own goroutine and waits for the result,
// so a round holds at most one offset per partition. A round's error is
// every member's error: the request was one.
type sharedCommitter struct {
	committer committer

	mu       sync.Mutex
	inflight chan struct{} // closed when the request in flight returns; nil when none is
	next     *commitRound  // the round that callers join until it is sent
}

type commitRound struct {
	offsets map[string]map[int]int64
	sent    bool
	done    chan struct{}
	err     error
}

func newSharedCommitter(c committer) *sharedCommitter {
	return &sharedCommitter{committer: c}
}

// CommitOffsets joins the round being gathered, waits for the request in
// flight, and then sends the round itself, under its own ctx, unless
// another member already has.
func (s *sharedCommitter) CommitOffsets(ctx context.Context, offsets map[string]map[int]int64) error {
	s.mu.Lock()
	r := s.next
	if r == nil {
		r = &commitRound{offsets: make(map[string]map[int]int64, len(offsets)), done: make(chan struct{})}
		s.next = r
	}
	for topic, parts := range offsets {
		m := r.offsets[topic]
		if m == nil {
			m = make(map[int]int64, len(parts))
			r.offsets[topic] = m
		}
		for partition, offset := range parts {
			m[partition] = offset
		}
	}
	for s.inflight != nil && !r.sent {
		wait := s.inflight
		s.mu.Unlock()
		<-wait
		s.mu.Lock()
	}
	if r.sent {
		s.mu.Unlock()
		<-r.done
		return r.err
	}
	r.sent = true
	s.next = nil
	s.inflight = r.done
	s.mu.Unlock()

	r.err = s.committer.CommitOffsets(ctx, r.offsets)

	s.mu.Lock()
	s.inflight = nil
	close(r.done)
	s.mu.Unlock()
	return r.err
}
