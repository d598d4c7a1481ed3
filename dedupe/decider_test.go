package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/dedupe/storetest"
)

const keyA = "9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"

func policy(sem dedupe.Semantics) dedupe.Policy {
	format, _ := dedupe.ParseKeyFormat("uuid")
	return dedupe.Policy{
		Pipeline:        "coupon-claim",
		Key:             dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "Idempotency-Key", Format: format, MaxLength: 128},
		Semantics:       sem,
		Window:          10 * time.Minute,
		Clock:           dedupe.ClockStore,
		Rules:           dedupe.CanonicalRules{Volatile: []string{"/client_time", "/retry_count"}, Unordered: []string{"/items"}},
		MaxPayloadBytes: 1024,
		PendingTimeout:  30 * time.Second,
		FailedTTL:       10 * time.Minute,
	}
}

type rig struct {
	t     *testing.T
	clock *storetest.ManualClock
	store *memstore.Store
	dec   *dedupe.Decider
	next  int64
}

func newRig(t *testing.T, p dedupe.Policy) *rig {
	t.Helper()
	clock := storetest.NewManualClock()
	store := memstore.New(memstore.WithClock(clock.Now))
	r := &rig{t: t, clock: clock, store: store}
	r.dec = r.decider(p)
	return r
}

func (r *rig) decider(p dedupe.Policy) *dedupe.Decider {
	r.t.Helper()
	d, err := dedupe.NewDecider(p, r.store, dedupe.WithWaitClock(r.clock.Now, func(ctx context.Context, d time.Duration) error {
		r.clock.Advance(d)
		return nil
	}))
	if err != nil {
		r.t.Fatal(err)
	}
	return d
}

func (r *rig) record(key, body string) dedupe.Record {
	r.next++
	rec := dedupe.Record{Topic: "coupon.claim.commands", Partition: 0, Offset: r.next, Value: []byte(body)}
	if key != "" {
		rec.Headers = []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(key)}}
	}
	return rec
}

func (r *rig) decide(d *dedupe.Decider, holder string, recs ...dedupe.Record) []dedupe.Outcome {
	r.t.Helper()
	out, err := d.Decide(context.Background(), holder, recs, nil)
	if err != nil {
		r.t.Fatalf("Decide: %v", err)
	}
	return out
}

// finish completes every first outcome, as the consumer does once the
// result is written.
func (r *rig) finish(holder string, recs []dedupe.Record, outs []dedupe.Outcome, st dedupe.State) {
	r.t.Helper()
	for i, o := range outs {
		if o.Kind != dedupe.OutcomeFirst {
			continue
		}
		errs, err := r.store.Complete(context.Background(), []dedupe.Completion{{
			Namespace: "coupon-claim", Key: o.Key, Owner: dedupe.Owner{Holder: holder, Source: recs[i].Source()},
			State: st, Result: dedupe.ResultRef{Partition: 0, Offset: 1}, FailedTTL: 10 * time.Minute,
		}})
		if err != nil || errs[0] != nil {
			r.t.Fatalf("complete: %v %v", err, errs)
		}
	}
}

const (
	body       = `{"coupon_id":12345,"amount":50,"items":["a","b"],"client_time":"10:00:00","retry_count":0}`
	retryBody  = `{"retry_count":3,"client_time":"10:00:09","items":["b","a"],"amount":5e1,"coupon_id":12345}`
	otherBody  = `{"coupon_id":12345,"amount":100,"items":["a","b"],"client_time":"10:00:00","retry_count":0}`
	holderHere = "instance-a/commands/0"
)

// TestSemanticsTable drives every semantics through every outcome the
// store can give, as the documented outcome table lists them.
func TestSemanticsTable(t *testing.T) {
	type step struct {
		advance time.Duration
		body    string
		want    dedupe.OutcomeKind
		fail    bool // complete the first as FAILED instead of SUCCESS
	}
	cases := map[dedupe.Semantics][]step{
		dedupe.Strict: {
			{body: body, want: dedupe.OutcomeFirst},
			{body: retryBody, want: dedupe.OutcomeReplay},
			{body: otherBody, want: dedupe.OutcomeConflict},
			{advance: 10 * time.Minute, body: otherBody, want: dedupe.OutcomeFirst, fail: true},
			{body: body, want: dedupe.OutcomeConflict},
			{body: otherBody, want: dedupe.OutcomeFirst},
		},
		dedupe.Lenient: {
			{body: body, want: dedupe.OutcomeFirst},
			{body: retryBody, want: dedupe.OutcomeReplay},
			{body: otherBody, want: dedupe.OutcomeReplay},
			{advance: 10 * time.Minute, body: otherBody, want: dedupe.OutcomeFirst, fail: true},
			{body: body, want: dedupe.OutcomeFirst},
		},
		dedupe.Window: {
			{body: body, want: dedupe.OutcomeFirst},
			{body: otherBody, want: dedupe.OutcomeReplay},
			{advance: 9 * time.Minute, body: body, want: dedupe.OutcomeReplay},
			{advance: time.Minute, body: body, want: dedupe.OutcomeFirst},
		},
	}
	for sem, steps := range cases {
		t.Run(string(sem), func(t *testing.T) {
			r := newRig(t, policy(sem))
			for i, s := range steps {
				r.clock.Advance(s.advance)
				rec := r.record(keyA, s.body)
				out := r.decide(r.dec, holderHere, rec)
				if out[0].Kind != s.want {
					t.Fatalf("step %d (%s): outcome %s, want %s (err %v)", i, s.body, out[0].Kind, s.want, out[0].Err)
				}
				st := dedupe.Success
				if s.fail {
					st = dedupe.Failed
				}
				r.finish(holderHere, []dedupe.Record{rec}, out, st)
			}
		})
	}
}

func TestLenientMismatchCounted(t *testing.T) {
	r := newRig(t, policy(dedupe.Lenient))
	first := r.record(keyA, body)
	out := r.decide(r.dec, holderHere, first)
	r.finish(holderHere, []dedupe.Record{first}, out, dedupe.Success)
	same := r.decide(r.dec, holderHere, r.record(keyA, retryBody))[0]
	other := r.decide(r.dec, holderHere, r.record(keyA, otherBody))[0]
	if same.LenientMismatch || !other.LenientMismatch {
		t.Errorf("lenient mismatch: same body %v, other body %v; want false, true", same.LenientMismatch, other.LenientMismatch)
	}
}

func TestConflictCarriesEvidence(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	first := r.record(keyA, body)
	out := r.decide(r.dec, holderHere, first)
	r.finish(holderHere, []dedupe.Record{first}, out, dedupe.Success)
	c := r.decide(r.dec, holderHere, r.record(keyA, otherBody))[0]
	if c.Kind != dedupe.OutcomeConflict || c.Reason != dedupe.ReasonConflict {
		t.Fatalf("outcome %+v", c)
	}
	if c.Decision.Entry.Fingerprint != out[0].Fingerprint || c.Decision.Entry.FirstSource != first.Source() {
		t.Errorf("conflict evidence: first fingerprint %s source %s, want %s %s",
			c.Decision.Entry.Fingerprint, c.Decision.Entry.FirstSource, out[0].Fingerprint, first.Source())
	}
	if !strings.Contains(c.Err.Error(), first.Source()) {
		t.Errorf("conflict error %q does not name the first source", c.Err)
	}
}

func TestInvalidRecords(t *testing.T) {
	big := `{"pad":"` + strings.Repeat("x", 2000) + `"}`
	cases := []struct {
		name   string
		key    string
		body   string
		reason dedupe.Reason
	}{
		{"no key", "", body, dedupe.ReasonMissingKey},
		{"not a uuid", "coupon-12345", body, dedupe.ReasonInvalidKey},
		{"uuid too long", keyA + "0", body, dedupe.ReasonInvalidKey},
		{"not utf-8", "\xff\xfe", body, dedupe.ReasonInvalidKey},
		{"malformed json", keyA, `{"amount": 50,}`, dedupe.ReasonMalformedPayload},
		{"duplicate member", keyA, `{"amount": 50, "amount": 100}`, dedupe.ReasonMalformedPayload},
		{"too large", keyA, big, dedupe.ReasonPayloadTooLarge},
	}
	r := newRig(t, policy(dedupe.Strict))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := r.decide(r.dec, holderHere, r.record(tc.key, tc.body))[0]
			if o.Kind != dedupe.OutcomeInvalid || o.Reason != tc.reason {
				t.Errorf("outcome %s reason %q (%v), want invalid %q", o.Kind, o.Reason, o.Err, tc.reason)
			}
			if o.Err == nil || strings.Contains(o.Err.Error(), "\n") {
				t.Errorf("error %q is not one sentence", o.Err)
			}
			if dedupe.Classify(o.Err) != dedupe.Poison {
				t.Errorf("Classify(%v) = %v, want poison", o.Err, dedupe.Classify(o.Err))
			}
		})
	}
	if r.store.Len() != 0 {
		t.Errorf("invalid records created %d store entries", r.store.Len())
	}
	o := r.decide(r.dec, holderHere, r.record("not-a-uuid", body))[0]
	if o.Fingerprint == "" {
		t.Error("an invalid key hides the fingerprint the dead letter should carry")
	}
}

type rejectAll struct{}

func (rejectAll) ValidatePayload([]byte) error { return errors.New("at /coupon_id: want integer") }

func TestSchemaViolation(t *testing.T) {
	p := policy(dedupe.Strict)
	p.Schema = rejectAll{}
	r := newRig(t, p)
	o := r.decide(r.dec, holderHere, r.record(keyA, body))[0]
	if o.Reason != dedupe.ReasonInvalidSchema || !strings.Contains(o.Err.Error(), "/coupon_id") {
		t.Errorf("outcome %+v", o)
	}
}

func TestKeyFormatsAndSources(t *testing.T) {
	upper := strings.ToUpper(keyA)
	r := newRig(t, policy(dedupe.Strict))
	recs := []dedupe.Record{r.record(keyA, body), r.record(upper, retryBody)}
	recs[1].Headers[0].Key = "idempotency-key"
	out := r.decide(r.dec, holderHere, recs...)
	if out[0].Kind != dedupe.OutcomeFirst || out[1].Kind != dedupe.OutcomeReplay || out[1].Key != keyA {
		t.Errorf("uuid keys in two cases: %s %s (key %q); want first, replay of one key", out[0].Kind, out[1].Kind, out[1].Key)
	}

	twice := r.record(keyA, body)
	twice.Headers = append(twice.Headers, dedupe.Header{Key: "Idempotency-Key", Value: []byte(upper + "x")})
	if o := r.decide(r.dec, holderHere, twice)[0]; o.Reason != dedupe.ReasonInvalidKey {
		t.Errorf("two different key headers: %s %q", o.Kind, o.Reason)
	}

	p := policy(dedupe.Strict)
	p.Key = dedupe.KeySpec{From: dedupe.KeyFromField, Name: "/request/id", MaxLength: 64}
	p.Key.Format, _ = dedupe.ParseKeyFormat("regex:REQ-[0-9]+")
	fd := r.decider(p)
	field := func(b string) dedupe.Outcome { return r.decide(fd, holderHere, r.record("", b))[0] }
	if o := field(`{"request":{"id":"REQ-1"},"a":1}`); o.Kind != dedupe.OutcomeFirst || o.Key != "REQ-1" {
		t.Errorf("field key: %+v", o)
	}
	if o := field(`{"request":{"id":"req-1"}}`); o.Reason != dedupe.ReasonInvalidKey {
		t.Errorf("regex mismatch: %s %q", o.Kind, o.Reason)
	}
	if o := field(`{"request":{"id":17}}`); o.Reason != dedupe.ReasonInvalidKey {
		t.Errorf("number key: %s %q", o.Kind, o.Reason)
	}
	if o := field(`{"request":{}}`); o.Reason != dedupe.ReasonMissingKey {
		t.Errorf("absent field: %s %q", o.Kind, o.Reason)
	}

	p.Key = dedupe.KeySpec{From: dedupe.KeyFromMessageKey, MaxLength: 64}
	p.Key.Format, _ = dedupe.ParseKeyFormat("any")
	md := r.decider(p)
	rec := r.record("", body)
	rec.Key = []byte("Order-7")
	if o := r.decide(md, holderHere, rec)[0]; o.Key != "Order-7" {
		t.Errorf("message key: %+v", o)
	}
}

// A key held by another worker is waited for; the wait ends as soon as
// the owner finishes.
func TestPendingElsewhereWaitsForOwner(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	first := r.record(keyA, body)
	out := r.decide(r.dec, "instance-b/commands/3", first)
	polls := 0
	d, err := dedupe.NewDecider(policy(dedupe.Strict), r.store, dedupe.WithWaitClock(r.clock.Now, func(ctx context.Context, d time.Duration) error {
		polls++
		r.clock.Advance(d)
		if polls == 3 {
			r.finish("instance-b/commands/3", []dedupe.Record{first}, out, dedupe.Success)
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	got := r.decide(d, holderHere, r.record(keyA, retryBody))[0]
	if got.Kind != dedupe.OutcomeReplay || polls != 3 {
		t.Errorf("outcome %s after %d polls, want replay after 3", got.Kind, polls)
	}
}

// An owner that never finishes: a waiter gives up after pending_timeout
// and decides on the stored state (a replay: the owner's own record comes
// back and is finished by whoever holds its partition next). Only once the
// lease (twice pending_timeout) is over may a record take the key over.
func TestPendingElsewhereOwnerNeverFinishes(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	r.decide(r.dec, "instance-b/commands/3", r.record(keyA, body))
	start := r.clock.Now()
	o := r.decide(r.dec, holderHere, r.record(keyA, retryBody))[0]
	if o.Kind != dedupe.OutcomeReplay {
		t.Fatalf("after pending_timeout: %s, want replay (the owner's lease still runs)", o.Kind)
	}
	if waited := r.clock.Now().Sub(start); waited < 30*time.Second || waited > 32*time.Second {
		t.Errorf("waited %v, want about pending_timeout (30s)", waited)
	}
	r.clock.Advance(31 * time.Second)
	o = r.decide(r.dec, "instance-c/commands/3", r.record(keyA, body))[0]
	if o.Kind != dedupe.OutcomeFirst || !o.Decision.Resumed {
		t.Errorf("after the lease: %s resumed=%v, want a resumed first (taken over)", o.Kind, o.Decision.Resumed)
	}
}

// The owner's batch ended without a result (its generation ended in a
// rebalance, or it died) and the same record reaches the next holder. It
// must neither be a replay after pending_timeout (nothing else would give
// the key its result) nor take a live lease: it waits for the lease, then
// resumes the key and the caller scans for a result before writing.
func TestOwnRecordRedeliveredWaitsForTheLeaseNotPendingTimeout(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	rec := r.record(keyA, body)
	r.decide(r.dec, "instance-b/g1/commands/0", rec)
	start := r.clock.Now()
	o := r.decide(r.dec, "instance-c/g2/commands/0", rec)[0]
	if o.Kind != dedupe.OutcomeFirst || !o.Decision.Resumed {
		t.Fatalf("own record at the next holder: %s resumed=%v, want a resumed first", o.Kind, o.Decision.Resumed)
	}
	lease := policy(dedupe.Strict).Lease()
	if waited := r.clock.Now().Sub(start); waited < lease || waited > lease+2*time.Second {
		t.Errorf("waited %v, want about the lease (%v), not pending_timeout", waited, lease)
	}
}

// A released key (the owner's generation ended before it wrote) is taken
// over by the next holder without waiting.
func TestReleasedKeyIsResumedAtOnce(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	rec := r.record(keyA, body)
	out := r.decide(r.dec, "instance-b/g1/commands/0", rec)
	errs, err := r.store.Complete(context.Background(), []dedupe.Completion{{Namespace: "coupon-claim", Key: out[0].Key,
		Owner: dedupe.Owner{Holder: "instance-b/g1/commands/0", Source: rec.Source()}, State: dedupe.Pending}})
	if err != nil || errs[0] != nil {
		t.Fatalf("release: %v %v", err, errs)
	}
	start := r.clock.Now()
	o := r.decide(r.dec, "instance-c/g2/commands/0", rec)[0]
	if o.Kind != dedupe.OutcomeFirst || !o.Decision.Resumed {
		t.Fatalf("released key: %s resumed=%v, want a resumed first", o.Kind, o.Decision.Resumed)
	}
	if waited := r.clock.Now().Sub(start); waited != 0 {
		t.Errorf("waited %v for a released key, want no wait", waited)
	}
}

func TestRenewReportsLostKeys(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	recs := []dedupe.Record{r.record(keyA, body), r.record("1f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d", body)}
	outs := r.decide(r.dec, holderHere, recs...)
	ptrs := func() ([]*dedupe.Record, []*dedupe.Outcome) {
		return []*dedupe.Record{&recs[0], &recs[1]}, []*dedupe.Outcome{&outs[0], &outs[1]}
	}
	rs, os := ptrs()
	lost, err := r.dec.Renew(context.Background(), holderHere, rs, os)
	if err != nil || lost[0] || lost[1] {
		t.Fatalf("renew of live leases: %v %v", lost, err)
	}
	// The lease of the first key runs out and another worker takes it.
	r.clock.Advance(61 * time.Second)
	r.decide(r.dec, "instance-z/commands/9", r.record(keyA, body))
	lost, err = r.dec.Renew(context.Background(), holderHere, rs, os)
	if err != nil || !lost[0] {
		t.Errorf("renew after a takeover: %v %v, want the first key lost", lost, err)
	}
	if lost[1] {
		t.Error("renew lost a key nobody took")
	}
}

func TestBatchKeepsOrderWithinKey(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	out := r.decide(r.dec, holderHere,
		r.record(keyA, body), r.record(keyA, retryBody), r.record(keyA, otherBody), r.record("", body))
	want := []dedupe.OutcomeKind{dedupe.OutcomeFirst, dedupe.OutcomeReplay, dedupe.OutcomeConflict, dedupe.OutcomeInvalid}
	for i, w := range want {
		if out[i].Kind != w {
			t.Errorf("record %d: %s, want %s", i, out[i].Kind, w)
		}
	}
}

func TestRulesChangeIsNotAConflict(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	first := r.record(keyA, body)
	out := r.decide(r.dec, holderHere, first)
	r.finish(holderHere, []dedupe.Record{first}, out, dedupe.Success)
	p := policy(dedupe.Strict)
	p.Rules.Volatile = append(p.Rules.Volatile, "/amount")
	o := r.decide(r.decider(p), holderHere, r.record(keyA, otherBody))[0]
	if o.Kind != dedupe.OutcomeReplay || !o.Decision.RulesChanged {
		t.Errorf("after a rules change: %s, RulesChanged=%v; want replay, true", o.Kind, o.Decision.RulesChanged)
	}
}

func TestEventClock(t *testing.T) {
	p := policy(dedupe.Window)
	p.Clock = dedupe.ClockEvent
	r := newRig(t, p)
	at := time.Date(2025, 6, 18, 9, 0, 0, 0, time.UTC)
	rec := func(offset time.Duration) dedupe.Record {
		x := r.record(keyA, body)
		x.Time = at.Add(offset)
		return x
	}
	first := rec(0)
	out := r.decide(r.dec, holderHere, first)
	r.finish(holderHere, []dedupe.Record{first}, out, dedupe.Success)
	if o := r.decide(r.dec, holderHere, rec(9*time.Minute))[0]; o.Kind != dedupe.OutcomeReplay {
		t.Errorf("inside the event-time window: %s", o.Kind)
	}
	if o := r.decide(r.dec, holderHere, rec(10*time.Minute))[0]; o.Kind != dedupe.OutcomeFirst {
		t.Errorf("past the event-time window: %s", o.Kind)
	}
}

type downStore struct{ dedupe.Store }

func (downStore) Decide(context.Context, []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	return nil, fmt.Errorf("decide: %w: dial tcp 127.0.0.1:6379: connection refused", dedupe.ErrStoreUnavailable)
}

func TestStoreDownDecidesNothing(t *testing.T) {
	d, err := dedupe.NewDecider(policy(dedupe.Strict), downStore{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := d.Decide(context.Background(), holderHere, []dedupe.Record{{Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(keyA)}}, Value: []byte(body)}}, nil)
	if err == nil {
		t.Fatalf("Decide with the store down = %v, nil; want an error", out)
	}
	for i, o := range out {
		if o.Kind != "" {
			t.Errorf("record %d decided %s with the store down", i, o.Kind)
		}
	}
	if !dedupe.IsRetryable(err) {
		t.Errorf("store outage classified %v, want retryable", dedupe.Classify(err))
	}
}

func TestIntentIsRecorded(t *testing.T) {
	r := newRig(t, policy(dedupe.Strict))
	rec := r.record(keyA, body)
	out, err := r.dec.Decide(context.Background(), holderHere, []dedupe.Record{rec}, func(_ *dedupe.Record, key string) dedupe.Intent {
		return dedupe.Intent{Partition: 4, Floor: 1234}
	})
	if err != nil {
		t.Fatal(err)
	}
	e, ok, _ := r.store.Lookup(context.Background(), "coupon-claim", out[0].Key)
	if !ok || e.Intent != (dedupe.Intent{Partition: 4, Floor: 1234}) {
		t.Errorf("stored intent = %+v, %v", e.Intent, ok)
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want dedupe.Class
	}{
		{fmt.Errorf("x: %w", dedupe.ErrStoreUnavailable), dedupe.Retryable},
		{context.DeadlineExceeded, dedupe.Retryable},
		{fmt.Errorf("x: %w", dedupe.ErrMissingKey), dedupe.Poison},
		{fmt.Errorf("x: %w", dedupe.ErrMalformedPayload), dedupe.Poison},
		{errors.New("bug"), dedupe.Fatal},
		{fmt.Errorf("x: %w", dedupe.ErrFenced), dedupe.Fatal},
	}
	for _, c := range cases {
		if got := dedupe.Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestRecordSource(t *testing.T) {
	long := strings.Repeat("commands.", 12) // longer than Source's buffer
	for _, tc := range []struct {
		rec  dedupe.Record
		want string
	}{
		{dedupe.Record{Topic: "coupon.claim.commands", Partition: 3, Offset: 123456789}, "coupon.claim.commands/3/123456789"},
		{dedupe.Record{Topic: "t", Partition: 0, Offset: 0}, "t/0/0"},
		{dedupe.Record{Topic: long, Partition: 1023, Offset: 1<<63 - 1}, long + "/1023/9223372036854775807"},
	} {
		if got := tc.rec.Source(); got != tc.want {
			t.Errorf("Source() = %q, want %q", got, tc.want)
		}
	}
}
