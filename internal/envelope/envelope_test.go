package envelope_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

var input = dedupe.Record{
	Topic: "coupon.claim.commands", Partition: 3, Offset: 17,
	Key: []byte{0xff, 0x00, 'k'}, Value: []byte(`{"amount": 100}`),
	Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte("9f8a")}, {Key: "bin", Value: []byte{0, 1, 2}}},
}

func compile(t *testing.T, schema []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validate writes msg through the JSON-lines sink and checks the line
// against the published schema.
func validate(t *testing.T, schema []byte, msg sinks.Message) {
	t.Helper()
	var buf bytes.Buffer
	if _, err := sinks.NewJSONLines(&buf).Write(context.Background(), []sinks.Message{msg}); err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := compile(t, schema).Validate(doc); err != nil {
		t.Errorf("record does not match its schema: %v", err)
	}
}

func TestDeadLetterKeepsTheInputByteForByte(t *testing.T) {
	o := dedupe.Outcome{Kind: dedupe.OutcomeConflict, Key: "9f8a", Fingerprint: "sha256:" + strings.Repeat("b", 64),
		Decision: dedupe.Decision{Entry: dedupe.Entry{Fingerprint: "sha256:" + strings.Repeat("a", 64), FirstSource: "coupon.claim.commands/1/2"}}}
	m := envelope.DeadLetter("dlq", &input, &o, dedupe.ReasonConflict, errors.New("reused\nkey"), []string{"/amount", "/items/0"})
	if !bytes.Equal(m.Key, input.Key) || !bytes.Equal(m.Value, input.Value) {
		t.Errorf("key/value changed: %q %q", m.Key, m.Value)
	}
	for i, h := range input.Headers {
		if m.Headers[i].Key != h.Key || !bytes.Equal(m.Headers[i].Value, h.Value) {
			t.Errorf("input header %d changed: %+v", i, m.Headers[i])
		}
	}
	want := map[string]string{
		"idemstream-reason": "conflict", "idemstream-error": "reused key", "idemstream-source": "coupon.claim.commands/3/17",
		"idemstream-fingerprint": o.Fingerprint, "idemstream-first-fingerprint": o.Decision.Entry.Fingerprint,
		"idemstream-first-source": "coupon.claim.commands/1/2", "idemstream-conflict-paths": "/amount,/items/0",
	}
	for k, v := range want {
		if got, _ := sinks.HeaderValue(m.Headers, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	validate(t, schemas.DLQSchema, m)
}

func TestResultAndReplyHeaders(t *testing.T) {
	o := dedupe.Outcome{Kind: dedupe.OutcomeFirst, Key: "9f8a", Fingerprint: "sha256:" + strings.Repeat("c", 64),
		Decision: dedupe.Decision{Entry: dedupe.Entry{FirstSource: "coupon.claim.commands/1/2", WindowStart: time.UnixMilli(1764650000123)}}}
	noKey := input
	noKey.Key = nil
	r := envelope.Result("out", 4, &noKey, &o, noKey.Source(), o.Decision.Entry.DecisionID(), []byte("done"), []dedupe.Header{{Key: "x-handler", Value: []byte("1")}})
	if string(r.Key) != "9f8a" || r.Partition != 4 || string(r.Value) != "done" {
		t.Errorf("result: key %q partition %d value %q; an input without a key gets the idempotency key", r.Key, r.Partition, r.Value)
	}
	for k, v := range map[string]string{"idemstream-key": "9f8a", "idemstream-outcome": "first", "idemstream-fingerprint": o.Fingerprint,
		"idemstream-source": "coupon.claim.commands/3/17", "x-handler": "1", "Idempotency-Key": "9f8a",
		"idemstream-decision": "coupon.claim.commands/1/2@1764650000123"} {
		if got, _ := sinks.HeaderValue(r.Headers, k); got != v {
			t.Errorf("result %s = %q, want %q", k, got, v)
		}
	}
	validate(t, schemas.ResultSchema, r)

	replay := input
	replay.Offset = 99
	rep := envelope.Reply("replies", r, &replay)
	if v, _ := sinks.HeaderValue(rep.Headers, "idemstream-replayed"); v != "true" {
		t.Error("reply lacks idemstream-replayed: true")
	}
	if v, _ := sinks.HeaderValue(rep.Headers, "idemstream-source"); v != "coupon.claim.commands/3/99" {
		t.Errorf("reply source = %q, want the replay's", v)
	}
	if n := strings.Count(headerKeys(rep.Headers), "idemstream-source"); n != 1 {
		t.Errorf("reply carries %d idemstream-source headers", n)
	}
}

func headerKeys(hs []dedupe.Header) string {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(h.Key + ",")
	}
	return b.String()
}

// A trimmed dead letter keeps the evidence (reason, source, fingerprint),
// says what it lost, and names the payload's size; trimmed again it keeps
// the original size, and bare it drops the input's key and headers.
func TestTrimDeadLetterKeepsTheEvidence(t *testing.T) {
	o := dedupe.Outcome{Key: "9f8a", Fingerprint: "sha256:" + strings.Repeat("b", 64)}
	m := envelope.DeadLetter("dlq", &input, &o, dedupe.ReasonPayloadTooLarge, errors.New("payload too large"), nil)
	size := len(m.Value)
	half := envelope.TrimDeadLetter(m, size/2, false)
	if !bytes.Equal(half.Value, input.Value[:size/2]) || !bytes.Equal(half.Key, input.Key) {
		t.Errorf("trimmed: key %q value %q", half.Key, half.Value)
	}
	for _, h := range input.Headers {
		if got, ok := sinks.HeaderValue(half.Headers, h.Key); !ok || got != string(h.Value) {
			t.Errorf("input header %s lost in a trimmed dead letter", h.Key)
		}
	}
	none := envelope.TrimDeadLetter(half, 0, true)
	for _, d := range []sinks.Message{half, none} {
		for k, v := range map[string]string{"idemstream-reason": "payload_too_large", "idemstream-source": "coupon.claim.commands/3/17",
			"idemstream-fingerprint": o.Fingerprint, "idemstream-payload-size": fmt.Sprint(size)} {
			if got, _ := sinks.HeaderValue(d.Headers, k); got != v {
				t.Errorf("%s = %q, want %q", k, got, v)
			}
		}
		msg, _ := sinks.HeaderValue(d.Headers, "idemstream-error")
		if !strings.HasPrefix(msg, "payload too large (the dead letter was too large for the topic") || strings.Count(msg, "too large for the topic") != 1 {
			t.Errorf("idemstream-error = %q", msg)
		}
		validate(t, schemas.DLQSchema, d)
	}
	if none.Key != nil || len(none.Value) != 0 {
		t.Errorf("bare dead letter keeps key %q value %q", none.Key, none.Value)
	}
	for _, h := range none.Headers {
		if !strings.HasPrefix(h.Key, "idemstream-") {
			t.Errorf("bare dead letter keeps input header %s", h.Key)
		}
	}
}
