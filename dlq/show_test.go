package dlq_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

// policy is the pipeline's rules as the configuration file gives them.
func policy(t *testing.T, volatile string) dedupe.Policy {
	t.Helper()
	cfg, err := schemas.Parse([]byte(`
kafka: {brokers: ["localhost:9092"]}
store: {kind: memory}
pipelines:
  - {name: claims, input: in, output: out, dlq: dlq, key: {format: any}, volatile: `+volatile+`}
`), "")
	if err != nil {
		t.Fatal(err)
	}
	pol, err := cfg.Policy(cfg.Pipelines[0])
	if err != nil {
		t.Fatal(err)
	}
	return pol
}

// A conflict is shown with its first copy read back and the diff made
// under the current rules: after client_time was made volatile, only the
// amount still differs.
func TestShowConflict(t *testing.T) {
	tw := newTopics(t, []dedupe.Record{
		command(0, 0, "k-1", `{"coupon":1,"amount":50,"client_time":"10:00:00"}`),
		command(0, 0, "k-1", `{"coupon":1,"amount":70,"client_time":"10:00:05"}`),
	})
	tw.deadLetters(t, conflict(tw.inputs[1], tw.inputs[0].Source(), "/amount", "/client_time").message(),
		conflict(tw.inputs[1], "in/0/99", "/amount").message())
	in, err := dlq.NewInspector(policy(t, "[/client_time]"), "in", tw.k)
	if err != nil {
		t.Fatal(err)
	}
	s, err := in.Show(context.Background(), tw.letters[0])
	if err != nil {
		t.Fatal(err)
	}
	if s.Reason != dedupe.ReasonConflict || s.Key != "k-1" || s.Source.Position.String() != "in/0/1" || !s.Source.Found ||
		s.First == nil || !s.First.Found || s.First.Position.String() != "in/0/0" {
		t.Fatalf("shown: %+v", s)
	}
	if s.Diff == nil || !slices.Equal(s.Diff.Paths, []string{"/amount"}) || s.Diff.Same || s.Diff.FirstFingerprint == s.Diff.Fingerprint {
		t.Errorf("diff %+v, want /amount only (client_time is volatile now)", s.Diff)
	}
	if !slices.Equal(s.ConflictPaths, []string{"/amount", "/client_time"}) {
		t.Errorf("paths as dead-lettered: %v", s.ConflictPaths)
	}
	if s.Now.Reason != "" || s.Now.Key != "k-1" || s.Now.Fingerprint != s.Diff.Fingerprint || s.Redrive.Allowed {
		t.Errorf("now %+v, redrive %+v", s.Now, s.Redrive)
	}
	var text strings.Builder
	if err := s.WriteText(&text); err != nil || !strings.Contains(text.String(), "diff now      /amount (under the current rules sha256:") {
		t.Errorf("text (%v):\n%s", err, text.String())
	}

	// A first copy the topic does not hold: no diff, and why.
	s, err = in.Show(context.Background(), tw.letters[1])
	if err != nil {
		t.Fatal(err)
	}
	if s.First.Found || s.Diff != nil || !strings.Contains(s.First.Why, "the partition ends at offset 2") {
		t.Errorf("first copy gone: %+v, diff %+v", s.First, s.Diff)
	}
	if _, err := in.Show(context.Background(), dlq.Position{Topic: "dlq", Partition: 0, Offset: 50}); !errors.Is(err, dlq.ErrGone) {
		t.Errorf("a dead letter past the end: %v, want ErrGone", err)
	}
}

// A trimmed dead letter is judged by its whole record, read at its
// source; an invalid one says what it still is under the current rules.
func TestShowTrimmedAndInvalid(t *testing.T) {
	body := `{"coupon":"` + strings.Repeat("x", 50) + `"}`
	tw := newTopics(t, []dedupe.Record{command(1, 0, "k-2", body), command(2, 0, "k-3", `{"coupon":`)})
	tw.deadLetters(t, envelope.TrimDeadLetter(failed(tw.inputs[0]).message(), 4, false),
		letter{in: tw.inputs[1], reason: dedupe.ReasonMalformedPayload}.message())
	in, err := dlq.NewInspector(policy(t, "[]"), "in", tw.k)
	if err != nil {
		t.Fatal(err)
	}
	s, err := in.Show(context.Background(), tw.letters[0])
	if err != nil {
		t.Fatal(err)
	}
	if !s.Trimmed || s.PayloadSize != len(body) || !s.Source.Found || s.Now.Fingerprint != fingerprint([]byte(body)) || !s.Redrive.Allowed {
		t.Errorf("trimmed: %+v", s)
	}
	s, err = in.Show(context.Background(), tw.letters[1])
	if err != nil {
		t.Fatal(err)
	}
	if s.Now.Reason != dedupe.ReasonMalformedPayload || s.Redrive.Allowed || !strings.Contains(s.Redrive.Why, "still malformed_payload") {
		t.Errorf("malformed: now %+v, redrive %+v", s.Now, s.Redrive)
	}
}

// retention is a Reader of a partition whose first records were deleted.
type retention struct{ start int64 }

func (r retention) Fetch(context.Context, string, int, int64, time.Duration) ([]sinks.Fetched, int64, error) {
	return nil, 0, kafka.OffsetOutOfRange
}

func (r retention) StartOffsets(_ context.Context, _ string, parts []int) (map[int]int64, error) {
	return map[int]int64{parts[0]: r.start}, nil
}

func (r retention) Partitions(context.Context, string) (int, error) { return 1, nil }

func (r retention) EndOffsets(_ context.Context, _ string, parts []int) (map[int]int64, error) {
	return map[int]int64{parts[0]: r.start + 10}, nil
}

func TestRecordAtSaysWhyARecordIsGone(t *testing.T) {
	_, err := dlq.RecordAt(context.Background(), retention{start: 50}, dlq.Position{Topic: "in", Offset: 7})
	if !errors.Is(err, dlq.ErrGone) || !strings.Contains(err.Error(), "deleted by retention (the partition now starts at offset 50)") {
		t.Errorf("below the start: %v", err)
	}
	_, err = dlq.RecordAt(context.Background(), retention{start: 0}, dlq.Position{Topic: "in", Offset: 70})
	if !errors.Is(err, dlq.ErrGone) || !strings.Contains(err.Error(), "the partition ends at offset 10") {
		t.Errorf("past the end: %v", err)
	}
}
