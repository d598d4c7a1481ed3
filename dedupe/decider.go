package dedupe

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/idemstream/idemstream/internal/retry"
	"strings"
	"time"
	"unicode/utf8"
)

// OutcomeKind is one of the five outcomes of the product: every input record ends
// in exactly one.
type OutcomeKind string

const (
	OutcomeFirst    OutcomeKind = "first"
	OutcomeReplay   OutcomeKind = "replay"
	OutcomeConflict OutcomeKind = "conflict"
	OutcomeInvalid  OutcomeKind = "invalid"
	// OutcomeFailed is reached after a first, when the handler returns a
	// permanent error. The decider never returns it.
	OutcomeFailed OutcomeKind = "failed"
)

// Outcomes lists the outcomes in the order metrics and reports show them.
var Outcomes = []OutcomeKind{OutcomeFirst, OutcomeReplay, OutcomeConflict, OutcomeInvalid, OutcomeFailed}

// Outcome is the decision about one record.
type Outcome struct {
	Kind OutcomeKind
	// Key is the normalized idempotency key ("" when it could not be read).
	Key string
	// Fingerprint is "" when the payload could not be canonicalized.
	Fingerprint string
	// RulesDigest names the rules the fingerprint was made under (they
	// change under a running decider when a payload's reader schema does).
	RulesDigest string
	// Reason and Err explain an invalid or conflicting record.
	Reason Reason
	Err    error
	// Decision is the store's answer (zero for invalid records).
	Decision Decision
	// LenientMismatch counts a lenient replay whose body differed.
	LenientMismatch bool
}

// IntentFunc tells the decider where the result of a record would be
// written, so that the store records it atomically with PENDING.
type IntentFunc func(rec *Record, key string) Intent

// Decider applies a pipeline's policy to batches of records.
type Decider struct {
	policy Policy
	canon  *Canonicalizer
	store  Store
	field  Pointer
	// wait pauses between polls of a key held elsewhere; tests replace it.
	wait func(ctx context.Context, d time.Duration) error
	now  func() time.Time
}

// DeciderOption configures a Decider.
type DeciderOption func(*Decider)

// WithWaitClock replaces the clock and the pause the decider uses while a
// key is held elsewhere, so that tests control time instead of sleeping.
func WithWaitClock(now func() time.Time, wait func(ctx context.Context, d time.Duration) error) DeciderOption {
	return func(d *Decider) { d.now, d.wait = now, wait }
}

// NewDecider checks the policy and binds it to a store.
func NewDecider(p Policy, s Store, opts ...DeciderOption) (*Decider, error) {
	canon, err := NewCanonicalizer(p.Rules)
	if err != nil {
		return nil, fmt.Errorf("pipeline %q: %w", p.Pipeline, err)
	}
	d := &Decider{policy: p, canon: canon, store: s, wait: retry.Sleep, now: time.Now}
	for _, o := range opts {
		o(d)
	}
	if p.Key.From == KeyFromField {
		if d.field, err = ParsePointer(p.Key.Name); err != nil {
			return nil, fmt.Errorf("pipeline %q: key.name: %w", p.Pipeline, err)
		}
	}
	if p.Window <= 0 || p.PendingTimeout <= 0 || p.FailedTTL <= 0 {
		return nil, fmt.Errorf("pipeline %q: window, pending_timeout and failed_ttl must be positive", p.Pipeline)
	}
	return d, nil
}

// Policy returns the policy the decider applies.
func (d *Decider) Policy() Policy { return d.policy }

// Canonicalizer returns the canonicalizer of the pipeline's rules.
func (d *Decider) Canonicalizer() *Canonicalizer { return d.canon }

// Prepared is a record whose key and fingerprint are known, or whose
// defect is.
type Prepared struct {
	Key         string
	Fingerprint string
	// RulesDigest names the rules Fingerprint was made under.
	RulesDigest string
	// Err is a poison error (see ReasonOf) when the record is invalid.
	Err error
}

// Prepare extracts and validates the key and fingerprints the payload. It
// touches no store. Checks run cheapest first; the fingerprint is still
// computed for an invalid key, as evidence for the dead-letter record.
func (d *Decider) Prepare(rec *Record) Prepared {
	p := d.policy
	if p.MaxPayloadBytes > 0 && len(rec.Value) > p.MaxPayloadBytes {
		return Prepared{Err: fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(rec.Value), p.MaxPayloadBytes)}
	}
	// A payload read through a schema is decoded once: the key field, the
	// fingerprint and the JSON Schema all read its JSON text.
	s := getScratch()
	defer putScratch(s)
	if p.Key.From != KeyFromField && p.Schema == nil {
		// Nothing but the fingerprint reads the decoded payload: a decoder
		// that writes the canonical form itself can skip the JSON text.
		if canon, digest, ok := d.canon.direct(s, rec.Value); ok {
			out := Prepared{RulesDigest: digest, Fingerprint: formatSHA256(sha256.Sum256(canon))}
			out.Key, out.Err = d.extractKey(rec, nil, nil)
			return out
		}
	}
	body, digest, fpErr := d.canon.decodeWithDigest(s, rec.Value)
	if fpErr != nil && Classify(fpErr) != Poison {
		// Not the record's fault (a registry that does not answer, or
		// refuses): no outcome; the caller pauses or stops.
		return Prepared{Err: fpErr}
	}
	out := Prepared{RulesDigest: digest}
	if fpErr == nil {
		out.Fingerprint, fpErr = d.canon.fingerprintText(s, body)
		fpErr = d.canon.withSchema(rec.Value, fpErr)
	}
	if fpErr != nil {
		body = nil
	}
	out.Key, out.Err = d.extractKey(rec, body, fpErr)
	if out.Err != nil {
		return out
	}
	if fpErr != nil {
		out.Err = fpErr
		return out
	}
	if p.Schema != nil {
		if err := p.Schema.ValidatePayload(body); err != nil {
			out.Err = fmt.Errorf("%w: %w", ErrInvalidSchema, err)
		}
	}
	return out
}

// extractKey reads the record's idempotency key; body is the payload's JSON
// text (nil when it could not be read, bodyErr then says why).
func (d *Decider) extractKey(rec *Record, body []byte, bodyErr error) (string, error) {
	spec := d.policy.Key
	var raw string
	switch spec.From {
	case KeyFromMessageKey:
		raw = string(rec.Key)
	case KeyFromField:
		if body == nil && bodyErr != nil && d.canon.dec != nil {
			return "", bodyErr
		}
		if body == nil {
			body = rec.Value
		}
		v, found, err := lookupString(body, d.field)
		if err != nil {
			if errors.Is(err, ErrMalformedPayload) {
				return "", err
			}
			return "", fmt.Errorf("%w: field %s: %w", ErrInvalidKey, spec.Name, err)
		}
		if !found {
			return "", fmt.Errorf("%w: no field %s in the payload", ErrMissingKey, spec.Name)
		}
		raw = v
	default:
		var found bool
		for _, h := range rec.Headers {
			if !strings.EqualFold(h.Key, spec.Name) {
				continue
			}
			if found && raw != string(h.Value) {
				return "", fmt.Errorf("%w: several %s headers with different values", ErrInvalidKey, spec.Name)
			}
			raw, found = string(h.Value), true
		}
	}
	if raw == "" {
		return "", fmt.Errorf("%w: no %s %s", ErrMissingKey, spec.From, spec.Name)
	}
	if spec.MaxLength > 0 && len(raw) > spec.MaxLength {
		return "", fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidKey, len(raw), spec.MaxLength)
	}
	if !utf8.ValidString(raw) {
		return "", fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	}
	return spec.Format.Normalize(raw)
}

// Decide decides a batch of records for one holder (see Owner) and returns
// one Outcome per record, in order. Records whose key another holder owns
// are polled with backoff until the lease ends or pending_timeout passes,
// then decided; a record that is its PENDING entry's own source (its
// owner's batch ended without a result) waits for the lease whatever
// pending_timeout says, because no other record will give the key its
// result.
//
// An error means the store did not answer, or ctx ended: the batch is not
// decided and must be decided again. The outcomes returned with the error
// are those the store gave before it (an empty Kind for the others), so
// that the caller can release the keys it already owns.
func (d *Decider) Decide(ctx context.Context, holder string, recs []Record, intent IntentFunc) ([]Outcome, error) {
	out, _, err := d.decide(ctx, holder, recs, intent, true, false)
	return out, err
}

// DecideAvailable decides, in one store call, every record that the store
// can decide at once, and returns the indexes of those it defers: records
// whose key another holder owns (PENDING under a running lease). Their
// outcomes have an empty Kind; Decide them once the caller has finished
// the others, so that two batches that each hold a key the other waits for
// do not wait each other out.
func (d *Decider) DecideAvailable(ctx context.Context, holder string, recs []Record, intent IntentFunc) (outs []Outcome, deferred []int, err error) {
	return d.decide(ctx, holder, recs, intent, false, false)
}

// NeedsRulesCheck reports whether o is a strict conflict found against an
// entry made under other rules, on a decision that would have acted on
// the key (a FAILED key's rerun, a takeover): the caller reads the entry's
// first copy, fingerprints it under the current rules, and if it is the
// same request (or gone) decides the record again with DecideRulesChecked.
func (d *Decider) NeedsRulesCheck(o *Outcome) bool {
	return o.Kind == OutcomeConflict && o.Decision.RulesChanged && o.Decision.Mismatch && d.policy.Semantics == Strict
}

// SameRequestUnderCurrentRules is the one verdict of a rules check (see
// NeedsRulesCheck), whoever reads the first copy back (the consumer from
// its input topic, the front door from its store): first, the entry's
// first copy, is the same request as o's record under the current rules.
// A first copy gone (found false: retention) is no evidence of a
// conflict, as the documentation promises for rules changes. One that no
// longer reads under the current rules (its schema deleted, a payload the
// old rules took) cannot be shown to be the same request: it stays a
// conflict, which acts on nothing. An error that is not the first copy's
// fault (a schema registry that did not answer, or refused) is returned:
// the caller pauses and checks again, or stops, never guessing. value is
// o's record's payload: it is fingerprinted again when reading the first
// copy moves the reader schema on.
func (d *Decider) SameRequestUnderCurrentRules(o *Outcome, value, first []byte, found bool) (bool, error) {
	if !found {
		return true, nil
	}
	want, wantDigest := o.Fingerprint, o.RulesDigest
	for range 3 {
		fp, digest, err := d.canon.fingerprintWithDigest(first)
		if err != nil && Classify(err) != Poison {
			return false, err
		}
		if digest == wantDigest {
			return err == nil && fp == want, nil
		}
		// Reading the first copy moved the reader schema on (its writer
		// schema is newer than the reader o's record was read with): the
		// record, value, is fingerprinted again, so that both are under
		// the same rules. One the new reader cannot read is no request
		// to compare.
		var rerr error
		if want, wantDigest, rerr = d.canon.fingerprintWithDigest(value); rerr != nil {
			if Classify(rerr) != Poison {
				return false, rerr
			}
			return false, nil
		}
	}
	return false, fmt.Errorf("rules check of %q: %w", o.Key, ErrRulesMoved)
}

// DecideRulesChecked decides recs as Decide (wait) or DecideAvailable does,
// telling the store that each record's first copy is the same request
// under the current rules (DecideRequest.RulesChecked).
func (d *Decider) DecideRulesChecked(ctx context.Context, holder string, recs []Record, intent IntentFunc, wait bool) ([]Outcome, []int, error) {
	return d.decide(ctx, holder, recs, intent, wait, true)
}

// requests prepares every record: the invalid ones get their outcome at
// once, the others a request to the store (reqs, with their indexes in
// idx). An error that is no record's fault decides nothing.
func (d *Decider) requests(holder string, recs []Record, intent IntentFunc, rulesChecked bool) (out []Outcome, reqs []DecideRequest, idx []int, err error) {
	out = make([]Outcome, len(recs))
	reqs = make([]DecideRequest, 0, len(recs))
	idx = make([]int, 0, len(recs))
	for i := range recs {
		rec := &recs[i]
		prep := d.Prepare(rec)
		if prep.Err != nil && Classify(prep.Err) != Poison {
			// A schema registry that did not answer (retryable: the
			// caller pauses and decides the batch again) or refused
			// (fatal: the pipeline stops): nothing is decided.
			return make([]Outcome, len(recs)), nil, nil, prep.Err
		}
		out[i] = Outcome{Key: prep.Key, Fingerprint: prep.Fingerprint, RulesDigest: prep.RulesDigest}
		if prep.Err != nil {
			out[i].Kind, out[i].Reason, out[i].Err = OutcomeInvalid, ReasonOf(prep.Err), prep.Err
			continue
		}
		req := DecideRequest{
			Namespace:    d.policy.Pipeline,
			Key:          prep.Key,
			Fingerprint:  prep.Fingerprint,
			RulesDigest:  prep.RulesDigest,
			Semantics:    d.policy.Semantics,
			Window:       d.policy.Window,
			Lease:        d.policy.Lease(),
			Owner:        Owner{Holder: holder, Source: rec.Source()},
			Intent:       Intent{Partition: -1, Floor: NoPosition},
			RulesChecked: rulesChecked,
		}
		if intent != nil {
			req.Intent = intent(rec, prep.Key)
		}
		if d.policy.Clock == ClockEvent {
			req.EventTime = rec.Time
		}
		reqs = append(reqs, req)
		idx = append(idx, i)
	}
	return out, reqs, idx, nil
}

func (d *Decider) decide(ctx context.Context, holder string, recs []Record, intent IntentFunc, wait, rulesChecked bool) ([]Outcome, []int, error) {
	out, reqs, idx, err := d.requests(holder, recs, intent, rulesChecked)
	if err != nil {
		return out, nil, err
	}
	deadline := d.now().Add(d.policy.PendingTimeout)
	backoff := 25 * time.Millisecond
	final := false
	for len(reqs) > 0 {
		decisions, err := d.store.Decide(ctx, reqs)
		if err != nil {
			return out, nil, err
		}
		if len(decisions) != len(reqs) {
			return out, nil, fmt.Errorf("store answered %d decisions for %d requests", len(decisions), len(reqs))
		}
		waitReqs, waitIdx := reqs[:0], idx[:0]
		var leaseLeft time.Duration
		for j, dec := range decisions {
			if dec.Verdict == VerdictPending {
				waitReqs, waitIdx = append(waitReqs, reqs[j]), append(waitIdx, idx[j])
				if left := dec.Entry.LeaseUntil.Sub(dec.Entry.Now); left > leaseLeft {
					leaseLeft = left
				}
				continue
			}
			d.fill(&out[idx[j]], dec)
		}
		reqs, idx = waitReqs, waitIdx
		if len(reqs) == 0 {
			break
		}
		if !wait {
			return out, append([]int(nil), idx...), nil
		}
		left := deadline.Sub(d.now())
		if left <= 0 && !final {
			final = true
			for j := range reqs {
				reqs[j].Final = true
			}
			continue
		}
		// Back off like a client honouring Retry-After: never past the
		// deadline, never longer than the lease needs. After the deadline
		// only owners' own records are still waiting, for their lease.
		pause := backoff
		if left > 0 {
			pause = min(pause, left)
		}
		if leaseLeft > 0 {
			pause = min(pause, leaseLeft+time.Millisecond)
		}
		if err := d.wait(ctx, pause); err != nil {
			return out, nil, err
		}
		backoff = min(backoff*2, time.Second)
	}
	return out, nil, nil
}

// Renew extends the leases of the first copies that the holder is about to
// write results for, and reports the ones it no longer owns (taken over
// after its lease ran out). The caller must not write a result for a lost
// key: its new owner writes one. After a renewal a full lease remains,
// longer than a write plus its settle time, so no successor can scan the
// output before this holder's write is visible.
func (d *Decider) Renew(ctx context.Context, holder string, recs []*Record, outs []*Outcome) (lost []bool, err error) {
	reqs := make([]DecideRequest, len(recs))
	for i, rec := range recs {
		o := outs[i]
		digest := o.RulesDigest
		if digest == "" {
			digest = d.canon.RulesDigest()
		}
		reqs[i] = DecideRequest{
			Namespace:   d.policy.Pipeline,
			Key:         o.Key,
			Fingerprint: o.Fingerprint,
			RulesDigest: digest,
			Semantics:   d.policy.Semantics,
			Window:      d.policy.Window,
			Lease:       d.policy.Lease(),
			Owner:       Owner{Holder: holder, Source: rec.Source()},
			Intent:      o.Decision.Entry.Intent,
			RenewOnly:   true,
		}
		if d.policy.Clock == ClockEvent {
			reqs[i].EventTime = rec.Time
		}
	}
	decs, err := d.store.Decide(ctx, reqs)
	if err != nil {
		return nil, err
	}
	lost = make([]bool, len(decs))
	for i, dec := range decs {
		// Only the same owner token resumes its own PENDING entry.
		lost[i] = dec.Verdict != VerdictFirst || !dec.Resumed
	}
	return lost, nil
}

func (d *Decider) fill(o *Outcome, dec Decision) {
	o.Decision = dec
	switch dec.Verdict {
	case VerdictFirst:
		o.Kind = OutcomeFirst
	case VerdictReplay:
		o.Kind = OutcomeReplay
		o.LenientMismatch = dec.Mismatch && !dec.RulesChanged && d.policy.Semantics == Lenient
	case VerdictConflict:
		o.Kind, o.Reason = OutcomeConflict, ReasonConflict
		o.Err = fmt.Errorf("idempotency key reused with a different payload: fingerprint %s, first seen as %s at %s",
			o.Fingerprint, dec.Entry.Fingerprint, dec.Entry.FirstSource)
	}
}
