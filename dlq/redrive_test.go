package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/internal/partition"
	"github.com/idemstream/idemstream/sinks"
)

// topicWith is an in-process cluster whose input holds recs (each at its
// partition; their offsets are set to where they landed) and whose
// dead-letter topic holds the dead letters that mk builds of them.
type topicWith struct {
	k       *sinks.Kafka
	c       *kafka.Client
	inputs  []dedupe.Record
	letters []dlq.Position
}

func newTopics(t *testing.T, inputs []dedupe.Record) *topicWith {
	t.Helper()
	tw := &topicWith{inputs: inputs}
	tw.k, tw.c = clusterClient(t, 3, "in", "dlq", "other", "out")
	var msgs []sinks.Message
	for _, r := range inputs {
		msgs = append(msgs, inputMessage(r))
	}
	for i, w := range put(t, tw.k, msgs...) {
		tw.inputs[i].Offset = w.Offset
	}
	return tw
}

// deadLetters writes ls to the dead-letter topic, alternating partitions.
func (tw *topicWith) deadLetters(t *testing.T, ls ...sinks.Message) {
	t.Helper()
	for i := range ls {
		ls[i].Partition = len(tw.letters) % 2
		w := put(t, tw.k, ls[i])
		tw.letters = append(tw.letters, dlq.Position{Topic: "dlq", Partition: w[0].Partition, Offset: w[0].Offset})
	}
}

// deadLetterAt writes m to the dead-letter topic, alternating
// partitions, with the timestamp at.
func (tw *topicWith) deadLetterAt(t *testing.T, at time.Time, m sinks.Message) {
	t.Helper()
	m.Topic, m.Partition = "dlq", len(tw.letters)%2
	off := putAt(t, tw.c, at, m)
	tw.letters = append(tw.letters, dlq.Position{Topic: "dlq", Partition: m.Partition, Offset: off})
}

// resultAt writes the pipeline's result of in to "out", as the consumer
// builds it (internal/envelope), with the timestamp at.
func (tw *topicWith) resultAt(t *testing.T, at time.Time, in dedupe.Record) {
	t.Helper()
	key, _ := sinks.HeaderValue(in.Headers, "Idempotency-Key")
	o := &dedupe.Outcome{Key: key, Fingerprint: fingerprint(in.Value)}
	putAt(t, tw.c, at, envelope.Result("out", 0, &in, o, in.Source(), in.Source()+"@"+at.Format(time.RFC3339), []byte(`{"ok":true}`), nil))
}

func (tw *topicWith) redrive(t *testing.T, ctx context.Context, o dlq.RedriveOptions) (dlq.RedriveReport, error) {
	t.Helper()
	o.Pipeline, o.DLQ, o.Input, o.Output, o.List = "claims", "dlq", "in", "out", true
	if o.Limiter == nil {
		o.Limiter, _ = dlq.NewLimiter(1e6, &fakeClock{now: t0})
	}
	rd, err := dlq.NewRedriver(tw.k, tw.k, o)
	if err != nil {
		t.Fatal(err)
	}
	return rd.Run(ctx, &audit.KafkaTopic{Reader: tw.k, Topic: "dlq"})
}

// redriven are the records of topic that name one of the test's dead
// letters in idemstream-redrive-of, by that dead letter.
func (tw *topicWith) redriven(t *testing.T, topic string) map[string][]sinks.Fetched {
	out := map[string][]sinks.Fetched{}
	for _, r := range readAll(t, tw.k, topic) {
		of, _ := sinks.HeaderValue(r.Headers, dlq.HeaderRedriveOf)
		if slices.ContainsFunc(tw.letters, func(p dlq.Position) bool { return p.String() == of }) {
			out[of] = append(out[of], r)
		}
	}
	return out
}

// A redrive sends the handler's failures back to the partition each came
// from, with its key, value and headers and idemstream-redrive-of; it
// sends a command that failed twice once (the later), reads a trimmed dead letter's
// whole record at its source, refuses conflicts and invalid records, and
// leaves other pipelines' dead letters alone.
func TestRedriveSendsTheOriginalsBack(t *testing.T) {
	big := `{"coupon":"` + strings.Repeat("x", 100) + `"}`
	tw := newTopics(t, []dedupe.Record{
		command(0, 0, uuidOf(0), `{"coupon":1}`),
		command(1, 0, uuidOf(1), `{"coupon":2}`, header("X-Trace", "t-1"), header("idemstream-key", "an upstream pipeline's")),
		command(2, 0, uuidOf(2), big),
		command(0, 0, uuidOf(3), `{"coupon":4}`),
		command(1, 0, uuidOf(4), `{"coupon":`),
		command(0, 0, uuidOf(0), `{"coupon":1}`), // uuidOf(0) failed again
		command(2, 0, uuidOf(6), `{"coupon":7}`, header(dlq.HeaderRedriveOf, "dlq/1/99")),
	})
	in := tw.inputs
	elsewhere := failed(dedupe.Record{Topic: "elsewhere", Value: []byte(`{}`), Headers: []dedupe.Header{header("Idempotency-Key", uuidOf(9))}})
	tw.deadLetters(t,
		failed(in[0]).message(), failed(in[1]).message(),
		envelope.TrimDeadLetter(failed(in[2]).message(), 10, false),
		conflict(in[3], "in/0/0", "/coupon").message(),
		letter{in: in[4], reason: dedupe.ReasonMalformedPayload}.message(),
		failed(in[5]).message(), failed(in[6]).message(), elsewhere.message())

	dry, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := tw.redriven(t, "in"); len(got) != 0 {
		t.Fatalf("a dry run wrote %d records", len(got))
	}
	rep, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]dlq.RedriveReport{"dry run": dry, "redrive": rep} {
		if r.Records != 8 || r.Selected != 7 || r.Sent != 4 || r.SentByReason[dedupe.ReasonHandlerFailed] != 4 ||
			r.Skipped[dlq.SkippedDuplicate] != 1 || r.Refused[dedupe.ReasonConflict] != 1 || r.Refused[dedupe.ReasonMalformedPayload] != 1 {
			t.Errorf("%s: %+v", name, r)
		}
	}
	got := tw.redriven(t, "in")
	for i, want := range map[int]dedupe.Record{1: in[1], 2: in[2], 5: in[5], 6: in[6]} {
		of := tw.letters[i].String()
		recs := got[of]
		if len(recs) != 1 {
			t.Errorf("dead letter %s: %d records redriven, want 1", of, len(recs))
			continue
		}
		r := recs[0]
		wantHeaders := append(slices.DeleteFunc(slices.Clone(want.Headers), func(h dedupe.Header) bool { return h.Key == dlq.HeaderRedriveOf }),
			header(dlq.HeaderRedriveOf, of))
		if r.Partition != want.Partition || !bytes.Equal(r.Key, want.Key) || !bytes.Equal(r.Value, want.Value) ||
			fmt.Sprint(r.Headers) != fmt.Sprint(wantHeaders) {
			t.Errorf("dead letter %s redriven as partition %d key %q value %q headers %v;\nwant partition %d key %q value %q headers %v",
				of, r.Partition, r.Key, r.Value, r.Headers, want.Partition, want.Key, want.Value, wantHeaders)
		}
	}
	if len(got) != 4 {
		t.Errorf("%d dead letters redriven, want 4: %v", len(got), got)
	}
	for i, x := range rep.Redriven {
		if x.To.Offset < 0 || x.To.Topic != "in" || dry.Redriven[i].To.Offset != -1 || dry.Redriven[i].DeadLetter != x.DeadLetter {
			t.Errorf("redriven %d: %+v (dry run %+v)", i, x, dry.Redriven[i])
		}
	}
}

// Conflicts and invalid records go only with Force; a selection that
// names them without it is refused before anything is read.
func TestRedriveForceAndTarget(t *testing.T) {
	tw := newTopics(t, []dedupe.Record{command(0, 0, uuidOf(1), `{"a":1}`), command(1, 0, uuidOf(2), `{"a":2}`)})
	tw.deadLetters(t, conflict(tw.inputs[0], "in/0/9", "/a").message(), failed(tw.inputs[1]).message())
	only := dlq.Selector{Reasons: []dedupe.Reason{dedupe.ReasonConflict}}
	if _, err := dlq.NewRedriver(tw.k, tw.k, dlq.RedriveOptions{DLQ: "dlq", Input: "in", Output: "out", Select: only}); !errors.Is(err, dlq.ErrNotRedrivable) {
		t.Errorf("conflicts without Force: %v, want ErrNotRedrivable", err)
	}
	if _, err := dlq.NewRedriver(tw.k, tw.k, dlq.RedriveOptions{DLQ: "dlq", Input: "in", Output: "out", To: "dlq"}); err == nil {
		t.Error("a redrive into the dead-letter topic itself was accepted")
	}
	rep, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{Select: only, Force: true, To: "other"})
	if err != nil || rep.Sent != 1 || rep.SentByReason[dedupe.ReasonConflict] != 1 {
		t.Fatalf("forced: %+v %v", rep, err)
	}
	got := tw.redriven(t, "other")[tw.letters[0].String()]
	// Written elsewhere than the input, a record goes to its key's
	// partition.
	if len(got) != 1 || got[0].Partition != partition.For(tw.inputs[0].Key, 3) {
		t.Errorf("redriven to other: %+v", got)
	}
}

// A redrive stopped after its first write has sent that write's records
// and says so; run again, it finds those on the input and sends the
// others; run a third time, to another topic too, it sends nothing: a
// redrive run again never sends what was sent, however long after.
func TestRedriveInterruptedAndRunAgain(t *testing.T) {
	var inputs []dedupe.Record
	for i := range 20 {
		inputs = append(inputs, command(i%3, 0, uuidOf(i), fmt.Sprintf(`{"n":%d}`, i)))
	}
	tw := newTopics(t, inputs)
	for _, r := range tw.inputs {
		tw.deadLetters(t, failed(r).message())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lim, _ := dlq.NewLimiter(50, &fakeClock{now: t0}) // bursts of 5
	rep, err := tw.redrive(t, ctx, dlq.RedriveOptions{Limiter: lim, Progress: func(dlq.RedriveReport) { cancel() }})
	if !errors.Is(err, context.Canceled) || !rep.Interrupted || rep.Sent != 5 || len(rep.Redriven) != 5 {
		t.Fatalf("interrupted redrive: sent %d, interrupted %v, err %v; want 5 sent", rep.Sent, rep.Interrupted, err)
	}
	if n := len(tw.redriven(t, "in")); n != 5 {
		t.Fatalf("%d dead letters redriven before the stop, want 5", n)
	}
	first := map[string]bool{}
	for _, x := range rep.Redriven {
		first[x.DeadLetter.String()] = true
	}
	rep, err = tw.redrive(t, context.Background(), dlq.RedriveOptions{})
	if err != nil || rep.Sent != 15 || rep.Skipped[dlq.SkippedRedrivenBefore] != 5 || rep.Interrupted {
		t.Fatalf("second run: %+v %v; want 15 sent, 5 skipped as redriven before", rep, err)
	}
	for _, x := range rep.Redriven {
		if first[x.DeadLetter.String()] {
			t.Errorf("the second run sent %s again", x.DeadLetter)
		}
	}
	rep, err = tw.redrive(t, context.Background(), dlq.RedriveOptions{To: "other"})
	if err != nil || rep.Sent != 0 || rep.Skipped[dlq.SkippedRedrivenBefore] != 20 {
		t.Fatalf("third run: %+v %v; want nothing sent, 20 skipped as redriven before", rep, err)
	}
	got := tw.redriven(t, "in")
	for _, at := range tw.letters {
		if n := len(got[at.String()]); n != 1 {
			t.Errorf("dead letter %s: %d copies on the input, want 1", at, n)
		}
	}
	if n := len(tw.redriven(t, "other")); n != 0 {
		t.Errorf("%d dead letters redriven to other, want none", n)
	}
}

// flaky fails the first write with an error that may pass, or every
// write with one that cannot.
type flaky struct {
	*sinks.Kafka
	err    error
	writes int
	always bool
}

func (f *flaky) Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error) {
	f.writes++
	if f.writes == 1 || f.always {
		out := make([]sinks.Written, len(msgs))
		for i := range out {
			out[i] = sinks.Written{Partition: -1, Offset: dedupe.NoPosition, Err: f.err}
		}
		return out, f.err
	}
	return f.Kafka.Write(ctx, msgs)
}

// A write that may pass is tried again; one refused for good stops the
// run at once. (The refusal comes first: what the other sends, a redrive
// run again skips.)
func TestRedriveWriteErrors(t *testing.T) {
	tw := newTopics(t, []dedupe.Record{command(0, 0, uuidOf(1), `{}`)})
	tw.deadLetters(t, failed(tw.inputs[0]).message())
	opts := dlq.RedriveOptions{Pipeline: "claims", DLQ: "dlq", Input: "in", Output: "out"}
	refused := &flaky{Kafka: tw.k, err: fmt.Errorf("produce: %w", dedupe.ErrBrokerRefused), always: true}
	rd, _ := dlq.NewRedriver(refused, tw.k, opts)
	rep, err := rd.Run(context.Background(), &audit.KafkaTopic{Reader: tw.k, Topic: "dlq"})
	if !errors.Is(err, dedupe.ErrBrokerRefused) || rep.Sent != 0 || !rep.Interrupted || refused.writes != 1 {
		t.Errorf("a refused write: %v, sent %d, interrupted %v, %d writes; want the refusal at once", err, rep.Sent, rep.Interrupted, refused.writes)
	}
	passing := &flaky{Kafka: tw.k, err: fmt.Errorf("produce: %w: %w", dedupe.ErrBrokerUnavailable, sinks.ErrAmbiguous)}
	rd, _ = dlq.NewRedriver(passing, tw.k, opts)
	rep, err = rd.Run(context.Background(), &audit.KafkaTopic{Reader: tw.k, Topic: "dlq"})
	if err != nil || rep.Sent != 1 || passing.writes != 2 {
		t.Errorf("a write that may pass: sent %d after %d writes, %v; want 1 after 2", rep.Sent, passing.writes, err)
	}
}
