package consumer

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// heldCommitter holds every request until the test hands it a result.
type heldCommitter struct {
	mu       sync.Mutex
	requests []map[int]int64
	active   atomic.Int32
	overlap  atomic.Bool
	entered  chan struct{}
	results  chan error
}

func (h *heldCommitter) CommitOffsets(_ context.Context, offsets map[string]map[int]int64) error {
	if h.active.Add(1) > 1 {
		h.overlap.Store(true)
	}
	defer h.active.Add(-1)
	h.mu.Lock()
	h.requests = append(h.requests, maps.Clone(offsets["in"]))
	h.mu.Unlock()
	h.entered <- struct{}{}
	return <-h.results
}

func TestCommitsArrivingDuringARequestGoInTheNextOne(t *testing.T) {
	h := &heldCommitter{entered: make(chan struct{}), results: make(chan error)}
	s := newSharedCommitter(h)
	commit := func(partition int, offset int64, out chan<- error) {
		out <- s.CommitOffsets(context.Background(), map[string]map[int]int64{"in": {partition: offset}})
	}

	first := make(chan error, 1)
	go commit(0, 100, first)
	<-h.entered // partition 0's request is in flight

	later := make(chan error, 5)
	for p := 1; p <= 5; p++ {
		go commit(p, int64(100+p), later)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		joined := 0
		if s.next != nil {
			joined = len(s.next.offsets["in"])
		}
		s.mu.Unlock()
		if joined == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 5 commits joined the next round", joined)
		}
		time.Sleep(time.Millisecond)
	}

	h.results <- nil
	if err := <-first; err != nil {
		t.Fatalf("partition 0: %v", err)
	}
	<-h.entered // the round of the five
	moved := errors.New("not coordinator")
	h.results <- moved
	for range 5 {
		if err := <-later; !errors.Is(err, moved) {
			t.Errorf("a commit of the second round returned %v, want the request's error", err)
		}
	}

	if h.overlap.Load() {
		t.Error("two requests were in flight at once")
	}
	want := []map[int]int64{{0: 100}, {1: 101, 2: 102, 3: 103, 4: 104, 5: 105}}
	if len(h.requests) != len(want) || !maps.Equal(h.requests[0], want[0]) || !maps.Equal(h.requests[1], want[1]) {
		t.Errorf("requests %v, want %v", h.requests, want)
	}

	// Nothing in flight: a commit is sent at once, alone.
	alone := make(chan error, 1)
	go commit(3, 200, alone)
	<-h.entered
	h.results <- nil
	if err := <-alone; err != nil || len(h.requests) != 3 || !maps.Equal(h.requests[2], map[int]int64{3: 200}) {
		t.Errorf("a lone commit: %v, requests %v", err, h.requests)
	}
}

// failingCommitter fails its first calls, then commits.
type failingCommitter struct {
	fail      int
	calls     int
	committed int64
}

func (f *failingCommitter) CommitOffsets(_ context.Context, offsets map[string]map[int]int64) error {
	f.calls++
	if f.calls <= f.fail {
		return errors.New("coordinator not available")
	}
	f.committed = offsets["in"][0]
	return nil
}

// A failed commit is tried again until it passes: completed records left
// uncommitted would be read again, and decided first once their window
// ran out. Before, the error was only logged.
func TestFailedCommitIsRetried(t *testing.T) {
	p := &Pipeline{cfg: Config{Name: "p", Input: "in"}, stop: func(error) {}}
	pz := &pauser{p: p, log: slog.New(slog.DiscardHandler)}
	c := &failingCommitter{fail: 3}
	if !p.commit(context.Background(), pz, c, 0, 42) || c.calls != 4 || c.committed != 42 {
		t.Errorf("%d calls, committed %d; want 4 calls and 42", c.calls, c.committed)
	}
	if !p.Ready() && p.pausedN.Load() != 0 {
		t.Errorf("still paused after the commit passed")
	}
	// A revoked partition (its context over) stops trying.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c = &failingCommitter{fail: 100}
	if p.commit(ctx, pz, c, 0, 43) || c.calls != 1 {
		t.Errorf("%d calls after the partition's context ended, want 1 and false", c.calls)
	}
	// An authorization refusal stops the pipeline.
	var stopped error
	p.stop = func(err error) { stopped = err }
	refusing := committerFunc(func(map[string]map[int]int64) error { return kafka.GroupAuthorizationFailed })
	if p.commit(context.Background(), pz, refusing, 0, 44) || !errors.Is(stopped, kafka.GroupAuthorizationFailed) {
		t.Errorf("an authorization refusal: stop(%v), want the pipeline stopped with it", stopped)
	}
}

type committerFunc func(map[string]map[int]int64) error

func (f committerFunc) CommitOffsets(_ context.Context, o map[string]map[int]int64) error {
	return f(o)
}
