package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// holdKey makes key PENDING under another holder for an hour.
func (r *rig) holdKey(pol dedupe.Policy, key, body string) {
	r.t.Helper()
	canon, _ := dedupe.NewCanonicalizer(pol.Rules)
	fp, _ := canon.Fingerprint([]byte(body))
	if _, err := r.store.Decide(context.Background(), []dedupe.DecideRequest{{Namespace: "p", Key: key, Fingerprint: fp,
		RulesDigest: canon.RulesDigest(), Semantics: dedupe.Strict, Window: pol.Window, Lease: time.Hour,
		Owner: dedupe.Owner{Holder: "elsewhere/g1/in/0", Source: "in/0/999"}, Intent: dedupe.Intent{Partition: 0, Floor: 0}}}); err != nil {
		r.t.Fatal(err)
	}
}

// A record that phase 1 finishes after the first record that waits stays
// uncommitted while the batch waits. If the wait is abandoned (SIGTERM,
// the pipeline stopped), its entry is kept as long as an abandoned batch's:
// a stop and an outage longer than the window would otherwise decide it
// first again. While the batch only waits it keeps its window, so that
// batches that wait do not hold a day of entries in Redis.
func TestRecordsAfterAnAbandonedWaitAreKeptLonger(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	pol.PendingTimeout = 10 * time.Second
	r.holdKey(pol, "held", `{"a":"held"}`)
	r.produce(cmd{"k0", `{"n":0}`, 0}, cmd{"held", `{"a":"held"}`, 0}, cmd{"k2", `{"n":2}`, 0})
	stop := r.start(r.config(pol, nil, nil, "a"))
	waitFor(t, "k0 and k2 done, the offset before the wait committed", func() bool {
		return r.count("p", "first") == 2 && r.committed("g-p", 0) == 1
	})
	kept := func(key string) time.Duration {
		e, _, _ := r.store.Lookup(context.Background(), "p", key)
		if e.State != dedupe.Success {
			t.Fatalf("%s: %s, want SUCCESS", key, e.State)
		}
		return e.ExpiresAt.Sub(e.Now)
	}
	if left := kept("k2"); left > pol.Window+time.Minute {
		t.Errorf("k2 kept %v while its batch waits, want its window (%v)", left, pol.Window)
	}
	stop() // SIGTERM while the batch waits for the held key
	if got := r.committed("g-p", 0); got != 1 {
		t.Fatalf("committed %d after the abandoned wait, want 1", got)
	}
	if left := kept("k2"); left < dedupe.PendingRetention-time.Minute {
		t.Errorf("k2 kept %v after its batch was abandoned, want at least %v", left, dedupe.PendingRetention)
	}
	if left := kept("k0"); left > pol.Window+time.Minute {
		t.Errorf("k0 (committed) kept %v, want its window", left)
	}
}

// A failed first copy whose dead letter was written, in a batch that then
// ends early, is completed FAILED, not released: read again it is a
// replay, and the input never gets a dead letter and a result.
func TestAbandonedBatchKeepsItsDeadLetteredKeysFailed(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	failing := consumer.HandlerFunc(func(_ context.Context, c consumer.Command) (consumer.Result, error) {
		if c.Key == "k2" {
			return consumer.Result{}, consumer.Permanent(errors.New("no stock"))
		}
		return consumer.Result{Value: c.Record.Value}, nil
	})
	r.produce(cmd{"k1", `{"a":1}`, 0}, cmd{"k1", `{"a":1}`, 0}, cmd{"k2", `{"b":1}`, 0})
	// The replies topic refuses: the batch ends after its dead letter.
	cfg := r.config(pol, failing, &refusingBroker{Broker: r.io, topic: "replies"}, "a")
	cfg.Replies = "replies"
	p, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background()); !errors.Is(err, dedupe.ErrBrokerRefused) {
		t.Fatalf("Run = %v, want the replies topic's refusal", err)
	}
	if e, _, _ := r.store.Lookup(context.Background(), "p", "k2"); e.State != dedupe.Failed {
		t.Errorf("k2 after the abandoned batch: %s, want FAILED", e.State)
	}
	stop := r.start(r.config(pol, nil, nil, "b"))
	defer stop()
	waitFor(t, "the batch read again and committed", func() bool { return r.committed("g-p", 0) == 3 })
	for _, f := range r.readAll("out") {
		if header(f, sinks.HeaderSource) == "in/0/2" {
			t.Errorf("in/0/2 has a dead letter and a result")
		}
	}
}

// A reply is the stored result or nothing: one the replies topic refuses
// for its size is left out and counted, never written cut.
func TestReplyTooLargeIsSkippedNotCut(t *testing.T) {
	r := newRig(t, 1)
	r.setTopicConfig("replies", "max.message.bytes", "2048")
	pol := r.policy(dedupe.Strict)
	raw := make([]byte, 2200)
	_, _ = rand.Read(raw)
	body := `{"x":"` + base64.StdEncoding.EncodeToString(raw)[:2900] + `"}`
	r.produce(cmd{"k", body, 0}, cmd{"k", body, 0})
	cfg := r.config(pol, nil, nil, "test")
	cfg.Replies = "replies"
	stop := r.start(cfg)
	defer stop()
	waitFor(t, "the offset at the end", func() bool { return r.committed("g-p", 0) == 2 })
	if n := len(r.readAll("replies")); n != 0 {
		t.Errorf("%d replies written for a result the topic cannot take whole, want none", n)
	}
	if got := testutil.ToFloat64(r.metrics.RepliesSkipped().WithLabelValues("p", "too_large")); got != 1 {
		t.Errorf("replies_skipped_total{reason=too_large} = %v, want 1", got)
	}
}

// emptyOut answers every fetch of the output below its high watermark
// with nothing, as a broker whose log is being moved may.
type emptyOut struct {
	consumer.Broker
	fetches atomic.Int32
}

func (b *emptyOut) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	if topic == "out" {
		b.fetches.Add(1)
		return nil, offset + 5, nil
	}
	return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
}

// A scan that cannot read a stretch below the high watermark pauses (not
// ready) and reads again; it neither takes the stretch for empty nor stops
// the pipeline.
func TestScanOfAnUnreadableStretchPauses(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	r.produce(cmd{"k", `{"a":1}`, 0})
	r.plantResult(pol, "k", "in/0/0", nil, false)
	b := &emptyOut{Broker: r.io}
	p, err := consumer.New(r.config(pol, nil, b, "test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, "the pipeline paused on the scan", func() bool { return b.fetches.Load() > 50 && !p.Ready() })
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while the stretch could not be read", err)
	default:
	}
	if n := len(r.readAll("out")); n != 1 {
		t.Errorf("%d results, want only the one planted (nothing written while the scan cannot tell)", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// latestRace writes a record into the input between the pipeline's start
// and its first fetch at "the latest", as a producer may.
type latestRace struct {
	consumer.Broker
	calls atomic.Int32
}

func (b *latestRace) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	if topic == "in" && offset == kafka.LastOffset {
		b.calls.Add(1)
	}
	return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
}

// "latest" is resolved once, and committed at once: a fetch that returns
// nothing never moves the start past records that came meanwhile.
func TestStartAtLatestIsResolvedOnce(t *testing.T) {
	r := newRig(t, 1)
	r.produce(cmd{"before", `{"a":0}`, 0})
	b := &latestRace{Broker: r.io}
	cfg := r.config(r.policy(dedupe.Strict), nil, b, "test")
	cfg.Start = consumer.StartAt{Latest: true}
	stop := r.start(cfg)
	defer stop()
	waitFor(t, "the resolved start committed", func() bool { return r.committed("g-p", 0) == 1 })
	r.produce(cmd{"after-1", `{"a":1}`, 0})
	r.produce(cmd{"after-2", `{"a":2}`, 0})
	waitFor(t, "the offset at the end", func() bool { return r.committed("g-p", 0) == 3 })
	per := r.resultsPerKey()
	if per["before"] != 0 || per["after-1"] != 1 || per["after-2"] != 1 || b.calls.Load() != 0 {
		t.Errorf("results %v, %d fetches at \"latest\"; want after-1 and after-2 only, no fetch at \"latest\"", per, b.calls.Load())
	}
}

// refuseOneDeadLetter writes every dead letter but those of one reason,
// which the topic refuses for good.
type refuseOneDeadLetter struct {
	consumer.Broker
	reason string
}

func (b *refuseOneDeadLetter) Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error) {
	out := make([]sinks.Written, len(msgs))
	var pass []sinks.Message
	var at []int
	for i, m := range msgs {
		if r, _ := sinks.HeaderValue(m.Headers, sinks.HeaderReason); m.Topic == "dlq" && r == b.reason {
			out[i] = sinks.Written{Partition: -1, Offset: dedupe.NoPosition, Err: dedupe.ErrBrokerRefused}
			continue
		}
		pass, at = append(pass, m), append(at, i)
	}
	w, err := b.Broker.Write(ctx, pass)
	for j, i := range at {
		if w != nil {
			out[i] = w[j]
		}
	}
	if err == nil && len(pass) < len(msgs) {
		err = dedupe.ErrBrokerRefused
	}
	return out, err
}

// A failed first copy whose dead letter was acknowledged stays FAILED when
// another dead letter of its batch is refused and the pipeline stops: read
// again, its record is a replay, never a result too.
func TestAcknowledgedDeadLetterKeepsItsKeyFailed(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	failing := consumer.HandlerFunc(func(_ context.Context, c consumer.Command) (consumer.Result, error) {
		return consumer.Result{}, consumer.Permanent(errors.New("no stock"))
	})
	r.produce(cmd{"k1", `{"a":1}`, 0}, cmd{"", `{"no":"key"}`, 0})
	p, err := consumer.New(r.config(pol, failing, &refuseOneDeadLetter{Broker: r.io, reason: "missing_key"}, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(context.Background()); !errors.Is(err, dedupe.ErrBrokerRefused) {
		t.Fatalf("Run = %v, want the refusal", err)
	}
	if e, _, _ := r.store.Lookup(context.Background(), "p", "k1"); e.State != dedupe.Failed {
		t.Errorf("k1 after its dead letter was acknowledged and the batch stopped: %s, want FAILED", e.State)
	}
}
