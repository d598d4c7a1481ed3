package consumer_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/sinks"
)

// config is the rig's pipeline configuration, for tests that change it.
func (r *rig) config(pol dedupe.Policy, h consumer.Handler, broker consumer.Broker, instance string) consumer.Config {
	r.t.Helper()
	store := consumer.InstrumentStore(r.store, r.metrics)
	d, err := dedupe.NewDecider(pol, store)
	if err != nil {
		r.t.Fatal(err)
	}
	if broker == nil {
		broker = r.io
	}
	return consumer.Config{
		Name: pol.Pipeline, Input: "in", Output: "out", DLQ: "dlq",
		Group: "g-" + pol.Pipeline, Brokers: r.brokers, Decider: d, Store: store, Broker: broker,
		Handler: h, Metrics: r.metrics, Instance: instance, MaxWait: 50 * time.Millisecond, SettleWait: 50 * time.Millisecond, WriteTimeout: 250 * time.Millisecond,
	}
}

func (r *rig) start(cfg consumer.Config) (stop func()) {
	r.t.Helper()
	p, err := consumer.New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return r.run(p)
}

func (r *rig) resultsPerKey() map[string]int {
	perKey := map[string]int{}
	for _, res := range r.readAll("out") {
		perKey[header(res, "idemstream-key")]++
	}
	return perKey
}

// A member whose partitions are revoked while its handler is still busy
// (a rolling deploy, SIGTERM) abandons the batch within the drain time and
// releases the key it had decided: the next owner resumes it at once and
// writes its one result. Before, the key stayed PENDING under a live lease,
// the next owner gave up after pending_timeout, decided the record as a
// replay and committed it: the key never got a result.
func TestRevokedBatchReleasesItsKeys(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	entered := make(chan struct{})
	var once sync.Once
	busy := consumer.HandlerFunc(func(ctx context.Context, c consumer.Command) (consumer.Result, error) {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return consumer.Result{}, ctx.Err()
	})
	cfg := r.config(pol, busy, nil, "member-a")
	cfg.DrainTimeout = 200 * time.Millisecond
	r.produce(cmd{"k1", `{"a":1}`, 0})
	stopA := r.start(cfg)
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler was never called")
	}
	stopA()

	e, ok, err := r.store.Lookup(context.Background(), "p", "k1")
	if err != nil || !ok || e.State != dedupe.Pending {
		t.Fatalf("k1 after the revocation: %+v %v %v, want PENDING", e, ok, err)
	}
	if e.LeaseUntil.After(e.Now) {
		t.Errorf("k1's lease runs for %v after its owner left; want it released", e.LeaseUntil.Sub(e.Now))
	}

	stopB := r.start(r.config(pol, nil, nil, "member-b"))
	defer stopB()
	waitFor(t, "k1's result", func() bool { return r.resultsPerKey()["k1"] >= 1 })
	if n := r.resultsPerKey()["k1"]; n != 1 {
		t.Errorf("k1 has %d results, want 1", n)
	}
	if got := r.count("p", "replay"); got != 0 {
		t.Errorf("%d replays: the owner's own record must not be a replay", got)
	}
}

// Every result of a batch is too large for the broker but one: that one is
// written, the other becomes a dead letter (payload_too_large) and its key
// FAILED. Before, the partition retried the write for ever.
func TestResultTooLargeBecomesADeadLetter(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	huge := consumer.HandlerFunc(func(_ context.Context, c consumer.Command) (consumer.Result, error) {
		if c.Key == "big" {
			// Random bytes: compression cannot bring them under the limit.
			return consumer.Result{Value: incompressible(1200 << 10)}, nil
		}
		return consumer.Result{Value: c.Record.Value}, nil
	})
	r.produce(cmd{"small", `{"a":1}`, 0}, cmd{"big", `{"a":2}`, 0})
	stop := r.start(r.config(pol, huge, nil, "test"))
	defer stop()
	waitFor(t, "both records decided", func() bool { return r.count("p", "first")+r.count("p", "failed") == 2 })
	if r.count("p", "first") != 1 || r.count("p", "failed") != 1 {
		t.Errorf("first=%d failed=%d, want 1 and 1", r.count("p", "first"), r.count("p", "failed"))
	}
	dlq := r.readAll("dlq")
	if len(dlq) != 1 || header(dlq[0], "idemstream-reason") != "payload_too_large" || header(dlq[0], "idemstream-key") != "big" {
		t.Fatalf("dead letters: %d, want one payload_too_large for big", len(dlq))
	}
	if e, _, _ := r.store.Lookup(context.Background(), "p", "big"); e.State != dedupe.Failed {
		t.Errorf("big is %s, want FAILED", e.State)
	}
}

// incompressible returns n random bytes.
func incompressible(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// refusingBroker refuses every write to one topic, as a broker does on an
// authorization failure.
type refusingBroker struct {
	consumer.Broker
	topic  string
	writes atomic.Int32
}

func (b *refusingBroker) Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error) {
	if len(msgs) > 0 && msgs[0].Topic == b.topic {
		b.writes.Add(1)
		return nil, fmt.Errorf("produce to %s: %w: %w", b.topic, dedupe.ErrBrokerRefused, kafka.TopicAuthorizationFailed)
	}
	return b.Broker.Write(ctx, msgs)
}

// A dead letter the topic refuses for good stops the pipeline with the
// reason, instead of retrying for ever; nothing is committed past it.
func TestRefusedDeadLetterStopsThePipeline(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	broker := &refusingBroker{Broker: r.io, topic: "dlq"}
	p, err := consumer.New(r.config(pol, nil, broker, "test"))
	if err != nil {
		t.Fatal(err)
	}
	r.produce(cmd{"", `{"no":"key"}`, 0})
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, dedupe.ErrBrokerRefused) {
			t.Errorf("Run = %v, want the refusal", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop on a refusal that cannot pass")
	}
	if n := broker.writes.Load(); n != 1 {
		t.Errorf("the refused write was tried %d times, want once", n)
	}
	if got := r.count("p", "invalid"); got != 0 {
		t.Errorf("invalid counted %d times for a dead letter that was never written", got)
	}
}

// A pipeline whose dead-letter topic does not exist does not start.
func TestMissingTopicRefusesToStart(t *testing.T) {
	defer consumer.SetTopicWait(100 * time.Millisecond)()
	r := newRig(t, 1)
	cfg := r.config(r.policy(dedupe.Strict), nil, nil, "test")
	cfg.DLQ = "no-such-dlq"
	p, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, sinks.ErrUnknownTopic) {
			t.Errorf("Run = %v, want an error naming the missing topic", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not stop on a missing topic")
	}
}

// truncatedBroker says the output partition no longer holds offsets below
// start, as after retention or DeleteRecords, and counts output fetches.
type truncatedBroker struct {
	consumer.Broker
	start   int64
	fetches atomic.Int32
}

func (b *truncatedBroker) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	if topic == "out" {
		b.fetches.Add(1)
		if offset < b.start {
			return nil, 0, fmt.Errorf("fetch out/%d from %d: %w", partition, offset, kafka.OffsetOutOfRange)
		}
	}
	return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
}

func (b *truncatedBroker) StartOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	if topic == "out" {
		out := map[int]int64{}
		for _, p := range partitions {
			out[p] = b.start
		}
		return out, nil
	}
	return b.Broker.StartOffsets(ctx, topic, partitions)
}

// Keys whose owner died after writing their results are resumed by the
// next owner, whose scan must find those results without writing again:
// one pass over the partition for the whole batch, from the log start when
// the recorded floor was deleted. Before, the scan retried
// OFFSET_OUT_OF_RANGE for ever, and read the partition once per key.
func TestRecoveryScanStartsAtTheLogStartAndReadsOnce(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	const keys = 5
	// The dead owner: decided each key (floor 0 recorded), wrote the
	// results after 3 records that are deleted now, and died.
	var cmds []cmd
	for i := range keys {
		cmds = append(cmds, cmd{fmt.Sprintf("k%d", i), fmt.Sprintf(`{"n":%d}`, i), 0})
	}
	r.produce(cmds...)
	filler := make([]sinks.Message, 3)
	for i := range filler {
		filler[i] = sinks.Message{Topic: "out", Partition: 0, Value: []byte("deleted")}
	}
	if _, err := r.io.Write(context.Background(), filler); err != nil {
		t.Fatal(err)
	}
	dead := dedupe.Owner{Holder: "dead/g1/in/0"}
	canon, err := dedupe.NewCanonicalizer(pol.Rules)
	if err != nil {
		t.Fatal(err)
	}
	var results []sinks.Message
	for i := range keys {
		rec := dedupe.Record{Topic: "in", Partition: 0, Offset: int64(i), Value: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(fmt.Sprintf("k%d", i))}}}
		dead.Source = rec.Source()
		f, _ := canon.Fingerprint(rec.Value)
		decs, err := r.store.Decide(context.Background(), []dedupe.DecideRequest{{Namespace: "p", Key: fmt.Sprintf("k%d", i),
			Fingerprint: f, RulesDigest: canon.RulesDigest(), Semantics: dedupe.Strict, Window: pol.Window,
			Lease: time.Millisecond, Owner: dead, Intent: dedupe.Intent{Partition: 0, Floor: 0}}})
		if err != nil || decs[0].Verdict != dedupe.VerdictFirst {
			t.Fatalf("dead owner's decision: %+v %v", decs, err)
		}
		o := dedupe.Outcome{Key: fmt.Sprintf("k%d", i), Fingerprint: f, Decision: decs[0]}
		results = append(results, envelope.Result("out", 0, &rec, &o, rec.Source(), o.Decision.Entry.DecisionID(), rec.Value, nil))
	}
	if _, err := r.io.Write(context.Background(), results); err != nil {
		t.Fatal(err)
	}
	broker := &truncatedBroker{Broker: r.io, start: 3}
	stop := r.start(r.config(pol, nil, broker, "next"))
	defer stop()
	waitFor(t, "every key decided", func() bool { return r.count("p", "first") == keys })
	for k, n := range r.resultsPerKey() {
		if k != "" && n != 1 {
			t.Errorf("key %s has %d results, want 1 (the dead owner's)", k, n)
		}
	}
	if got := testutil.ToFloat64(r.metrics.ScanFloorTruncated().WithLabelValues("p")); got != 1 {
		t.Errorf("scan_floor_truncated_total = %v, want 1", got)
	}
	// One refused fetch at the floor, then one pass from the log start.
	if n := broker.fetches.Load(); n != 2 {
		t.Errorf("%d fetches of the output for %d resumed keys, want 2 (one pass)", n, keys)
	}
	for i := range keys {
		e, _, _ := r.store.Lookup(context.Background(), "p", fmt.Sprintf("k%d", i))
		if e.State != dedupe.Success || e.Result.Offset != int64(3+i) {
			t.Errorf("k%d: %s at %d, want SUCCESS at the dead owner's result %d", i, e.State, e.Result.Offset, 3+i)
		}
	}
}

// A replay of a key still PENDING under another owner, or whose result can
// no longer be read, gets no reply: it is counted, not skipped silently.
func TestSkippedRepliesAreCounted(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	pol.PendingTimeout = 200 * time.Millisecond
	other := dedupe.Owner{Holder: "elsewhere/g1/in/0", Source: "in/0/999"}
	canon, _ := dedupe.NewCanonicalizer(pol.Rules)
	fp, _ := canon.Fingerprint([]byte(`{"a":1}`))
	if _, err := r.store.Decide(context.Background(), []dedupe.DecideRequest{{Namespace: "p", Key: "held", Fingerprint: fp,
		RulesDigest: canon.RulesDigest(), Semantics: dedupe.Strict, Window: pol.Window, Lease: time.Hour, Owner: other,
		Intent: dedupe.Intent{Partition: 0, Floor: 0}}}); err != nil {
		t.Fatal(err)
	}
	cfg := r.config(pol, nil, nil, "test")
	cfg.Replies = "replies"
	r.produce(cmd{"held", `{"a":1}`, 0})
	stop := r.start(cfg)
	defer stop()
	waitFor(t, "the replay", func() bool { return r.count("p", "replay") == 1 })
	if got := testutil.ToFloat64(r.metrics.RepliesSkipped().WithLabelValues("p", "pending")); got != 1 {
		t.Errorf("replies_skipped_total{reason=pending} = %v, want 1", got)
	}
}

// An operator changes the rules inside a window: a copy that differs from
// the first only in a field the new rules call volatile is a replay, but
// one that really differs is still a conflict. Before, every mismatch under
// changed rules was taken as a replay.
func TestRulesChangeStillFindsRealConflicts(t *testing.T) {
	r := newRig(t, 1)
	before := r.policy(dedupe.Strict)
	r.produce(cmd{"k", `{"amount":50,"note":"a","client_time":"1"}`, 0})
	stop := r.start(r.config(before, nil, nil, "test"))
	waitFor(t, "the first copy", func() bool { return r.count("p", "first") == 1 })
	stop()

	after := before
	after.Rules = dedupe.CanonicalRules{Volatile: []string{"/client_time", "/note"}}
	r.produce(cmd{"k", `{"amount":50,"note":"b","client_time":"2"}`, 0}, cmd{"k", `{"amount":70,"note":"a","client_time":"3"}`, 0})
	stop = r.start(r.config(after, nil, nil, "test"))
	defer stop()
	waitFor(t, "both copies decided", func() bool { return r.count("p", "replay")+r.count("p", "conflict") == 2 })
	if r.count("p", "replay") != 1 || r.count("p", "conflict") != 1 {
		t.Errorf("replay=%d conflict=%d, want 1 and 1", r.count("p", "replay"), r.count("p", "conflict"))
	}
	dlq := r.readAll("dlq")
	if len(dlq) != 1 || header(dlq[0], "idemstream-reason") != "conflict" || header(dlq[0], "idemstream-source") != "in/0/2" {
		t.Errorf("dead letters: %d, want the amount change (in/0/2) as a conflict", len(dlq))
	}
}

// countingStore counts Decide calls.
type countingStore struct {
	dedupe.Store
	decides atomic.Int32
}

func (s *countingStore) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	s.decides.Add(1)
	return s.Store.Decide(ctx, reqs)
}

// With the default lease (a minute) and a batch that takes milliseconds,
// more than SettleWait plus a write is left when the results are written:
// the batch costs one decide and one complete, no renewal.
func TestLeaseIsRenewedOnlyWhenItMayRunShort(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	pol.PendingTimeout = 30 * time.Second
	counting := &countingStore{Store: r.store}
	r.store = counting
	r.produce(cmd{"k1", `{"a":1}`, 0}, cmd{"k2", `{"a":2}`, 0})
	stop := r.start(r.config(pol, nil, nil, "test"))
	defer stop()
	waitFor(t, "two firsts", func() bool { return r.count("p", "first") == 2 })
	if n := counting.decides.Load(); n != 1 {
		t.Errorf("%d store decide calls for one batch, want 1 (no renewal needed)", n)
	}
}

// A lease exactly as long as the settle wait plus a write, the shortest
// the configuration accepts, still leaves every write its time: the write
// must end before the lease minus the settle wait, and a renewal just
// before it leaves WriteTimeout. Before, the deadline also took the write
// time off, was already past, and every write was retried for ever.
func TestWriteFitsAShortestLease(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	pol.PendingTimeout = 500 * time.Millisecond
	cfg := r.config(pol, nil, nil, "test")
	cfg.SettleWait, cfg.WriteTimeout = 750*time.Millisecond, 250*time.Millisecond
	r.produce(cmd{"k1", `{"a":1}`, 0})
	stop := r.start(cfg)
	defer stop()
	waitFor(t, "k1's result", func() bool { return r.resultsPerKey()["k1"] == 1 })
}

// interleavingStore makes the first two two-record batches decide their
// records one at a time, meeting between the first and the second: each
// batch then owns its first key while the other owns its second, the
// interleaving that a real store allows when two partitions decide at once.
type interleavingStore struct {
	dedupe.Store
	mu      sync.Mutex
	arrived int
	both    chan struct{}
	finals  atomic.Int32
}

func (s *interleavingStore) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	for _, r := range reqs {
		if r.Final {
			s.finals.Add(1)
		}
	}
	s.mu.Lock()
	meet := len(reqs) == 2 && s.arrived < 2
	if meet {
		s.arrived++
		if s.arrived == 2 {
			close(s.both)
		}
	}
	s.mu.Unlock()
	if !meet {
		return s.Store.Decide(ctx, reqs)
	}
	first, err := s.Store.Decide(ctx, reqs[:1])
	if err != nil {
		return nil, err
	}
	select {
	case <-s.both:
	case <-time.After(10 * time.Second):
	}
	second, err := s.Store.Decide(ctx, reqs[1:])
	if err != nil {
		return nil, err
	}
	return append(first, second...), nil
}

// Two partitions whose batches each hold a key the other one's batch waits
// for: each finishes its own first copies before it waits for the other's,
// so neither waits out pending_timeout (30s here, the default). Before, each
// held its keys PENDING while it waited the full pending_timeout for the
// other's, and a generation shorter than that abandoned them over and over.
func TestCrossPartitionBatchesDoNotWaitEachOtherOut(t *testing.T) {
	r := newRig(t, 2)
	pol := r.policy(dedupe.Strict)
	pol.PendingTimeout = 30 * time.Second
	store := &interleavingStore{Store: r.store, both: make(chan struct{})}
	r.store = store
	r.produce(cmd{"x", `{"k":"x"}`, 0}, cmd{"y", `{"k":"y"}`, 0}, cmd{"y", `{"k":"y"}`, 1}, cmd{"x", `{"k":"x"}`, 1})
	stop := r.start(r.config(pol, nil, nil, "test"))
	defer stop()
	waitFor(t, "4 decided records", func() bool { return r.count("p", "first")+r.count("p", "replay") == 4 })
	for k, n := range r.resultsPerKey() {
		if n != 1 {
			t.Errorf("key %s has %d results", k, n)
		}
	}
	if n := store.finals.Load(); n != 0 {
		t.Errorf("%d records were decided only after pending_timeout, want none", n)
	}
}

// pollingBroker long-polls fetches of the input until records come (the
// fake broker returns empty after MaxWait), and tells when one returned.
type pollingBroker struct {
	consumer.Broker
	returned chan time.Time
}

func (b *pollingBroker) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	if maxWait <= time.Millisecond {
		// A top-up: it asks for what is there, it does not wait.
		return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
	}
	for {
		recs, hw, err := b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
		if err != nil || len(recs) > 0 || topic != "in" {
			if err == nil && topic == "in" && offset > 0 {
				select {
				case b.returned <- time.Now():
				default:
				}
			}
			return recs, hw, err
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
	}
}

// gatedStore holds the first Decide until released and records the keys
// of every Decide call.
type gatedStore struct {
	dedupe.Store
	entered, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	calls            [][]string
}

func (s *gatedStore) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	s.once.Do(func() {
		close(s.entered)
		<-s.release
	})
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	s.mu.Lock()
	s.calls = append(s.calls, keys)
	s.mu.Unlock()
	return s.Store.Decide(ctx, reqs)
}

// A consumer that keeps up decides, when its batch starts, every record
// that arrived while the batch before it was busy: the fetch ahead, which
// returned with the first of them, is topped up. Before, those records
// waited for one more batch, which doubled the latency of a record.
func TestFetchAheadIsToppedUpWhenItsBatchStarts(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	broker := &pollingBroker{Broker: r.io, returned: make(chan time.Time, 1)}
	cfg := r.config(pol, nil, broker, "test")
	gs := &gatedStore{Store: r.store, entered: make(chan struct{}), release: make(chan struct{})}
	store := consumer.InstrumentStore(gs, r.metrics)
	d, err := dedupe.NewDecider(pol, store)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Decider, cfg.Store = d, store
	r.produce(cmd{"k0", `{"n":0}`, 0})
	stop := r.start(cfg)
	defer stop()
	select { // the first batch is busy deciding k0; the fetch ahead waits for records
	case <-gs.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("k0 was never decided")
	}
	r.produce(cmd{"k1", `{"n":1}`, 0})
	var at time.Time
	select {
	case at = <-broker.returned:
	case <-time.After(20 * time.Second):
		t.Fatal("the fetch ahead did not return with k1")
	}
	r.produce(cmd{"k2", `{"n":2}`, 0}, cmd{"k3", `{"n":3}`, 0}, cmd{"k4", `{"n":4}`, 0}, cmd{"k5", `{"n":5}`, 0})
	for time.Since(at) <= 3*time.Millisecond { // the fetch ahead is older than topUpAfter
		time.Sleep(time.Millisecond)
	}
	close(gs.release)
	waitFor(t, "six firsts", func() bool { return r.count("p", "first") == 6 })
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, keys := range gs.calls {
		if fmt.Sprint(keys) == "[k1 k2 k3 k4 k5]" {
			return
		}
	}
	t.Errorf("Decide calls %v: want k1 to k5 decided in one batch", gs.calls)
}
