package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// dyingBroker sends the first result write and dies with it: the write's
// outcome is unknown, and from then on the process reaches nothing.
type dyingBroker struct {
	consumer.Broker
	dead *atomic.Bool
	mu   sync.Mutex
	sent []sinks.Message // the write in flight when it died
	died chan struct{}
}

func (b *dyingBroker) Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error) {
	if b.dead.Load() {
		return nil, fmt.Errorf("dead: %w", dedupe.ErrBrokerUnavailable)
	}
	if len(msgs) > 0 && msgs[0].Topic == "out" {
		b.mu.Lock()
		b.sent = append([]sinks.Message(nil), msgs...)
		b.mu.Unlock()
		b.dead.Store(true)
		close(b.died)
		return nil, fmt.Errorf("produce to out: %w: %w", sinks.ErrAmbiguous, context.DeadlineExceeded)
	}
	return b.Broker.Write(ctx, msgs)
}

func (b *dyingBroker) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	if b.dead.Load() {
		return nil, 0, fmt.Errorf("dead: %w", dedupe.ErrBrokerUnavailable)
	}
	return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
}

// deadStore is the store as a dead process sees it: unreachable.
type deadStore struct {
	dedupe.Store
	dead *atomic.Bool
}

func (s deadStore) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	if s.dead.Load() {
		return nil, fmt.Errorf("dead: %w", dedupe.ErrStoreUnavailable)
	}
	return s.Store.Decide(ctx, reqs)
}

func (s deadStore) Complete(ctx context.Context, comps []dedupe.Completion) ([]error, error) {
	if s.dead.Load() {
		return nil, fmt.Errorf("dead: %w", dedupe.ErrStoreUnavailable)
	}
	return s.Store.Complete(ctx, comps)
}

// A member restarted under its identity (kafka.instance_id) gets its
// partitions back at once, but not the keys its previous incarnation left
// PENDING: it waits for their lease like any other owner, because the
// identity proves the old process gone, not its last write settled. Here
// the old process died with a result write in flight that becomes visible
// late, a second before the lease ends: the restarted member, resuming
// only after the lease, finds it and writes nothing. Had it taken the key
// over when it started, the key would have two results.
func TestRestartedIdentityWaitsForItsPredecessorsLease(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	r.produce(cmd{"k1", `{"a":1}`, 0})
	var dead atomic.Bool
	dying := &dyingBroker{Broker: r.io, dead: &dead, died: make(chan struct{})}
	// Both incarnations are named alike, as a library user naming the
	// process by its pod would: New keeps their owner tokens apart.
	cfg := r.config(pol, nil, dying, "pod-0")
	cfg.InstanceID = "pod-0"
	store := deadStore{Store: r.store, dead: &dead}
	d, err := dedupe.NewDecider(pol, store)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store, cfg.Decider = store, d
	cfg.DrainTimeout = 200 * time.Millisecond
	stopA := r.start(cfg)
	select {
	case <-dying.died:
	case <-time.After(20 * time.Second):
		t.Fatal("the first incarnation never wrote")
	}
	stopA()
	e, ok, err := r.store.Lookup(context.Background(), "p", "k1")
	if err != nil || !ok || e.State != dedupe.Pending || !e.LeaseUntil.After(e.Now) {
		t.Fatalf("k1 after the crash: %+v %v %v, want PENDING under a running lease", e, ok, err)
	}
	leaseLeft := e.LeaseUntil.Sub(e.Now)

	again := r.config(pol, nil, nil, "pod-0")
	again.InstanceID = "pod-0"
	started := time.Now()
	stopB := r.start(again)
	defer stopB()
	// Until a second before the lease ends, k1 must have no result; then
	// the dead process's write becomes visible.
	for visible := started.Add(leaseLeft - time.Second); time.Now().Before(visible); time.Sleep(20 * time.Millisecond) {
		if n := r.resultsPerKey()["k1"]; n != 0 {
			t.Fatalf("k1 has %d results before its lease ended: the restarted member took it over early", n)
		}
	}
	dying.mu.Lock()
	if _, err := r.io.Write(context.Background(), dying.sent); err != nil {
		t.Fatal(err)
	}
	dying.mu.Unlock()
	waitFor(t, "k1 completed", func() bool {
		e, _, _ := r.store.Lookup(context.Background(), "p", "k1")
		return e.State == dedupe.Success
	})
	if n := r.resultsPerKey()["k1"]; n != 1 {
		t.Fatalf("k1 has %d results, want the dead process's one", n)
	}
}
