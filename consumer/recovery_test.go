package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/sinks"
)

// plantResult decides key for a dead owner (its lease already over, floor
// 0), and writes into out a result for it with the given source, as
// written for decision (nil: the entry's own), or with legacy as the
// release before wrote it, without idemstream-decision.
func (r *rig) plantResult(pol dedupe.Policy, key string, source string, decision *dedupe.Decision, legacy bool) {
	r.t.Helper()
	canon, _ := dedupe.NewCanonicalizer(pol.Rules)
	body := []byte(`{"a":1}`)
	fp, _ := canon.Fingerprint(body)
	decs, err := r.store.Decide(context.Background(), []dedupe.DecideRequest{{Namespace: "p", Key: key,
		Fingerprint: fp, RulesDigest: canon.RulesDigest(), Semantics: dedupe.Strict, Window: pol.Window,
		Lease: time.Millisecond, Owner: dedupe.Owner{Holder: "dead/g1/in/0", Source: "in/0/0"}, Intent: dedupe.Intent{Partition: 0, Floor: 0}}})
	if err != nil || decs[0].Verdict != dedupe.VerdictFirst {
		r.t.Fatalf("dead owner's decision: %+v %v", decs, err)
	}
	if decision == nil {
		decision = &decs[0]
	}
	rec := dedupe.Record{Topic: "x", Partition: 0, Offset: 0, Value: body,
		Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(key)}}}
	o := dedupe.Outcome{Key: key, Fingerprint: fp, Decision: *decision}
	res := envelope.Result("out", 0, &rec, &o, rec.Source(), o.Decision.Entry.DecisionID(), body, nil)
	hs := res.Headers[:0]
	for _, h := range res.Headers {
		switch {
		case h.Key == sinks.HeaderSource:
			h.Value = []byte(source)
		case h.Key == sinks.HeaderDecision && legacy:
			continue
		}
		hs = append(hs, h)
	}
	res.Headers = hs
	if _, err := r.io.Write(context.Background(), []sinks.Message{res}); err != nil {
		r.t.Fatal(err)
	}
}

// The scan takes a result for its key's only when it names the same
// decision: a result of the key's previous window (another first source,
// another window start) in the scanned stretch is not this decision's,
// and the key gets a result of its own. Before, any result with the key
// and a source on the input matched.
func TestRecoveryScanMatchesTheDecision(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	previous := dedupe.Decision{Entry: dedupe.Entry{FirstSource: "in/0/7", WindowStart: time.Now().Add(-time.Hour)}}
	r.produce(cmd{"k", `{"a":1}`, 0})
	r.plantResult(pol, "k", "in/0/7", &previous, false)
	stop := r.start(r.config(pol, nil, nil, "next"))
	defer stop()
	waitFor(t, "k decided", func() bool { return r.count("p", "first") == 1 })
	e, _, _ := r.store.Lookup(context.Background(), "p", "k")
	out := r.readAll("out")
	if len(out) != 2 || e.State != dedupe.Success || e.Result.Offset != 1 {
		t.Fatalf("%d results, k %s at %d; want the previous window's result left alone and a new one at 1", len(out), e.State, e.Result.Offset)
	}
	if got := header(out[1], "idemstream-decision"); got != e.DecisionID() {
		t.Errorf("the new result names decision %q, want %q", got, e.DecisionID())
	}
}

// A result of this decision is found (nothing written again), and one
// without a decision header (written by the release before) is matched
// by key and source topic, as that release did; one whose source is on
// another topic never is.
func TestRecoveryScanFindsItsOwnAndLegacyResults(t *testing.T) {
	for _, tc := range []struct {
		name, source string
		legacy       bool
		results      int
	}{
		{"ownDecision", "in/0/0", false, 1},
		{"legacyResult", "in/0/0", true, 1},
		{"otherInput", "elsewhere/0/0", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 1)
			pol := r.policy(dedupe.Strict)
			r.produce(cmd{"k", `{"a":1}`, 0})
			r.plantResult(pol, "k", tc.source, nil, tc.legacy)
			stop := r.start(r.config(pol, nil, nil, "next"))
			defer stop()
			waitFor(t, "k decided", func() bool { return r.count("p", "first") == 1 })
			if n := len(r.readAll("out")); n != tc.results {
				t.Errorf("%d results in out, want %d", n, tc.results)
			}
		})
	}
}

// flakyInput fails the first fetches of one input offset with a broker
// error that passes.
type flakyInput struct {
	consumer.Broker
	offset   int64
	failures atomic.Int32
}

func (b *flakyInput) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	if topic == "in" && offset == b.offset && b.failures.Add(-1) >= 0 {
		return nil, 0, fmt.Errorf("fetch in/0 from %d: %w: %w", offset, dedupe.ErrBrokerUnavailable, errors.New("connection reset"))
	}
	return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
}

// Under changed rules a copy that really differs is a conflict even when
// the first read of its first copy fails: the read is tried again, never
// taken for "the first copy is gone" (which would make it a replay).
func TestRulesChangeRecheckRetriesAFailedRead(t *testing.T) {
	r := newRig(t, 1)
	before := r.policy(dedupe.Strict)
	r.produce(cmd{"k", `{"amount":50,"client_time":"1"}`, 0})
	stop := r.start(r.config(before, nil, nil, "test"))
	waitFor(t, "the first copy", func() bool { return r.count("p", "first") == 1 })
	stop()

	after := before
	after.Rules = dedupe.CanonicalRules{Volatile: []string{"/client_time", "/note"}}
	r.produce(cmd{"k", `{"amount":70,"client_time":"2"}`, 0})
	broker := &flakyInput{Broker: r.io, offset: 0}
	broker.failures.Store(3)
	stop = r.start(r.config(after, nil, broker, "test"))
	defer stop()
	waitFor(t, "the changed copy decided", func() bool { return r.count("p", "replay")+r.count("p", "conflict") == 1 })
	if r.count("p", "conflict") != 1 {
		t.Errorf("replay=%d conflict=%d, want the changed amount as a conflict", r.count("p", "replay"), r.count("p", "conflict"))
	}
	if broker.failures.Load() >= 0 {
		t.Errorf("the failing reads were not all made (%d left)", broker.failures.Load())
	}
}

// Under changed rules, a copy of a FAILED key whose body really differs
// is a conflict, not a rerun; one that differs only in a field the new
// rules call volatile reruns the handler.
func TestRulesChangeChecksBeforeARerun(t *testing.T) {
	r := newRig(t, 1)
	before := r.policy(dedupe.Strict)
	failing := consumer.HandlerFunc(func(_ context.Context, c consumer.Command) (consumer.Result, error) {
		return consumer.Result{}, consumer.Permanent(errors.New("no stock"))
	})
	r.produce(cmd{"k", `{"amount":50,"note":"a"}`, 0})
	stop := r.start(r.config(before, failing, nil, "test"))
	waitFor(t, "the failed first copy", func() bool { return r.count("p", "failed") == 1 })
	stop()

	after := before
	after.Rules = dedupe.CanonicalRules{Volatile: []string{"/client_time", "/note"}}
	r.produce(cmd{"k", `{"amount":70,"note":"a"}`, 0}, cmd{"k", `{"amount":50,"note":"b"}`, 0})
	stop = r.start(r.config(after, nil, nil, "test"))
	defer stop()
	waitFor(t, "both copies decided", func() bool { return r.count("p", "conflict")+r.count("p", "first") == 2 })
	if r.count("p", "conflict") != 1 || r.count("p", "first") != 1 {
		t.Errorf("conflict=%d first=%d, want the changed amount a conflict and the note change a rerun", r.count("p", "conflict"), r.count("p", "first"))
	}
	out := r.readAll("out")
	if len(out) != 1 || header(out[0], "idemstream-source") != "in/0/2" {
		t.Errorf("%d results, want one for the rerun at in/0/2", len(out))
	}
}

// The record whose own decision failed, delivered again (its offset was
// not committed), is a replay: it never gets a result besides its dead
// letter.
func TestFailedRecordDeliveredAgainIsAReplay(t *testing.T) {
	r := newRig(t, 1)
	pol := r.policy(dedupe.Strict)
	failing := consumer.HandlerFunc(func(_ context.Context, c consumer.Command) (consumer.Result, error) {
		return consumer.Result{}, consumer.Permanent(errors.New("no stock"))
	})
	r.produce(cmd{"k", `{"a":1}`, 0})
	cfg := r.config(pol, failing, nil, "a")
	cfg.Group = "group-a"
	stop := r.start(cfg)
	waitFor(t, "the failure", func() bool { return r.count("p", "failed") == 1 })
	stop()
	// Another group reads the record again, as one whose commit was lost.
	cfg = r.config(pol, nil, nil, "b")
	cfg.Group = "group-b"
	stop = r.start(cfg)
	defer stop()
	waitFor(t, "the redelivery decided", func() bool { return r.count("p", "replay")+r.count("p", "first") == 1 })
	if n := len(r.readAll("out")); n != 0 || r.count("p", "replay") != 1 {
		t.Errorf("%d results and %d replays for the failed record delivered again, want none and 1", n, r.count("p", "replay"))
	}
}
