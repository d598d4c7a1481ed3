package decode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/idemstream/idemstream/decode"
	"github.com/idemstream/idemstream/dedupe"
)

// TestJSONSchemaPayloads: the JSON after the framing is the payload,
// checked against the JSON Schema its id names, references included.
func TestJSONSchemaPayloads(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	reg.SeedSchema("amount", 1, 10, sr.Schema{Schema: `{"type":"integer","minimum":1}`, Type: sr.TypeJSON})
	reg.SeedSchema("claims-value", 1, 11, sr.Schema{
		Schema:     `{"type":"object","required":["coupon_id","amount"],"properties":{"coupon_id":{"type":"integer"},"amount":{"$ref":"amount.json"}}}`,
		Type:       sr.TypeJSON,
		References: []sr.SchemaReference{{Name: "amount.json", Subject: "amount", Version: 1}},
	})
	reg.SeedSchema("other-value", 1, 12, sr.Schema{Schema: `{"type":"record","name":"R","fields":[]}`, Type: sr.TypeAvro})
	// Whoever may register a schema must not make the service read its
	// files: a $ref to a schema file that exists is refused.
	file := filepath.Join(t.TempDir(), "anything.json")
	if err := os.WriteFile(file, []byte(`true`), 0o600); err != nil {
		t.Fatal(err)
	}
	reg.SeedSchema("files-value", 1, 14, sr.Schema{Schema: `{"$ref":"file://` + filepath.ToSlash(file) + `"}`, Type: sr.TypeJSON})
	r, err := decode.NewRegistry(decode.RegistryConfig{URL: reg.URL()})
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadJSONSchema, Registry: r, Subject: "claims-value"})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"amount": 50, "coupon_id": 7}`
	got, err := d.AppendJSON(nil, framed(11, []byte(body)...))
	if err != nil || string(got) != body {
		t.Fatalf("a valid claim: %s %v", got, err)
	}
	for _, c := range []struct {
		name   string
		value  []byte
		reason dedupe.Reason
	}{
		{"violates the referenced schema", framed(11, []byte(`{"amount":0,"coupon_id":7}`)...), dedupe.ReasonInvalidSchema},
		{"misses a field", framed(11, []byte(`{"amount":5}`)...), dedupe.ReasonInvalidSchema},
		{"not JSON", framed(11, []byte(`{"amount":`)...), dedupe.ReasonMalformedPayload},
		{"no framing", []byte(body), dedupe.ReasonMalformedPayload},
		{"an Avro schema's id", framed(12, []byte(body)...), dedupe.ReasonIncompatibleSchema},
		{"an unknown id", framed(13, []byte(body)...), dedupe.ReasonUnknownSchema},
		{"a schema that reads a file", framed(14, []byte(body)...), dedupe.ReasonIncompatibleSchema},
	} {
		_, err := d.AppendJSON(nil, c.value)
		if dedupe.ReasonOf(err) != c.reason {
			t.Errorf("%s: %v, want %s", c.name, err, c.reason)
		}
	}
}

// A JSON Schema payload that decodes but that the canonicalizer refuses
// (a member named twice) is a dead letter naming its schema, as the
// decoder's own refusals are.
func TestJSONSchemaRefusalsNameTheSchema(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	reg.SeedSchema("claims-value", 3, 21, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	r, err := decode.NewRegistry(decode.RegistryConfig{URL: reg.URL()})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadJSONSchema, Registry: r, Subject: "claims-value"})
	if err != nil {
		t.Fatal(err)
	}
	anyKey, err := dedupe.ParseKeyFormat("any")
	if err != nil {
		t.Fatal(err)
	}
	pol := dedupe.Policy{Pipeline: "p", Key: dedupe.KeySpec{From: dedupe.KeyFromMessageKey, Format: anyKey},
		Semantics: dedupe.Strict, Window: time.Minute, PendingTimeout: time.Second, FailedTTL: time.Minute,
		Rules: dedupe.CanonicalRules{Payload: dedupe.PayloadJSONSchema, Decoder: dec}}
	d, err := dedupe.NewDecider(pol, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := d.Prepare(&dedupe.Record{Key: []byte("k"), Value: framed(21, []byte(`{"amount":5,"amount":6}`)...)})
	var se *dedupe.SchemaError
	if dedupe.ReasonOf(p.Err) != dedupe.ReasonMalformedPayload || !errors.As(p.Err, &se) ||
		se.ID != 21 || se.Subject != "claims-value" || se.Version != 3 {
		t.Fatalf("got %v", p.Err)
	}
}
