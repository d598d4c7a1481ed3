package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/dedupe/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clock := storetest.NewManualClock()
		return storetest.Harness{Store: memstore.New(memstore.WithClock(clock.Now)), Advance: clock.Advance, Simulated: true}
	})
}

func TestCancelledContextDecidesNothing(t *testing.T) {
	s := memstore.New()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Decide(ctx, []dedupe.DecideRequest{{Namespace: "p", Key: "k", Window: time.Minute, Lease: time.Second}})
	if err == nil {
		t.Fatal("Decide with a cancelled context succeeded")
	}
	if s.Len() != 0 {
		t.Errorf("store holds %d entries after a refused call", s.Len())
	}
}

func TestSweepRemovesExpiredEntries(t *testing.T) {
	clock := storetest.NewManualClock()
	s := memstore.New(memstore.WithClock(clock.Now))
	reqs := make([]dedupe.DecideRequest, 5000)
	for i := range reqs {
		reqs[i] = dedupe.DecideRequest{Namespace: "p", Key: string(rune('a'+i%26)) + time.Duration(i).String(), Window: time.Second, Lease: time.Second}
	}
	if _, err := s.Decide(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	// Never completed, so PENDING: kept past the window until
	// PendingRetention after the lease.
	clock.Advance(2 * time.Second)
	if _, err := s.Decide(context.Background(), reqs[:1]); err != nil {
		t.Fatal(err)
	}
	if n := s.Len(); n != len(reqs) {
		t.Fatalf("%d entries after the window, want all %d PENDING entries kept", n, len(reqs))
	}
	clock.Advance(dedupe.PendingRetention)
	for range 4096 {
		if _, err := s.Decide(context.Background(), reqs[:1]); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n > 1 {
		t.Errorf("%d entries left after the window and a sweep, want at most 1", n)
	}
}
