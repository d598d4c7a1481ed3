package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// committed is the group's committed offset of in/partition (-1: none).
func (r *rig) committed(group string, partition int) int64 {
	r.t.Helper()
	res, err := r.client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{"in": {partition}}})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, p := range res.Topics["in"] {
		if p.Partition == partition {
			return p.CommittedOffset
		}
	}
	return -1
}

// setTopicConfig sets one configuration entry of a topic.
func (r *rig) setTopicConfig(topic, name, value string) {
	r.t.Helper()
	res, err := r.client.AlterConfigs(context.Background(), &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic,
		Configs: []kafka.AlterConfigRequestConfig{{Name: name, Value: value}},
	}}})
	if err == nil {
		for _, e := range res.Errors {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		r.t.Fatal(err)
	}
}

// A partition of ordinary commands with two that cannot be passed on as
// they came: a payload far over max_payload_bytes that no codec shrinks,
// and a valid command whose headers push its result over the output's
// limit. Each large one gets exactly one dead letter, trimmed to fit and
// naming its size; every ordinary command one result; the offset moves to
// the end; nothing is written twice. Before, the batch was read again
// without end, and its results were written again once their window ran
// out.
func TestRecordsTooLargeToPassOnGetOneOutcomeEach(t *testing.T) {
	r := newRig(t, 1)
	// The input takes what a compressed producer batch can carry; the
	// output and dead-letter topics keep the broker's 1 MiB.
	r.setTopicConfig("in", "max.message.bytes", strconv.Itoa(8<<20))
	pol := r.policy(dedupe.Strict)
	var cmds []cmd
	for i := range 10 {
		cmds = append(cmds, cmd{fmt.Sprintf("k%d", i), fmt.Sprintf(`{"n":%d}`, i), 0})
	}
	r.produce(cmds...)
	big := incompressible(1500 << 10)
	hdr := dedupe.Header{Key: "X-Trace", Value: incompressible(1100 << 10)}
	if _, err := r.io.Write(context.Background(), []sinks.Message{
		{Topic: "in", Partition: 0, Value: big, Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte("big")}}},
		{Topic: "in", Partition: 0, Value: []byte(`{"n":"hdr"}`), Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte("hdr")}, hdr}},
	}); err != nil {
		t.Fatal(err)
	}
	cmds = cmds[:0]
	for i := 10; i < 20; i++ {
		cmds = append(cmds, cmd{fmt.Sprintf("k%d", i), fmt.Sprintf(`{"n":%d}`, i), 0})
	}
	r.produce(cmds...)

	p, err := consumer.New(r.config(pol, nil, nil, "test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitFor(t, "the offset at the end of the partition", func() bool { return r.committed("g-p", 0) == 22 })

	perKey := r.resultsPerKey()
	for i := range 20 {
		if n := perKey[fmt.Sprintf("k%d", i)]; n != 1 {
			t.Errorf("k%d has %d results, want 1", i, n)
		}
	}
	if perKey["big"]+perKey["hdr"] != 0 {
		t.Errorf("results for the large records: big %d, hdr %d, want none", perKey["big"], perKey["hdr"])
	}
	dlq := r.readAll("dlq")
	bySource := map[string]sinks.Fetched{}
	for _, d := range dlq {
		bySource[header(d, "idemstream-source")] = d
	}
	if len(dlq) != 2 || len(bySource) != 2 {
		t.Fatalf("%d dead letters for %d sources, want one each for the two large records", len(dlq), len(bySource))
	}
	b, h := bySource["in/0/10"], bySource["in/0/11"]
	if header(b, "idemstream-reason") != "payload_too_large" || header(b, "idemstream-payload-size") != strconv.Itoa(len(big)) ||
		len(b.Value) == 0 || len(b.Value) >= len(big) || string(b.Value) != string(big[:len(b.Value)]) {
		t.Errorf("big's dead letter: reason %q size %q, %d payload bytes; want payload_too_large, its size, a prefix of the payload",
			header(b, "idemstream-reason"), header(b, "idemstream-payload-size"), len(b.Value))
	}
	if header(h, "idemstream-reason") != "payload_too_large" || header(h, "idemstream-fingerprint") == "" || header(h, "X-Trace") != "" {
		t.Errorf("hdr's dead letter: reason %q fingerprint %q, X-Trace kept %v; want payload_too_large with its fingerprint, without the huge header",
			header(h, "idemstream-reason"), header(h, "idemstream-fingerprint"), header(h, "X-Trace") != "")
	}
	if got := r.count("p", "first") + r.count("p", "invalid") + r.count("p", "failed"); got != 22 {
		t.Errorf("%d outcomes counted, want 22", got)
	}
}

// An error tied to no record that retrying cannot cure stops the pipeline
// once; the keys the batch completed are kept for at least a day, since
// its records are read again whenever the pipeline starts again, and a
// window that ran out meanwhile would decide them first again.
func TestStoppedBatchKeepsItsCompletedKeysPastTheWindow(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	broker := &refusingBroker{Broker: r.io, topic: "dlq"}
	p, err := consumer.New(r.config(pol, nil, broker, "test"))
	if err != nil {
		t.Fatal(err)
	}
	r.produce(cmd{"k1", `{"a":1}`, 0}, cmd{"", `{"no":"key"}`, 0})
	if err := p.Run(context.Background()); !errors.Is(err, dedupe.ErrBrokerRefused) {
		t.Fatalf("Run = %v, want the refusal", err)
	}
	e, ok, err := r.store.Lookup(context.Background(), "p", "k1")
	if err != nil || !ok || e.State != dedupe.Success {
		t.Fatalf("k1: %+v %v %v, want SUCCESS", e, ok, err)
	}
	if left := e.ExpiresAt.Sub(e.Now); left < dedupe.PendingRetention-time.Minute {
		t.Errorf("k1 is kept %v after its batch was abandoned, want at least %v", left, dedupe.PendingRetention)
	}
	if got := r.committed("g-p", 0); got > 0 {
		t.Errorf("committed offset %d past a record with no outcome", got)
	}
}

// A batch commits the records it has finished before it waits for a key
// another holder owns: a crash during the wait, and an outage longer than
// the window, must not find them completed but uncommitted. Before, the
// offset moved only after the wait.
func TestBatchCommitsWhatIsCompleteBeforeItWaits(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	pol.PendingTimeout = 10 * time.Second
	other := dedupe.Owner{Holder: "elsewhere/g1/in/0", Source: "in/0/999"}
	canon, _ := dedupe.NewCanonicalizer(pol.Rules)
	fp, _ := canon.Fingerprint([]byte(`{"a":"held"}`))
	if _, err := r.store.Decide(context.Background(), []dedupe.DecideRequest{{Namespace: "p", Key: "held", Fingerprint: fp,
		RulesDigest: canon.RulesDigest(), Semantics: dedupe.Strict, Window: pol.Window, Lease: time.Hour, Owner: other,
		Intent: dedupe.Intent{Partition: 0, Floor: 0}}}); err != nil {
		t.Fatal(err)
	}
	var cmds []cmd
	for i := range 5 {
		cmds = append(cmds, cmd{fmt.Sprintf("k%d", i), fmt.Sprintf(`{"n":%d}`, i), 0})
	}
	r.produce(append(cmds, cmd{"held", `{"a":"held"}`, 0})...)
	stop := r.start(r.config(pol, nil, nil, "test"))
	defer stop()
	waitFor(t, "the finished records committed", func() bool {
		if r.count("p", "replay") > 0 {
			t.Fatal("the held key was decided before the finished records were committed")
		}
		return r.committed("g-p", 0) == 5
	})
	waitFor(t, "the held key decided after pending_timeout", func() bool { return r.count("p", "replay") == 1 })
	waitFor(t, "the offset at the end", func() bool { return r.committed("g-p", 0) == 6 })
}

// lateBroker reports its first result write as failed without appending
// it; with visibleLate it appends the records once the partition is next
// read, as a leader that acknowledged nothing but had appended does when
// its records become visible after the client gave up.
type lateBroker struct {
	consumer.Broker
	visibleLate bool
	mu          sync.Mutex
	held        []sinks.Message
	failed      bool
	appended    atomic.Bool
}

func (b *lateBroker) Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error) {
	b.mu.Lock()
	if !b.failed && len(msgs) > 0 && msgs[0].Topic == "out" {
		b.failed = true
		b.held = append([]sinks.Message(nil), msgs...)
		b.mu.Unlock()
		return nil, fmt.Errorf("produce to out: %w: %w", sinks.ErrAmbiguous, context.DeadlineExceeded)
	}
	b.mu.Unlock()
	return b.Broker.Write(ctx, msgs)
}

func (b *lateBroker) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	b.mu.Lock()
	if topic == "out" && b.visibleLate && len(b.held) > 0 {
		held := b.held
		b.held = nil
		b.mu.Unlock()
		if _, err := b.Broker.Write(ctx, held); err != nil {
			return nil, 0, err
		}
		b.appended.Store(true)
	} else {
		b.mu.Unlock()
	}
	return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
}

// A write of unknown outcome is settled by the scan either way: a write
// that was never appended is written again, one that becomes visible
// only after the error is found and not repeated. Each key has one result.
func TestAmbiguousWriteSettlesEitherWay(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("visibleLate=%v", late), func(t *testing.T) {
			r := newRig(t, 1)
			broker := &lateBroker{Broker: r.io, visibleLate: late}
			r.produce(cmd{"k1", `{"a":1}`, 0}, cmd{"k2", `{"a":2}`, 0})
			stop := r.start(r.config(r.policy(dedupe.Strict), nil, broker, "test"))
			defer stop()
			waitFor(t, "two firsts", func() bool { return r.count("p", "first") == 2 })
			if late != broker.appended.Load() {
				t.Fatalf("the late append happened: %v, want %v", broker.appended.Load(), late)
			}
			perKey := r.resultsPerKey()
			if len(perKey) != 2 || perKey["k1"] != 1 || perKey["k2"] != 1 {
				t.Errorf("results per key: %v, want k1 and k2 once each", perKey)
			}
		})
	}
}

// The dead-letter topic is deleted while the pipeline runs: the partition
// pauses (not ready), commits nothing past the record it cannot finish,
// and once the topic is back writes its dead letter once and goes on.
func TestTopicDeletedWhileRunning(t *testing.T) {
	r := newRig(t, 1)
	p := r.pipeline(r.policy(dedupe.Strict), nil, "")
	r.produce(cmd{"k1", `{"a":1}`, 0})
	stop := r.run(p)
	defer stop()
	waitFor(t, "k1 committed", func() bool { return r.committed("g-p", 0) == 1 })
	res, err := r.client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{"dlq"}})
	if err != nil || res.Errors["dlq"] != nil {
		t.Fatalf("delete dlq: %v %v", err, res.Errors)
	}
	r.produce(cmd{"", `{"no":"key"}`, 0}, cmd{"k2", `{"a":2}`, 0})
	waitFor(t, "the pipeline paused", func() bool { return !p.Ready() })
	if got := r.committed("g-p", 0); got != 1 {
		t.Errorf("committed %d while the dead letter cannot be written, want 1", got)
	}
	cres, err := r.client.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: "dlq", NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil || cres.Errors["dlq"] != nil {
		t.Fatalf("create dlq: %v %v", err, cres.Errors)
	}
	waitFor(t, "the offset at the end", func() bool { return r.committed("g-p", 0) == 3 })
	waitFor(t, "ready again", p.Ready)
	if dlq := r.readAll("dlq"); len(dlq) != 1 || header(dlq[0], "idemstream-reason") != "missing_key" {
		t.Errorf("%d dead letters after the topic came back, want the missing key once", len(dlq))
	}
	if n := r.resultsPerKey()["k2"]; n != 1 {
		t.Errorf("k2 has %d results, want 1", n)
	}
}
