package dlq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
	"github.com/idemstream/idemstream/internal/envelope"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// outage is a dead-letter topic after a downstream outage: handler
// failures over two hours (one command failed twice), conflicts, invalid
// records, a dead letter of another pipeline sharing the topic, a record
// idemstream did not write, a trimmed dead letter and one of a command
// redriven before.
func outage() audit.Records {
	var recs audit.Records
	add := func(l letter, at time.Duration) {
		l.at = t0.Add(at)
		recs = append(recs, l.record(len(recs)%2, int64(len(recs))))
	}
	for i := range 5 {
		add(failed(command(0, int64(i), uuidOf(i), `{"coupon":1}`)), time.Duration(i)*time.Minute)
	}
	add(failed(command(1, 9, uuidOf(0), `{"coupon":1}`)), 10*time.Minute) // the same command again
	add(conflict(command(0, 10, uuidOf(20), `{"amount":70}`), "in/0/0", "/amount"), 20*time.Minute)
	add(conflict(command(0, 11, uuidOf(21), `{"amount":80,"coupon":2}`), "in/0/0", "/amount", "/coupon"), 21*time.Minute)
	add(conflict(command(0, 12, uuidOf(22), `{"amount":90}`), "in/1/4"), 22*time.Minute)
	add(letter{in: command(1, 13, uuidOf(30), `{"amount":`), reason: dedupe.ReasonMalformedPayload,
		cause: errors.New("malformed payload: unexpected end of input at offset 10")}, 70*time.Minute)
	add(letter{in: command(1, 14, "", `{}`), reason: dedupe.ReasonMissingKey, cause: dedupe.ErrMissingKey}, 71*time.Minute)
	add(failed(dedupe.Record{Topic: "other.in", Value: []byte(`{}`), Headers: []dedupe.Header{header("Idempotency-Key", uuidOf(40))}}), 72*time.Minute)
	recs = append(recs, dedupe.Record{Topic: "dlq", Offset: int64(len(recs)), Value: []byte("hand-written"), Time: t0.Add(73 * time.Minute)})
	trimmed := envelope.TrimDeadLetter(failed(command(0, 15, uuidOf(50), `{"coupon":5}`)).message(), 3, false)
	recs = append(recs, dedupe.Record{Topic: "dlq", Offset: int64(len(recs)), Key: trimmed.Key, Value: trimmed.Value, Headers: trimmed.Headers,
		Time: t0.Add(80 * time.Minute)})
	add(failed(command(1, 16, uuidOf(60), `{"coupon":6}`, header(dlq.HeaderRedriveOf, "dlq/0/0"))), 67*time.Minute)
	return recs
}

func TestSummaryCountsWhatTheTopicHolds(t *testing.T) {
	sum, err := dlq.Summarize(context.Background(), outage(), dlq.SummaryOptions{Pipeline: "claims", Topic: "dlq", Input: "in"})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records != 15 || sum.DeadLetters != 13 || sum.OtherSources != 1 || sum.Foreign != 1 {
		t.Errorf("records %d, dead letters %d, other sources %d, foreign %d; want 15, 13, 1, 1", sum.Records, sum.DeadLetters, sum.OtherSources, sum.Foreign)
	}
	want := map[dedupe.Reason][2]int64{ // count, keys
		dedupe.ReasonHandlerFailed: {8, 7}, dedupe.ReasonConflict: {3, 3}, dedupe.ReasonMalformedPayload: {1, 1}, dedupe.ReasonMissingKey: {1, 0},
	}
	for _, r := range sum.Reasons {
		if w := want[r.Reason]; w != [2]int64{r.Count, r.Keys} {
			t.Errorf("%s: %d dead letters of %d keys, want %v", r.Reason, r.Count, r.Keys, w)
		}
		if r.Redrivable != (r.Reason == dedupe.ReasonHandlerFailed) {
			t.Errorf("%s: redrivable %v", r.Reason, r.Redrivable)
		}
	}
	if len(sum.Reasons) != len(want) || sum.Reasons[0].Reason != dedupe.ReasonHandlerFailed {
		t.Errorf("reasons %+v, want 4, handler_failed first", sum.Reasons)
	}
	if !sum.FirstSeen.Equal(t0) || !sum.LastSeen.Equal(t0.Add(80*time.Minute)) {
		t.Errorf("first %v, last %v", sum.FirstSeen, sum.LastSeen)
	}
	if len(sum.Hours) != 3 || sum.Hours[0].Count != 2 || sum.Hours[1].Count != 7 || sum.Hours[2].Count != 4 {
		t.Errorf("hours %+v, want 2, 7 and 4 dead letters in 09:00, 10:00, 11:00", sum.Hours)
	}
	if len(sum.ConflictPaths) != 2 || sum.ConflictPaths[0] != (dlq.PathCount{Pointer: "/amount", Count: 2}) || sum.ConflictsWithoutPaths != 1 {
		t.Errorf("conflict paths %+v, %d without", sum.ConflictPaths, sum.ConflictsWithoutPaths)
	}
	if len(sum.FirstSources) != 2 || sum.FirstSources[0] != (dlq.SourceCount{Source: "in/0/0", Count: 2}) {
		t.Errorf("first sources %+v", sum.FirstSources)
	}
	if sum.Errors[0].Reason != dedupe.ReasonHandlerFailed || sum.Errors[0].Count != 8 || len(sum.Errors) != 3 || sum.Trimmed != 1 || sum.Redriven != 1 {
		t.Errorf("errors %+v, trimmed %d, redriven %d", sum.Errors, sum.Trimmed, sum.Redriven)
	}
	golden(t, "summary.json", mustJSON(t, sum))
	var text bytes.Buffer
	if err := sum.WriteText(&text, t0.Add(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	golden(t, "summary.txt", text.Bytes())
}

func TestSummaryOfAnEmptyTopic(t *testing.T) {
	sum, err := dlq.Summarize(context.Background(), audit.Records{}, dlq.SummaryOptions{Pipeline: "claims", Topic: "dlq", Input: "in"})
	if err != nil {
		t.Fatal(err)
	}
	b := mustJSON(t, sum)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	// Lists are empty, never null; the times are null.
	for _, k := range []string{"reasons", "hours", "conflict_paths", "first_sources", "errors"} {
		if l, ok := m[k].([]any); !ok || len(l) != 0 {
			t.Errorf("%s = %v, want []", k, m[k])
		}
	}
	if m["first_seen"] != nil || m["last_seen"] != nil {
		t.Errorf("first_seen %v, last_seen %v, want null", m["first_seen"], m["last_seen"])
	}
	var text bytes.Buffer
	if err := sum.WriteText(&text, t0); err != nil || !bytes.Contains(text.Bytes(), []byte("No dead letters.")) {
		t.Errorf("text %q (%v)", text.String(), err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test ./dlq -run %s -update rewrites it):\n%s", path, t.Name(), got)
	}
}
