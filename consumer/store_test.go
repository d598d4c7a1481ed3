package consumer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
)

// unacked is a store whose writes no replica acknowledges.
type unacked struct{ dedupe.Store }

func (unacked) Decide(context.Context, []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	return nil, fmt.Errorf("decide: %w: WAIT: 0 of 1 replicas acknowledged within 1s", dedupe.ErrNotReplicated)
}

// A write that replicas did not acknowledge counts as a store error and,
// apart, as a replica acknowledgement failure: the alert needs to tell it
// from Redis being down.
func TestInstrumentStoreCountsReplicaAckFailures(t *testing.T) {
	m, err := consumer.NewMetrics(prometheus.NewRegistry(), "test")
	if err != nil {
		t.Fatal(err)
	}
	s := consumer.InstrumentStore(unacked{memstore.New()}, m)
	if _, err := s.Decide(context.Background(), nil); !dedupe.IsRetryable(err) {
		t.Fatalf("decide: %v, want a retryable error", err)
	}
	if _, _, err := s.Lookup(context.Background(), "p", "k"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.StoreReplicaAckFailures().WithLabelValues("decide")); got != 1 {
		t.Errorf("store_replica_ack_failures_total{op=decide} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.StoreErrors().WithLabelValues("decide")); got != 1 {
		t.Errorf("store_errors_total{op=decide} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.StoreReplicaAckFailures().WithLabelValues("lookup")); got != 0 {
		t.Errorf("store_replica_ack_failures_total{op=lookup} = %v, want 0", got)
	}
}
