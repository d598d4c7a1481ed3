package dlq_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/sinks"
)

// A dead letter as the consumer writes it splits into the input record,
// byte for byte, and the evidence; headers named idemstream-* that the
// input carried (an upstream pipeline's) stay the input's.
func TestParseSplitsTheInputFromTheEvidence(t *testing.T) {
	in := command(1, 7, "k-1", `{"amount":70}`, header("idemstream-key", "upstream"), header("X-Trace", "t-1"))
	rec := conflict(in, "in/0/3", "/amount", "/a,b").record(2, 40)
	d := dlq.Parse(&rec)

	if d.At != (dlq.Position{Topic: "dlq", Partition: 2, Offset: 40}) || !d.Time.Equal(rec.Time) {
		t.Errorf("at %v %v", d.At, d.Time)
	}
	if d.Reason != dedupe.ReasonConflict || d.IdemKey != "k-1" || d.Source.String() != "in/1/7" || d.FirstSource.String() != "in/0/3" ||
		d.FirstFingerprint != "sha256:first-in/0/3" || d.Fingerprint != fingerprint(in.Value) || d.Error == "" {
		t.Errorf("evidence: %+v", d)
	}
	if !slices.Equal(d.ConflictPaths, []string{"/amount", "/a,b"}) {
		t.Errorf("conflict paths %q, want /amount and /a,b", d.ConflictPaths)
	}
	key, value, headers := d.Original()
	if string(key) != "mk-k-1" || string(value) != `{"amount":70}` || fmt.Sprint(headers) != fmt.Sprint(in.Headers) {
		t.Errorf("original: %q %q %v, want the input's %v", key, value, headers, in.Headers)
	}
	if len(d.Evidence) != len(rec.Headers)-len(in.Headers) || d.Evidence[0].Key != sinks.HeaderReason {
		t.Errorf("evidence headers %v", d.Evidence)
	}
	if d.Trimmed || !d.RedriveOf.IsZero() {
		t.Errorf("trimmed %v, redrive of %v", d.Trimmed, d.RedriveOf)
	}
}

// A record redriven before carries idemstream-redrive-of among the
// input's headers: Parse names it, Original leaves it out (a redrive
// sets its own).
func TestParseRedrivenAndTrimmed(t *testing.T) {
	in := command(0, 3, "k-2", `{"n":1}`, header(dlq.HeaderRedriveOf, "dlq/0/1"))
	m := envelope.TrimDeadLetter(failed(in).message(), 2, false)
	rec := dedupe.Record{Topic: "dlq", Offset: 9, Key: m.Key, Value: m.Value, Headers: m.Headers}
	d := dlq.Parse(&rec)
	if d.RedriveOf.String() != "dlq/0/1" {
		t.Errorf("redrive of %q", d.RedriveOf)
	}
	if !d.Trimmed || d.PayloadSize != len(in.Value) || string(d.Value) != `{"` {
		t.Errorf("trimmed %v size %d value %q", d.Trimmed, d.PayloadSize, d.Value)
	}
	if _, _, hs := d.Original(); slices.ContainsFunc(hs, func(h dedupe.Header) bool { return h.Key == dlq.HeaderRedriveOf }) {
		t.Errorf("original headers %v keep idemstream-redrive-of", hs)
	}

	bare := envelope.TrimDeadLetter(failed(in).message(), 0, true)
	rec = dedupe.Record{Topic: "dlq", Key: bare.Key, Value: bare.Value, Headers: bare.Headers}
	// A bare dead letter keeps of the input's headers only those named
	// idemstream-*.
	if d := dlq.Parse(&rec); len(d.Headers) != 1 || d.RedriveOf.String() != "dlq/0/1" || d.Key != nil ||
		d.Source.String() != "in/0/3" || d.Reason != dedupe.ReasonHandlerFailed || !d.Trimmed {
		t.Errorf("bare dead letter: %+v", d)
	}

	foreign := dedupe.Record{Topic: "dlq", Value: []byte("x"), Headers: []dedupe.Header{header("a", "b")}}
	if d := dlq.Parse(&foreign); d.Reason != "" || len(d.Headers) != 1 || len(d.Evidence) != 0 {
		t.Errorf("a record idemstream did not write: %+v", d)
	}
}

// A raw payload's conflict differs at "", the whole document: the header
// is present and empty.
func TestParseRawConflictPath(t *testing.T) {
	rec := conflict(command(0, 1, "k", "raw"), "in/0/0", "").record(0, 0)
	if d := dlq.Parse(&rec); !slices.Equal(d.ConflictPaths, []string{""}) {
		t.Errorf("paths %q, want [\"\"]", d.ConflictPaths)
	}
}

func TestPosition(t *testing.T) {
	for _, s := range []string{"in/0/0", "coupon.claim.dlq/12/987654321"} {
		p, err := dlq.ParsePosition(s)
		if err != nil || p.String() != s {
			t.Errorf("%s: %v %v", s, p, err)
		}
		b, _ := json.Marshal(p)
		var back dlq.Position
		if err := json.Unmarshal(b, &back); err != nil || back != p {
			t.Errorf("%s: JSON %s read back as %v (%v)", s, b, back, err)
		}
	}
	for _, bad := range []string{"", "in", "in/0", "/0/1", "in/x/1", "in/0/-1", "in/-1/0"} {
		if _, err := dlq.ParsePosition(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestSelector(t *testing.T) {
	f := dlq.Parse(ptr(failed(command(0, 1, "k-1", `{}`)).record(0, 0)))
	c := dlq.Parse(ptr(conflict(command(0, 2, "k-2", `{}`), "in/0/0").record(0, 1)))
	other := dlq.Parse(ptr(failed(dedupe.Record{Topic: "elsewhere", Value: []byte("{}")}).record(0, 2)))
	for _, tc := range []struct {
		name string
		sel  dlq.Selector
		want []bool // f, c, other
	}{
		{"the pipeline's", dlq.Selector{Input: "in"}, []bool{true, true, false}},
		{"by reason", dlq.Selector{Input: "in", Reasons: []dedupe.Reason{dedupe.ReasonConflict}}, []bool{false, true, false}},
		{"by key", dlq.Selector{Input: "in", Keys: []string{"k-1"}}, []bool{true, false, false}},
		{"from", dlq.Selector{Input: "in", From: c.Time}, []bool{false, true, false}},
		{"until", dlq.Selector{Input: "in", Until: c.Time}, []bool{true, false, false}},
	} {
		for i, d := range []dlq.DeadLetter{f, c, other} {
			if got := tc.sel.Match(&d); got != tc.want[i] {
				t.Errorf("%s: dead letter %d matched %v", tc.name, i, got)
			}
		}
	}
	sel := dlq.Selector{Reasons: []dedupe.Reason{dedupe.ReasonHandlerFailed, dedupe.ReasonConflict, dedupe.ReasonMalformedPayload}}
	if got := sel.Refused(); !slices.Equal(got, []dedupe.Reason{dedupe.ReasonConflict, dedupe.ReasonMalformedPayload}) {
		t.Errorf("refused %v", got)
	}
}

func ptr[T any](v T) *T { return &v }
