package decode_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/idemstream/idemstream/decode"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
)

const readerV1 = `{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"long"},{"name":"amount","type":"long"}]}`

func framed(id int, body ...byte) []byte {
	b := binary.BigEndian.AppendUint32([]byte{0}, uint32(id))
	return append(b, body...)
}

// openAvro serves a fake registry with the reader schema as claims-value
// version 1 and opens a decoder on it.
func openAvro(t *testing.T) (*srfake.Registry, *decode.Decoder) {
	t.Helper()
	reg := srfake.New()
	t.Cleanup(reg.Close)
	reg.SeedSchema("claims-value", 1, 1, sr.Schema{Schema: readerV1, Type: sr.TypeAvro})
	r, err := decode.NewRegistry(decode.RegistryConfig{URL: reg.URL()})
	if err != nil {
		t.Fatal(err)
	}
	d, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadAvro, Registry: r, Subject: "claims-value"})
	if err != nil {
		t.Fatal(err)
	}
	return reg, d
}

func TestDecoderReasonsCarryTheSchema(t *testing.T) {
	reg, d := openAvro(t)
	reg.SeedSchema("orders-value", 2, 7, sr.Schema{Schema: `{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"string"}]}`, Type: sr.TypeAvro})
	reg.SeedSchema("other-value", 1, 8, sr.Schema{Schema: `syntax = "proto3"; message M { int64 a = 1; }`, Type: sr.TypeProtobuf})
	cases := []struct {
		name   string
		value  []byte
		reason dedupe.Reason
		id     int
	}{
		{"no framing", []byte(`{"coupon_id":1}`), dedupe.ReasonMalformedPayload, -1},
		{"short", []byte{0, 0, 0}, dedupe.ReasonMalformedPayload, -1},
		{"unknown id", framed(99, 2, 4), dedupe.ReasonUnknownSchema, 99},
		{"incompatible writer", framed(7, 2, 'x'), dedupe.ReasonIncompatibleSchema, 7},
		{"a protobuf id", framed(8, 0, 8, 1), dedupe.ReasonIncompatibleSchema, 8},
		{"bytes that do not decode", framed(1, 2), dedupe.ReasonMalformedPayload, 1},
	}
	for _, c := range cases {
		_, err := d.AppendJSON(nil, c.value)
		if got := dedupe.ReasonOf(err); got != c.reason {
			t.Errorf("%s: reason %q (%v), want %q", c.name, got, err, c.reason)
			continue
		}
		var se *dedupe.SchemaError
		if c.id >= 0 && (!errors.As(err, &se) || se.ID != c.id) {
			t.Errorf("%s: %v does not name schema id %d", c.name, err, c.id)
		}
	}
	// The coordinates of a known id come from the registry.
	_, err := d.AppendJSON(nil, framed(7, 2, 'x'))
	var se *dedupe.SchemaError
	if !errors.As(err, &se) || se.Subject != "orders-value" || se.Version != 2 {
		t.Errorf("%v: want subject orders-value version 2", err)
	}
}

func TestRegistryOutageIsNeverTheRecordsFault(t *testing.T) {
	reg, d := openAvro(t)
	reg.SeedSchema("claims-value", 2, 5, sr.Schema{Schema: readerV1, Type: sr.TypeAvro})
	record := framed(5, 2, 4) // coupon_id 1, amount 2
	for _, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
			http.Error(w, `{"error_code":50001,"message":"down"}`, status)
			return true
		})
		_, err := d.AppendJSON(nil, record)
		if !dedupe.IsRetryable(err) || !errors.Is(err, dedupe.ErrRegistryUnavailable) {
			t.Errorf("status %d: %v, want retryable", status, err)
		}
		reg.ClearInterceptors()
	}
	// Nothing of the outage was cached: the same record decodes now.
	got, err := d.AppendJSON(nil, record)
	if err != nil || string(got) != `{"coupon_id":1,"amount":2}` {
		t.Fatalf("after the outage: %s, %v", got, err)
	}
	// A refusal no retry can cure stops the pipeline instead of pausing
	// it for ever.
	reg.SeedSchema("claims-value", 3, 6, sr.Schema{Schema: readerV1, Type: sr.TypeAvro})
	reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		http.Error(w, `{"error_code":40101,"message":"unauthorized"}`, http.StatusUnauthorized)
		return true
	})
	_, err = d.AppendJSON(nil, framed(6, 2, 4))
	if c := dedupe.Classify(err); c != dedupe.Fatal || !strings.Contains(err.Error(), "password_env") {
		t.Errorf("401: %v is %s, want fatal naming the credentials", err, c)
	}
}

func TestRegistryUnreachableIsRetryable(t *testing.T) {
	r, err := decode.NewRegistry(decode.RegistryConfig{URL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadAvro, Registry: r, Subject: "claims-value"})
	if !dedupe.IsRetryable(err) {
		t.Fatalf("open with the registry down: %v, want retryable", err)
	}
	if err := r.Check(context.Background()); !dedupe.IsRetryable(err) {
		t.Fatalf("check: %v", err)
	}
}

func TestReaderSchemaIsPartOfTheRules(t *testing.T) {
	_, a := openAvro(t)
	_, b := openAvro(t)
	if a.Digest() != b.Digest() || !strings.HasPrefix(a.Digest(), "sha256:") {
		t.Fatalf("one reader schema, two digests: %s %s", a.Digest(), b.Digest())
	}
	reg := srfake.New()
	defer reg.Close()
	// The same schema spelled otherwise (layout, doc) is the same rules;
	// a new default is not.
	for text, same := range map[string]bool{
		`{"doc":"claims","type":"record","name":"Claim","fields":[ {"name":"coupon_id","type":"long"}, {"name":"amount","type":"long"}]}`:                           true,
		`{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"long"},{"name":"amount","type":"long"},{"name":"c","type":"string","default":"x"}]}`: false,
	} {
		reg.Reset()
		reg.SeedSchema("claims-value", 1, 1, sr.Schema{Schema: text, Type: sr.TypeAvro})
		r, _ := decode.NewRegistry(decode.RegistryConfig{URL: reg.URL()})
		d, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadAvro, Registry: r, Subject: "claims-value"})
		if err != nil {
			t.Fatal(err)
		}
		if (d.Digest() == a.Digest()) != same {
			t.Errorf("%s: digest equal %v, want %v", text, d.Digest() == a.Digest(), same)
		}
		c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{Payload: dedupe.PayloadAvro, Decoder: d})
		if err != nil {
			t.Fatal(err)
		}
		c2, _ := dedupe.NewCanonicalizer(dedupe.CanonicalRules{Payload: dedupe.PayloadAvro, Decoder: a})
		if (c.RulesDigest() == c2.RulesDigest()) != same {
			t.Errorf("%s: the rules digest does not follow the reader schema", text)
		}
	}
}

func TestMissingReaderSubjectIsAConfigError(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	r, _ := decode.NewRegistry(decode.RegistryConfig{URL: reg.URL()})
	_, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadAvro, Registry: r, Subject: "nope-value"})
	if err == nil || dedupe.IsRetryable(err) || !strings.Contains(err.Error(), "reader_schema") {
		t.Fatalf("got %v, want a config error naming reader_schema", err)
	}
}

// A producer's newer schema under the reader's subject makes it the
// reader: a field only the new version has is compared (two copies that
// differ only there are two requests), and the digest follows, so the
// rules-change path re-reads stored first copies.
func TestNewerWriterRefreshesTheReader(t *testing.T) {
	reg, d := openAvro(t)
	before := d.Digest()
	v2 := `{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"long"},{"name":"amount","type":"long"},{"name":"channel","type":"string","default":"app"}]}`
	reg.SeedSchema("claims-value", 2, 2, sr.Schema{Schema: v2, Type: sr.TypeAvro})
	app, err := d.AppendJSON(nil, framed(2, 2, 4, 6, 'a', 'p', 'p'))
	if err != nil {
		t.Fatal(err)
	}
	web, err := d.AppendJSON(nil, framed(2, 2, 4, 6, 'w', 'e', 'b'))
	if err != nil {
		t.Fatal(err)
	}
	if string(app) == string(web) || !strings.Contains(string(web), `"channel":"web"`) {
		t.Fatalf("the new field is not compared: %s %s", app, web)
	}
	if d.Digest() == before {
		t.Fatal("the reader schema changed, the digest did not")
	}
	if _, _, v := d.Reader(); v != 2 {
		t.Fatalf("reader version %d, want 2", v)
	}
	// A v1 copy reads with the new field's default.
	if old, err := d.AppendJSON(nil, framed(1, 2, 4)); err != nil || string(old) != `{"coupon_id":1,"amount":2,"channel":"app"}` {
		t.Fatalf("a v1 copy under the v2 reader: %s %v", old, err)
	}
	// A v3 that cannot read v2's records is not taken for the reader:
	// its own records are incompatible, the others read as before.
	v3 := `{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"string"}]}`
	reg.SeedSchema("claims-value", 3, 3, sr.Schema{Schema: v3, Type: sr.TypeAvro})
	if _, err := d.AppendJSON(nil, framed(3, 2, 'x')); dedupe.ReasonOf(err) != dedupe.ReasonIncompatibleSchema {
		t.Fatalf("a v3 record: %v", err)
	}
	if _, _, v := d.Reader(); v != 2 {
		t.Fatalf("reader version %d after an incompatible v3, want 2", v)
	}
}

// TestProtobufMessageTypeIsPartOfTheRequest: a topic that carries two
// message types never lets one pass as a replay of the other.
func TestProtobufMessageTypeIsPartOfTheRequest(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	schema := `syntax = "proto3"; package c.v1; message Claim { int64 coupon_id = 1; } message Cancel { int64 coupon_id = 1; }`
	reg.SeedSchema("claims-value", 1, 1, sr.Schema{Schema: schema, Type: sr.TypeProtobuf})
	r, _ := decode.NewRegistry(decode.RegistryConfig{URL: reg.URL()})
	d, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadProtobuf, Registry: r, Subject: "claims-value"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d.AppendJSON(nil, framed(1, 0, 8, 7)); err != nil || string(got) != `{"coupon_id":7}` {
		t.Fatalf("a Claim: %s %v", got, err)
	}
	// Indexes [1]: a count of 1 then index 1, zig-zag.
	if _, err := d.AppendJSON(nil, framed(1, 2, 2, 8, 7)); dedupe.ReasonOf(err) != dedupe.ReasonIncompatibleSchema {
		t.Fatalf("a Cancel on a Claim pipeline: %v", err)
	}
}

func TestNotFoundThatIsNotTheRegistrysIsRetryable(t *testing.T) {
	reg, d := openAvro(t)
	reg.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		http.Error(w, "404 page not found", http.StatusNotFound)
		return true
	})
	if _, err := d.AppendJSON(nil, framed(42, 2, 4)); !dedupe.IsRetryable(err) {
		t.Fatalf("a proxy's 404: %v, want retryable", err)
	}
}

// TestRemovedFieldWithADefaultIsNoConflict: v2 drops a field that had a
// default. The v1 copy and the v2 retry are the same request: decided on
// a real decider, the retry is a replay, never a conflict.
func TestRemovedFieldWithADefaultIsNoConflict(t *testing.T) {
	reg := srfake.New()
	defer reg.Close()
	v1 := `{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"long"},{"name":"note","type":"string","default":""}]}`
	v2 := `{"type":"record","name":"Claim","fields":[{"name":"coupon_id","type":"long"}]}`
	reg.SeedSchema("claims-value", 1, 1, sr.Schema{Schema: v1, Type: sr.TypeAvro})
	r, _ := decode.NewRegistry(decode.RegistryConfig{URL: reg.URL()})
	d, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadAvro, Registry: r, Subject: "claims-value"})
	if err != nil {
		t.Fatal(err)
	}
	format, _ := dedupe.ParseKeyFormat("any")
	store := memstore.New()
	dec, err := dedupe.NewDecider(dedupe.Policy{
		Pipeline: "p", Key: dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "k", Format: format, MaxLength: 64},
		Semantics: dedupe.Strict, Window: time.Minute, Clock: dedupe.ClockStore, MaxPayloadBytes: 1 << 20,
		PendingTimeout: time.Second, FailedTTL: time.Minute,
		Rules: dedupe.CanonicalRules{Payload: dedupe.PayloadAvro, Decoder: d},
	}, store)
	if err != nil {
		t.Fatal(err)
	}
	decide := func(value []byte, offset int64) dedupe.Outcome {
		t.Helper()
		rec := dedupe.Record{Topic: "in", Offset: offset, Value: value, Headers: []dedupe.Header{{Key: "k", Value: []byte("key-1")}}}
		outs, err := dec.Decide(context.Background(), "h", []dedupe.Record{rec}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if outs[0].Kind == dedupe.OutcomeFirst {
			if _, err := store.Complete(context.Background(), []dedupe.Completion{{Namespace: "p", Key: outs[0].Key, Owner: outs[0].Decision.Entry.Owner, State: dedupe.Success}}); err != nil {
				t.Fatal(err)
			}
		}
		return outs[0]
	}
	if o := decide(framed(1, 2, 12, 'u', 'r', 'g', 'e', 'n', 't'), 0); o.Kind != dedupe.OutcomeFirst {
		t.Fatalf("the v1 copy: %s", o.Kind)
	}
	reg.SeedSchema("claims-value", 2, 2, sr.Schema{Schema: v2, Type: sr.TypeAvro})
	if o := decide(framed(2, 2), 1); o.Kind != dedupe.OutcomeReplay {
		t.Fatalf("the v2 retry: %s (%v), want replay", o.Kind, o.Err)
	}
}
