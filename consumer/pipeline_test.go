package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/sinks"
)

// rig is one pipeline on an in-process broker and the memory store.
type rig struct {
	t       *testing.T
	brokers []string
	client  *kafka.Client
	io      *sinks.Kafka
	store   dedupe.Store
	metrics *consumer.Metrics
	reg     *prometheus.Registry
	names   map[string]string
}

func newRig(t *testing.T, partitions int32) *rig {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "in", "out", "dlq", "replies"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	client := &kafka.Client{Addr: kafka.TCP(addrs...), Timeout: 10 * time.Second}
	reg := prometheus.NewRegistry()
	m, err := consumer.NewMetrics(reg, "test")
	if err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, brokers: addrs, client: client, io: sinks.NewKafka(client), store: memstore.New(), metrics: m, reg: reg}
}

func (r *rig) policy(sem dedupe.Semantics) dedupe.Policy {
	format, _ := dedupe.ParseKeyFormat("any")
	return dedupe.Policy{
		Pipeline: "p", Key: dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "Idempotency-Key", Format: format, MaxLength: 64},
		Semantics: sem, Window: 10 * time.Minute, Clock: dedupe.ClockStore,
		Rules:           dedupe.CanonicalRules{Volatile: []string{"/client_time"}},
		MaxPayloadBytes: 4096, PendingTimeout: 2 * time.Second, FailedTTL: time.Minute,
	}
}

func (r *rig) pipeline(pol dedupe.Policy, h consumer.Handler, replies string) *consumer.Pipeline {
	r.t.Helper()
	store := consumer.InstrumentStore(r.store, r.metrics)
	d, err := dedupe.NewDecider(pol, store)
	if err != nil {
		r.t.Fatal(err)
	}
	p, err := consumer.New(consumer.Config{
		Name: pol.Pipeline, Input: "in", Output: "out", DLQ: "dlq", Replies: replies,
		Group: "g-" + pol.Pipeline, Brokers: r.brokers, Decider: d, Store: store, Broker: r.io,
		Handler: h, Metrics: r.metrics, Instance: "test", MaxWait: 50 * time.Millisecond, SettleWait: 50 * time.Millisecond, WriteTimeout: 250 * time.Millisecond,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *rig) run(p *consumer.Pipeline) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				r.t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			r.t.Error("Run did not return after cancel")
		}
	}
}

type cmd struct {
	key, body string
	partition int
}

func (r *rig) produce(cmds ...cmd) {
	r.t.Helper()
	msgs := make([]sinks.Message, len(cmds))
	for i, c := range cmds {
		var hs []dedupe.Header
		if c.key != "" {
			hs = []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(c.key)}}
		}
		msgs[i] = sinks.Message{Topic: "in", Partition: c.partition, Value: []byte(c.body), Headers: hs}
	}
	if _, err := r.io.Write(context.Background(), msgs); err != nil {
		r.t.Fatal(err)
	}
}

// readAll reads every record of topic.
func (r *rig) readAll(topic string) []sinks.Fetched {
	r.t.Helper()
	n, err := r.io.Partitions(context.Background(), topic)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []sinks.Fetched
	for p := range n {
		recs, err := r.io.Read(context.Background(), topic, p, 0, 0)
		if err != nil {
			r.t.Fatal(err)
		}
		out = append(out, recs...)
	}
	return out
}

func (r *rig) count(pipeline, outcome string) int {
	return int(testutil.ToFloat64(r.metrics.Records().WithLabelValues(pipeline, outcome)))
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func header(f sinks.Fetched, k string) string {
	v, _ := sinks.HeaderValue(f.Headers, k)
	return v
}

func TestEveryOutcomeOnOnePipeline(t *testing.T) {
	r := newRig(t, 2)
	failing := consumer.HandlerFunc(func(_ context.Context, c consumer.Command) (consumer.Result, error) {
		if strings.Contains(string(c.Record.Value), "out-of-stock") {
			return consumer.Result{}, consumer.Permanent(errors.New("coupon stock exhausted"))
		}
		return consumer.Result{Value: append([]byte("claimed:"), c.Record.Value...)}, nil
	})
	p := r.pipeline(r.policy(dedupe.Strict), failing, "")
	r.produce(
		cmd{"k1", `{"coupon":1,"amount":50,"client_time":"t1"}`, 0},
		cmd{"k1", `{"amount":5e1,"coupon":1,"client_time":"t2"}`, 0}, // replay
		cmd{"k1", `{"coupon":1,"amount":100,"client_time":"t3"}`, 0}, // conflict
		cmd{"", `{"coupon":2}`, 1},                                   // missing key
		cmd{"k2", `{"coupon":2,`, 1},                                 // malformed
		cmd{"k3", `{"coupon":3,"note":"out-of-stock"}`, 1},           // handler failed
		cmd{"k4", `{"coupon":4}`, 1},                                 // first
	)
	stop := r.run(p)
	defer stop()
	waitFor(t, "7 decided records", func() bool {
		n := 0
		for _, o := range []string{"first", "replay", "conflict", "invalid", "failed"} {
			n += r.count("p", o)
		}
		return n == 7
	})
	want := map[string]int{"first": 2, "replay": 1, "conflict": 1, "invalid": 2, "failed": 1}
	for o, n := range want {
		if got := r.count("p", o); got != n {
			t.Errorf("records_total{outcome=%q} = %d, want %d", o, got, n)
		}
	}
	results := r.readAll("out")
	if len(results) != 2 {
		t.Fatalf("%d results, want 2", len(results))
	}
	for _, res := range results {
		if header(res, "idemstream-outcome") != "first" || !strings.HasPrefix(header(res, "idemstream-fingerprint"), "sha256:") ||
			!strings.HasPrefix(string(res.Value), "claimed:") || header(res, "Idempotency-Key") != header(res, "idemstream-key") {
			t.Errorf("result record %+v", res)
		}
		if src := header(res, "idemstream-source"); !strings.HasPrefix(src, "in/") {
			t.Errorf("idemstream-source = %q", src)
		}
	}
	dead := r.readAll("dlq")
	reasons := map[string]sinks.Fetched{}
	for _, d := range dead {
		reasons[header(d, "idemstream-reason")] = d
	}
	for _, reason := range []string{"conflict", "missing_key", "malformed_payload", "handler_failed"} {
		d, ok := reasons[reason]
		if !ok {
			t.Errorf("no dead letter with reason %s (got %d dead letters)", reason, len(dead))
			continue
		}
		if header(d, "idemstream-error") == "" || header(d, "idemstream-source") == "" {
			t.Errorf("%s dead letter lacks error or source: %+v", reason, d.Headers)
		}
	}
	c := reasons["conflict"]
	if string(c.Value) != `{"coupon":1,"amount":100,"client_time":"t3"}` || header(c, "idemstream-first-source") != "in/0/0" ||
		header(c, "idemstream-conflict-paths") != "/amount" || header(c, "idemstream-first-fingerprint") == header(c, "idemstream-fingerprint") {
		t.Errorf("conflict dead letter: value %s headers %+v", c.Value, c.Headers)
	}
	if got := testutil.ToFloat64(r.metrics.DLQRecords().WithLabelValues("p", "handler_failed")); got != 1 {
		t.Errorf("dlq_records_total{reason=handler_failed} = %v", got)
	}
	e, ok, _ := r.store.Lookup(context.Background(), "p", "k3")
	if !ok || e.State != dedupe.Failed {
		t.Errorf("key of a failed command: %+v %v, want FAILED", e, ok)
	}
}

// Two members of one group over the same topic, the same keys resent on
// both partitions: one result per key.
func TestGroupMembersShareWork(t *testing.T) {
	r := newRig(t, 4)
	var cmds []cmd
	for i := range 40 {
		body := fmt.Sprintf(`{"n":%d}`, i%20)
		cmds = append(cmds, cmd{fmt.Sprintf("key-%d", i%20), body, i % 4})
	}
	r.produce(cmds...)
	a := r.pipeline(r.policy(dedupe.Strict), nil, "")
	b := r.pipeline(r.policy(dedupe.Strict), nil, "")
	stopA, stopB := r.run(a), r.run(b)
	defer stopA()
	defer stopB()
	waitFor(t, "40 decided records", func() bool { return r.count("p", "first")+r.count("p", "replay") == 40 })
	keys := map[string]int{}
	for _, res := range r.readAll("out") {
		keys[header(res, "idemstream-key")]++
	}
	if len(keys) != 20 {
		t.Errorf("%d keys have results, want 20", len(keys))
	}
	for k, n := range keys {
		if n != 1 {
			t.Errorf("key %s has %d results", k, n)
		}
	}
	waitFor(t, "both members ready", func() bool { return a.Ready() && b.Ready() })
}

func TestRepliesRepublishStoredResult(t *testing.T) {
	r := newRig(t, 1)
	p := r.pipeline(r.policy(dedupe.Lenient), nil, "replies")
	r.produce(cmd{"k", `{"a":1}`, 0})
	stop := r.run(p)
	defer stop()
	waitFor(t, "first", func() bool { return r.count("p", "first") == 1 })
	r.produce(cmd{"k", `{"a":2}`, 0}, cmd{"k", `{"a":1,"client_time":"x"}`, 0})
	waitFor(t, "two replays", func() bool { return r.count("p", "replay") == 2 })
	replies := r.readAll("replies")
	if len(replies) != 2 {
		t.Fatalf("%d replies, want 2", len(replies))
	}
	for _, rep := range replies {
		if string(rep.Value) != `{"a":1}` || header(rep, "idemstream-replayed") != "true" || header(rep, "idemstream-source") == "in/0/0" {
			t.Errorf("reply %s %+v", rep.Value, rep.Headers)
		}
	}
	if got := testutil.ToFloat64(r.metrics.LenientMismatch().WithLabelValues("p")); got != 1 {
		t.Errorf("lenient_mismatch_total = %v, want 1", got)
	}
}

// flakyBroker fails the first result write after sending it: the record
// is in the partition, the writer does not know.
type flakyBroker struct {
	consumer.Broker
	mu     sync.Mutex
	failed bool
}

func (f *flakyBroker) Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error) {
	w, err := f.Broker.Write(ctx, msgs)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && !f.failed && len(msgs) > 0 && msgs[0].Topic == "out" {
		f.failed = true
		return nil, fmt.Errorf("produce to out: %w: %w", sinks.ErrAmbiguous, &net.OpError{Op: "read", Err: errors.New("connection reset by peer")})
	}
	return w, err
}

func TestAmbiguousWriteIsNotRepeated(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	store := consumer.InstrumentStore(r.store, r.metrics)
	d, _ := dedupe.NewDecider(pol, store)
	flaky := &flakyBroker{Broker: r.io}
	p, err := consumer.New(consumer.Config{Name: "p", Input: "in", Output: "out", DLQ: "dlq", Group: "g", Brokers: r.brokers,
		Decider: d, Store: store, Broker: flaky, Metrics: r.metrics, MaxWait: 50 * time.Millisecond, SettleWait: 10 * time.Millisecond, WriteTimeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r.produce(cmd{"k1", `{"a":1}`, 0}, cmd{"k2", `{"a":2}`, 0})
	stop := r.run(p)
	defer stop()
	waitFor(t, "two firsts", func() bool { return r.count("p", "first") == 2 })
	if !flaky.failed {
		t.Fatal("the ambiguous failure was never injected")
	}
	keys := []string{}
	for _, res := range r.readAll("out") {
		keys = append(keys, header(res, "idemstream-key"))
	}
	sort.Strings(keys)
	if strings.Join(keys, ",") != "k1,k2" {
		t.Errorf("results after an ambiguous write: %v, want exactly k1,k2", keys)
	}
	e, _, _ := r.store.Lookup(context.Background(), "p", "k1")
	if e.State != dedupe.Success || e.Result.Offset < 0 {
		t.Errorf("k1 after recovery: %+v", e)
	}
}

// Two partitions whose batches hold each other's keys: each waits for the
// other up to pending_timeout, then decides on the stored state. Neither
// lease runs out meanwhile, so nobody takes a live key over and each key
// has one result.
func TestCrossPartitionWaitsWriteOnce(t *testing.T) {
	r := newRig(t, 2)
	pol := r.policy(dedupe.Strict)
	pol.PendingTimeout = 300 * time.Millisecond
	p := r.pipeline(pol, nil, "")
	for round := range 5 {
		x, y := fmt.Sprintf("x%d", round), fmt.Sprintf("y%d", round)
		r.produce(cmd{x, `{"k":"x"}`, 0}, cmd{y, `{"k":"y"}`, 0}, cmd{y, `{"k":"y"}`, 1}, cmd{x, `{"k":"x"}`, 1})
	}
	stop := r.run(p)
	defer stop()
	waitFor(t, "20 decided records", func() bool { return r.count("p", "first")+r.count("p", "replay") == 20 })
	perKey := map[string]int{}
	for _, res := range r.readAll("out") {
		perKey[header(res, "idemstream-key")]++
	}
	if len(perKey) != 10 {
		t.Errorf("%d keys have results, want 10", len(perKey))
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("key %s has %d results", k, n)
		}
	}
}
