package dlq_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/internal/partition"
)

// at945 is when the commands of these tests failed.
var at945 = time.Date(2026, 3, 1, 9, 45, 0, 0, time.UTC)

// sentOf lists the dead letters a report says were sent.
func sentOf(rep dlq.RedriveReport) []string {
	var out []string
	for _, x := range rep.Redriven {
		out = append(out, x.DeadLetter.String())
	}
	slices.Sort(out)
	return out
}

func positions(ps ...dlq.Position) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

// A command failed at 09:45; its client's retry succeeded at 09:50. A
// copy redriven once the key is forgotten would run the handler again:
// the dead letter is skipped (has_result), dry run or not. A result of
// the key's earlier window (before the dead letter) does not count, nor
// an upstream pipeline's idemstream-key among another result's input
// headers.
func TestRedriveSkipsACommandThatSucceededSince(t *testing.T) {
	tw := newTopics(t, []dedupe.Record{
		command(0, 0, uuidOf(1), `{"coupon":1}`),
		command(1, 0, uuidOf(2), `{"coupon":2}`),
		command(2, 0, uuidOf(3), `{"coupon":3}`),
		command(0, 0, uuidOf(4), `{"coupon":4}`, header("idemstream-key", uuidOf(3))),
	})
	in := tw.inputs
	tw.resultAt(t, at945.Add(-20*time.Minute), in[1]) // uuidOf(2) succeeded in an earlier window
	for i := range 3 {
		tw.deadLetterAt(t, at945, failed(in[i]).message())
	}
	tw.resultAt(t, at945.Add(5*time.Minute), in[0]) // the retry of uuidOf(1)
	tw.resultAt(t, at945.Add(5*time.Minute), in[3]) // another key's result
	for _, dry := range []bool{true, false} {
		rep, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{DryRun: dry})
		if err != nil || rep.Sent != 2 || rep.Skipped[dlq.SkippedHasResult] != 1 || len(rep.Skipped) != 1 {
			t.Fatalf("dry run %v: %+v %v; want 2 sent, 1 skipped as has_result", dry, rep, err)
		}
		if got, want := sentOf(rep), positions(tw.letters[1], tw.letters[2]); !slices.Equal(got, want) {
			t.Errorf("dry run %v: sent %v, want %v", dry, got, want)
		}
	}
	if got := tw.redriven(t, "in"); len(got) != 2 || got[tw.letters[0].String()] != nil {
		t.Errorf("redriven %v: want the dead letters of uuidOf(2) and uuidOf(3) only", got)
	}
}

// The same key failed with body A, then (failed_ttl over) with the
// corrected body B, and B's retry failed too: only the latest dead letter
// is sent (B's retry); A is superseded, B a duplicate. Sent oldest first,
// A would run and B come back as a conflict.
func TestRedriveSendsTheLatestCommandOfAKey(t *testing.T) {
	a := command(0, 0, uuidOf(1), `{"coupon":1,"amount":50}`)
	b := command(0, 0, uuidOf(1), `{"coupon":1,"amount":70}`)
	tw := newTopics(t, []dedupe.Record{a, b, b, command(1, 0, uuidOf(2), `{"coupon":2}`)})
	in := tw.inputs
	tw.deadLetterAt(t, at945, failed(in[0]).message())
	tw.deadLetterAt(t, at945.Add(20*time.Minute), failed(in[1]).message())
	tw.deadLetterAt(t, at945.Add(21*time.Minute), failed(in[2]).message())
	tw.deadLetterAt(t, at945.Add(5*time.Minute), failed(in[3]).message())
	rep, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{})
	if err != nil || rep.Sent != 2 || rep.Skipped[dlq.SkippedSuperseded] != 1 || rep.Skipped[dlq.SkippedDuplicate] != 1 {
		t.Fatalf("%+v %v; want 2 sent, 1 superseded, 1 duplicate", rep, err)
	}
	if got, want := sentOf(rep), positions(tw.letters[2], tw.letters[3]); !slices.Equal(got, want) {
		t.Errorf("sent %v, want %v (the latest of %s, and %s)", got, want, uuidOf(1), uuidOf(2))
	}
	for _, r := range tw.redriven(t, "in")[tw.letters[2].String()] {
		if string(r.Value) != string(b.Value) {
			t.Errorf("sent %s for %s, want the corrected body %s", r.Value, uuidOf(1), b.Value)
		}
	}
}

// A record the broker refuses for its size (here a trimmed dead letter,
// read whole from its source, to a topic whose limit is below it) is
// skipped and named; the records before and after it are sent, and the
// run ends without an error.
func TestRedriveSkipsARecordTooLarge(t *testing.T) {
	// Digits of a hash: lz4 does not make them smaller.
	var digits strings.Builder
	for i := range 200 {
		fmt.Fprintf(&digits, "%016x", scramble(i))
	}
	big := `{"coupon":"` + digits.String() + `"}`
	tw := newTopics(t, []dedupe.Record{
		command(0, 0, uuidOf(1), `{"coupon":1}`), command(0, 0, uuidOf(2), big), command(0, 0, uuidOf(3), `{"coupon":3}`),
	})
	in := tw.inputs
	tw.deadLetters(t, failed(in[0]).message(), envelope.TrimDeadLetter(failed(in[1]).message(), 10, false), failed(in[2]).message())
	res, err := tw.c.AlterConfigs(context.Background(), &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: "other", Configs: []kafka.AlterConfigRequestConfig{{Name: "max.message.bytes", Value: "2000"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Errors[kafka.AlterConfigsResponseResource{Type: int8(kafka.ResourceTypeTopic), Name: "other"}]; err != nil {
		t.Fatal(err)
	}
	rep, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{To: "other"})
	if err != nil || rep.Interrupted || rep.Sent != 2 || rep.Skipped[dlq.SkippedTooLarge] != 1 ||
		!slices.Equal(positions(rep.TooLarge...), positions(tw.letters[1])) {
		t.Fatalf("%+v %v; want 2 sent, %s skipped as too large", rep, err, tw.letters[1])
	}
	if got, want := sentOf(rep), positions(tw.letters[0], tw.letters[2]); !slices.Equal(got, want) {
		t.Errorf("sent %v, want %v", got, want)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "too large: "+tw.letters[1].String()) {
		t.Errorf("text (%v):\n%s", err, text.String())
	}
}

func scramble(i int) uint64 {
	x := uint64(i)*0x9e3779b97f4a7c15 + 1
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

// Written elsewhere than the input, a record without a Kafka key goes to
// the partition of its idempotency key (murmur2, as the pipeline places
// its results), not to one picked at random: the copies of one command
// stay in one partition, in order.
func TestRedriveWithoutAKafkaKeyPlacesByTheIdempotencyKey(t *testing.T) {
	var inputs []dedupe.Record
	for i := range 12 {
		r := command(i%3, 0, uuidOf(i), fmt.Sprintf(`{"n":%d}`, i))
		r.Key = nil
		inputs = append(inputs, r)
	}
	tw := newTopics(t, inputs)
	for _, r := range tw.inputs {
		tw.deadLetters(t, failed(r).message())
	}
	rep, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{To: "other"})
	if err != nil || rep.Sent != 12 {
		t.Fatalf("%+v %v", rep, err)
	}
	for i, at := range tw.letters {
		got := tw.redriven(t, "other")[at.String()]
		want := partition.For([]byte(uuidOf(i)), 3)
		if len(got) != 1 || got[0].Key != nil || got[0].Partition != want {
			t.Errorf("%s redriven as %+v, want one record without a key in partition %d", uuidOf(i), got, want)
		}
	}
}

// A dead-letter topic shared by pipelines: a redrive takes only the dead
// letters whose idemstream-source is on its own input, and reads the
// others' keys as none of its own.
func TestRedriveSelectsItsOwnDeadLettersOfASharedTopic(t *testing.T) {
	tw := newTopics(t, []dedupe.Record{command(0, 0, uuidOf(1), `{"coupon":1}`)})
	other := command(1, 7, uuidOf(1), `{"coupon":1}`)
	other.Topic = "elsewhere"
	tw.deadLetters(t, failed(other).message(), failed(tw.inputs[0]).message())
	rep, err := tw.redrive(t, context.Background(), dlq.RedriveOptions{})
	if err != nil || rep.Records != 2 || rep.Selected != 1 || rep.Sent != 1 || len(rep.Skipped) != 0 {
		t.Fatalf("%+v %v; want 1 of 2 records selected and sent", rep, err)
	}
	if got, want := sentOf(rep), positions(tw.letters[1]); !slices.Equal(got, want) {
		t.Errorf("sent %v, want %v", got, want)
	}
}

// The text output names each skip reason that occurred and what it means.
func TestRedriveTextExplainsSkips(t *testing.T) {
	rep := dlq.RedriveReport{Pipeline: "claims", To: "in", Sent: 1, Selected: 4,
		Skipped: map[string]int64{dlq.SkippedHasResult: 1, dlq.SkippedRedrivenBefore: 1, dlq.SkippedSuperseded: 1}}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skipped 3 (has_result 1, redriven_before 1, superseded 1):", "  has_result ", "  redriven_before ", "  superseded "} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	if strings.Contains(text.String(), "  duplicate ") {
		t.Errorf("text explains a reason that did not occur:\n%s", text.String())
	}
}
