package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// instrumentStore times every store call and counts failures, under the
// op label (decide, complete, lookup).
func instrumentStore(s dedupe.Store, m *Metrics) dedupe.Store {
	if m == nil {
		return s
	}
	if f, ok := s.(forgottenStore); ok {
		m.watchForgot(f)
	}
	return &instrumented{Store: s, m: m}
}

type instrumented struct {
	dedupe.Store
	m *Metrics
}

func (i *instrumented) observe(op string, start time.Time, err error) {
	i.m.storeSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		i.m.storeErrors.WithLabelValues(op).Inc()
	}
	if errors.Is(err, dedupe.ErrNotReplicated) {
		i.m.storeReplicaAckFailures.WithLabelValues(op).Inc()
	}
}

func (i *instrumented) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	start := time.Now()
	d, err := i.Store.Decide(ctx, reqs)
	i.observe("decide", start, err)
	return d, err
}

func (i *instrumented) Complete(ctx context.Context, comps []dedupe.Completion) ([]error, error) {
	start := time.Now()
	e, err := i.Store.Complete(ctx, comps)
	i.observe("complete", start, err)
	return e, err
}

func (i *instrumented) Lookup(ctx context.Context, ns, key string) (dedupe.Entry, bool, error) {
	start := time.Now()
	e, ok, err := i.Store.Lookup(ctx, ns, key)
	i.observe("lookup", start, err)
	return e, ok, err
}
