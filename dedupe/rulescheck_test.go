package dedupe_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
)

// flakyDecoder reads JSON as itself, or fails as a registry that does not
// answer; with next set, reading a payload moves its reader schema on to
// one that adds a member with its default.
type flakyDecoder struct {
	down, refused bool
	next          string
	reader        string
}

func (f *flakyDecoder) AppendJSON(dst, v []byte) ([]byte, error) {
	if f.next != "" {
		f.reader = f.next
	}
	if f.down {
		return dst, fmt.Errorf("%w: connection refused", dedupe.ErrRegistryUnavailable)
	}
	if f.refused {
		return dst, errors.New("schema registry refused (401)")
	}
	if f.reader != "" && len(v) > 1 && v[0] == '{' {
		// A newer reader with a field the writer lacks: its default.
		return append(append(dst, `{"d":1,`...), v[1:]...), nil
	}
	return append(dst, v...), nil
}

func (f *flakyDecoder) Digest() string { return "sha256:test" + f.reader }

// TestSameRequestUnderCurrentRules is the one verdict the consumer and the
// front door both take after a rules change.
func TestSameRequestUnderCurrentRules(t *testing.T) {
	dec := &flakyDecoder{}
	pol := policy(dedupe.Strict)
	pol.Rules = dedupe.CanonicalRules{Payload: dedupe.PayloadAvro, Decoder: dec, Volatile: []string{"/t"}}
	d, err := dedupe.NewDecider(pol, memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	fp, err := d.Canonicalizer().Fingerprint([]byte(`{"a":1,"t":2}`))
	if err != nil {
		t.Fatal(err)
	}
	o := &dedupe.Outcome{Fingerprint: fp, RulesDigest: d.Canonicalizer().RulesDigest()}
	record := []byte(`{"a":1,"t":2}`)
	for _, c := range []struct {
		name  string
		first string
		found bool
		same  bool
	}{
		{"gone from the topic", "", false, true},
		{"the same request", `{"t":9,"a":1}`, true, true},
		{"another request", `{"a":2}`, true, false},
		{"no longer readable", `{"a":`, true, false},
	} {
		same, err := d.SameRequestUnderCurrentRules(o, record, []byte(c.first), c.found)
		if err != nil || same != c.same {
			t.Errorf("%s: same %v, %v; want %v", c.name, same, err, c.same)
		}
	}
	// Reading the first copy moves the reader on (its writer schema is
	// newer): the record's fingerprint was made under other rules, so the
	// record is fingerprinted again, under the same rules as the first
	// copy, before they are compared.
	dec.next = "-v2"
	if same, err := d.SameRequestUnderCurrentRules(o, record, []byte(`{"t":9,"a":1}`), true); !same || err != nil {
		t.Errorf("reader moved on, the same request: same %v, %v; want true", same, err)
	}
	dec.next = "-v3"
	if same, err := d.SameRequestUnderCurrentRules(o, record, []byte(`{"t":9,"a":2}`), true); same || err != nil {
		t.Errorf("reader moved on, another request: same %v, %v; want false", same, err)
	}
	dec.next = ""
	dec.down = true
	if _, err := d.SameRequestUnderCurrentRules(o, record, []byte(`{"a":1}`), true); !errors.Is(err, dedupe.ErrRegistryUnavailable) {
		t.Fatalf("registry down: %v, want the retryable error, not a verdict", err)
	}
	// Deciding a batch while the registry is down decides nothing.
	outs, err := d.Decide(t.Context(), "h", []dedupe.Record{{Topic: "in", Value: []byte(`{"a":1}`), Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(keyA)}}}}, nil)
	if !dedupe.IsRetryable(err) || outs[0].Kind != "" {
		t.Fatalf("decide with the registry down: %v %+v, want a retryable error and no outcome", err, outs)
	}
	// A registry that refuses is no record's fault either: the error
	// stops the caller, and nothing is dead-lettered.
	dec.down, dec.refused = false, true
	outs, err = d.Decide(t.Context(), "h", []dedupe.Record{{Topic: "in", Value: []byte(`{"a":1}`), Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(keyA)}}}}, nil)
	if err == nil || dedupe.Classify(err) != dedupe.Fatal || outs[0].Kind != "" {
		t.Fatalf("decide with the registry refusing: %v %+v, want a fatal error and no outcome", err, outs)
	}
	if _, err := d.SameRequestUnderCurrentRules(o, record, []byte(`{"a":1}`), true); err == nil {
		t.Fatal("a rules check with the registry refusing gave a verdict")
	}
}
