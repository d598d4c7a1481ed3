package dedupe

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// State is the life-cycle stage of one idempotency key.
type State string

// The three states of the incident's state machine. Two states are not
// enough: "still being handled" and "handled and failed" need different
// answers.
const (
	Pending State = "PENDING"
	Success State = "SUCCESS"
	Failed  State = "FAILED"
)

// Owner identifies who holds a PENDING key. Holder names the worker and the
// partition it processes (instance, group generation, topic/partition);
// Source names the record (topic/partition/offset). The token is both:
// a redelivery of the same record to the same holder resumes its own work,
// while another record of the same key reaching the same holder is decided
// against the pending entry instead of waiting for itself.
type Owner struct {
	Holder string
	Source string
}

// Token is the fencing token checked by every completion write.
func (o Owner) Token() string { return o.Holder + "@" + o.Source }

// NoPosition marks an intent or result position that was not recorded.
const NoPosition int64 = -1

// Intent records where the result of a first record will be written before
// it is written: the output partition and its end offset read beforehand.
// A worker that resumes a PENDING key scans that partition from Floor for a
// record carrying the key before it writes again.
type Intent struct {
	Partition int32
	Floor     int64
}

// ResultRef is where a completed result record landed.
type ResultRef struct {
	Partition int32
	Offset    int64
}

// Entry is the stored state of one key.
type Entry struct {
	Key         string
	State       State
	Fingerprint string
	RulesDigest string
	Owner       Owner
	// FirstSource is the input position of the record that created the
	// entry: the evidence a conflict record carries.
	FirstSource string
	Intent      Intent
	Result      ResultRef
	// WindowStart is on the pipeline's clock (store or event time).
	WindowStart time.Time
	// LeaseUntil and ExpiresAt are on the store's clock.
	LeaseUntil time.Time
	ExpiresAt  time.Time
	// Now is the store's clock when the entry was read, so that a reader
	// can show time left without trusting its own clock.
	Now time.Time
}

// PendingRetention is how long a PENDING entry outlives its lease. A
// PENDING key must not be forgotten while its record may still come back
// (the group stopped, Redis or the output away for longer than the
// window): forgetting it would decide the key first again without looking
// for the result its owner may have written. A day covers any outage an
// operator would resume from rather than re-process.
const PendingRetention = 24 * time.Hour

// RetainUntil is when the store may forget e: ExpiresAt, or for a PENDING
// entry PendingRetention after its lease if that is later.
func (e *Entry) RetainUntil() time.Time {
	if e.State == Pending {
		if t := e.LeaseUntil.Add(PendingRetention); t.After(e.ExpiresAt) {
			return t
		}
	}
	return e.ExpiresAt
}

// DecideRequest asks the store to decide one record.
type DecideRequest struct {
	Namespace   string // the pipeline: keys of different pipelines never meet
	Key         string
	Fingerprint string
	RulesDigest string
	Semantics   Semantics
	Window      time.Duration
	Lease       time.Duration
	Owner       Owner
	Intent      Intent
	// EventTime, when set, runs the window on the record's timestamp
	// (clock: event) instead of the store's clock. Leases always run on
	// the store's clock.
	EventTime time.Time
	// Final asks for a decision even when another holder's lease is still
	// running: the caller has waited pending_timeout already.
	Final bool
	// RenewOnly extends the lease of a PENDING entry that req.Owner holds,
	// and changes nothing otherwise: the answer is VerdictFirst with
	// Resumed when the owner still holds the key, VerdictPending when it
	// does not (taken over, finished, gone). A renewal must never take a
	// key over or create one: the caller is about to write without
	// scanning.
	RenewOnly bool
	// RulesChecked says that the caller read the entry's first copy and
	// found it the same request as this record under the current rules
	// (or found it gone). Until then, under strict semantics, a record
	// whose fingerprint differs from one made under other rules may be
	// answered as a replay, which changes nothing and which the caller
	// checks the same way, but it never reruns a FAILED key nor takes a
	// PENDING one over: those act on the key, and a real conflict must
	// not pass for the same request. It is answered VerdictConflict with
	// RulesChanged and Mismatch instead, for the caller to check.
	RulesChecked bool
}

// Verdict is the store's answer for one record.
type Verdict int

const (
	// VerdictFirst: the caller now owns the key (PENDING) and must produce
	// the one result, then Complete.
	VerdictFirst Verdict = iota + 1
	// VerdictReplay: the key is known and the record is the same request.
	VerdictReplay
	// VerdictConflict: strict semantics, same key, different fingerprint.
	VerdictConflict
	// VerdictPending: another holder's lease is running; wait and ask
	// again (with Final once pending_timeout has passed).
	VerdictPending
)

func (v Verdict) String() string {
	switch v {
	case VerdictFirst:
		return "first"
	case VerdictReplay:
		return "replay"
	case VerdictConflict:
		return "conflict"
	case VerdictPending:
		return "pending"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Decision is the outcome of one DecideRequest.
type Decision struct {
	Verdict Verdict
	// Entry is the state after the decision: the caller's PENDING entry
	// for VerdictFirst, the existing entry otherwise.
	Entry Entry
	// Resumed is set with VerdictFirst when the caller did not create the
	// entry but resumed it (its own redelivered record, or a lease that
	// expired and was taken over). A result may already be in the output
	// partition: scan from Entry.Intent before writing.
	Resumed bool
	// Rerun is set with VerdictFirst when the key was FAILED and the
	// handler runs again.
	Rerun bool
	// Mismatch is set when the fingerprint differs from the stored one.
	// With lenient semantics a replay with Mismatch is a lenient_mismatch.
	Mismatch bool
	// RulesChanged is set when the stored entry was made under other
	// canonicalization rules: a fingerprint mismatch is then not evidence
	// of a conflict, and the record is decided as a replay.
	RulesChanged bool
}

// Completion finishes a key that the caller owns.
type Completion struct {
	Namespace string
	Key       string
	Owner     Owner
	// State is Success or Failed.
	State  State
	Result ResultRef
	// FailedTTL is how long a Failed key is kept (failed_ttl).
	FailedTTL time.Duration
	// KeepAtLeast is how long a Success entry is kept after a completion
	// that came after its window ended (see ApplyCompletion).
	KeepAtLeast time.Duration
}

// Store holds per-key state and decides atomically. Implementations must
// pass the storetest conformance suite.
//
// Decide applies [Apply] to each request in order, atomically per request,
// and returns one Decision per request. Requests for the same key in one
// call are decided in order, each seeing the effect of the previous.
//
// Complete moves PENDING entries owned by the given token to Success (kept
// until the window ends) or Failed (kept FailedTTL), or releases them
// (State Pending: see [ApplyCompletion]). It returns one error per
// completion: nil, or one wrapping ErrFenced when the token no longer owns
// the key (it was taken over, or the entry expired).
//
// Lookup returns the stored entry of a key, and false when there is none.
//
// Every method returns an error wrapping ErrStoreUnavailable when the store
// did not answer; no decision or completion in that call may be assumed.
type Store interface {
	Decide(ctx context.Context, reqs []DecideRequest) ([]Decision, error)
	Complete(ctx context.Context, comps []Completion) ([]error, error)
	Lookup(ctx context.Context, namespace, key string) (Entry, bool, error)
}

// Apply is the reference decision table that every Store implements. It
// returns the decision for req given the stored entry (nil when absent or
// expired) and the store's clock, and the entry to store (nil: unchanged).
//
//	stored                       strict                     lenient / window
//	none, or window over         first                      first
//	SUCCESS, same fingerprint    replay                     replay
//	SUCCESS, other fingerprint   conflict (replay if the    replay (mismatch)
//	                             rules changed)
//	FAILED, its own record       replay                     replay
//	FAILED, same fingerprint     first (rerun)              first (rerun)
//	FAILED, other fingerprint    conflict (rerun if rules   first (rerun)
//	                             changed and RulesChecked)
//	PENDING, own record          first (resumed)            first (resumed)
//	PENDING, own source, other   pending while the lease runs, even when
//	holder                       Final; then first (resumed, new owner)
//	PENDING, same holder         as SUCCESS                 as SUCCESS
//	PENDING, lease running       pending (as SUCCESS when Final)
//	PENDING, lease over          first (resumed, new owner) if the record
//	                             is the same request (RulesChecked when the
//	                             rules changed), else conflict
//
// An entry is forgotten when its window ends (FAILED: when failed_ttl
// ends), with two exceptions that keep a key from being decided first
// twice: a PENDING entry never ends with its window (it is kept until
// [Entry.RetainUntil], and a late record finds it and resumes, scanning
// for a result already written), and a SUCCESS entry answers the record
// that produced it (its owner source) as a replay for as long as it is
// stored, even past the window.
func Apply(cur *Entry, req DecideRequest, now time.Time) (Decision, *Entry) {
	clock := now
	if !req.EventTime.IsZero() {
		clock = req.EventTime
	}
	if req.RenewOnly {
		if cur == nil || cur.State != Pending || cur.Owner != req.Owner || !now.Before(cur.RetainUntil()) {
			d := Decision{Verdict: VerdictPending}
			if cur != nil {
				d.Entry = *cur
			}
			return d, nil
		}
		e := *cur
		e.LeaseUntil = now.Add(req.Lease)
		return Decision{Verdict: VerdictFirst, Resumed: true, Entry: e}, &e
	}
	if cur != nil && expired(cur, req, clock, now) {
		cur = nil
	}
	if cur == nil {
		e := &Entry{
			Key:         req.Key,
			State:       Pending,
			Fingerprint: req.Fingerprint,
			RulesDigest: req.RulesDigest,
			Owner:       req.Owner,
			FirstSource: req.Owner.Source,
			Intent:      req.Intent,
			Result:      ResultRef{Partition: -1, Offset: NoPosition},
			WindowStart: clock,
			LeaseUntil:  now.Add(req.Lease),
			ExpiresAt:   now.Add(req.Window),
		}
		return Decision{Verdict: VerdictFirst, Entry: *e}, e
	}

	d := Decision{Entry: *cur}
	d.RulesChanged = cur.RulesDigest != req.RulesDigest
	d.Mismatch = cur.Fingerprint != req.Fingerprint
	sameRequest := !d.Mismatch || d.RulesChanged || req.Semantics != Strict
	// A rerun or a takeover acts on the key: see RulesChecked.
	sameToAct := !d.Mismatch || req.RulesChecked || req.Semantics != Strict

	switch cur.State {
	case Success:
		d.Verdict = replayOrConflict(sameRequest)
		return d, nil
	case Failed:
		if cur.Owner.Source == req.Owner.Source || cur.FirstSource == req.Owner.Source {
			// The record whose own decision failed, delivered again (a
			// crash before its offset was committed): it has had its one
			// outcome, the dead letter. Running it again could give the
			// same input a result too. (A rerun by another copy that
			// failed too keeps the first copy as FirstSource.)
			d.Verdict = VerdictReplay
			return d, nil
		}
		if !sameToAct {
			d.Verdict = VerdictConflict
			return d, nil
		}
		e := *cur
		e.State = Pending
		e.Fingerprint, e.RulesDigest = req.Fingerprint, req.RulesDigest
		e.Owner = req.Owner
		e.Intent = req.Intent
		e.Result = ResultRef{Partition: -1, Offset: NoPosition}
		e.LeaseUntil = now.Add(req.Lease)
		// A rerun gets the window it would have had as a first copy:
		// the failure did not consume it.
		e.WindowStart = clock
		e.ExpiresAt = now.Add(req.Window)
		d.Verdict, d.Rerun, d.Entry = VerdictFirst, true, e
		return d, &e
	}

	// PENDING.
	switch {
	case cur.Owner == req.Owner:
		e := *cur
		e.LeaseUntil = now.Add(req.Lease)
		d.Verdict, d.Resumed, d.Entry = VerdictFirst, true, e
		return d, &e
	case cur.Owner.Source == req.Owner.Source:
		// The owner's own record, delivered to another holder (the next
		// generation, or another member after a rebalance). Its offset was
		// never committed, and it is the only record left that will give
		// the key its result: it is never a replay. It waits for the lease,
		// Final or not, then takes the key over.
		if now.Before(cur.LeaseUntil) {
			d.Verdict = VerdictPending
			return d, nil
		}
	case cur.Owner.Holder == req.Owner.Holder:
		d.Verdict = replayOrConflict(sameRequest)
		return d, nil
	case now.Before(cur.LeaseUntil):
		if !req.Final {
			d.Verdict = VerdictPending
			return d, nil
		}
		d.Verdict = replayOrConflict(sameRequest)
		return d, nil
	case !sameToAct:
		d.Verdict = VerdictConflict
		return d, nil
	}
	// The lease ran out (or was released): take over, keeping the intent of the previous
	// owner so that the scan starts low enough to find its write.
	e := *cur
	e.Owner = req.Owner
	e.LeaseUntil = now.Add(req.Lease)
	if e.Intent.Floor == NoPosition {
		e.Intent = req.Intent
	}
	d.Verdict, d.Resumed, d.Entry = VerdictFirst, true, e
	return d, &e
}

// expired reports whether cur no longer counts for req (see Apply).
func expired(cur *Entry, req DecideRequest, clock, now time.Time) bool {
	switch cur.State {
	case Pending:
		return !now.Before(cur.RetainUntil())
	case Failed:
		return !now.Before(cur.ExpiresAt)
	}
	if !now.Before(cur.ExpiresAt) {
		return true
	}
	// The records that made a result are replays for as long as it is
	// stored, even past the window.
	own := cur.Owner.Source == req.Owner.Source || cur.FirstSource == req.Owner.Source
	return !clock.Before(cur.WindowStart.Add(req.Window)) && !own
}

func replayOrConflict(sameRequest bool) Verdict {
	if sameRequest {
		return VerdictReplay
	}
	return VerdictConflict
}

// ApplyCompletion is the reference completion rule: only the current owner
// of a PENDING entry may finish it, and finishing it again the same way is
// accepted, so that a retried completion is idempotent.
//
// A PENDING entry is completed by its owner even after its window ended
// (Redis or the output was away for longer than the window): the entry is
// then kept for KeepAtLeast after the completion, so that a redelivery of
// the record that made it is a replay, not a second first.
//
// A completion with State Pending releases the key instead: its lease ends
// now, its intent stays, and the next holder takes it over at once,
// scanning the output for a result before it writes. An owner releases
// only keys for which it has sent no result: after a release it must not
// write one.
func ApplyCompletion(cur *Entry, c Completion, now time.Time) (*Entry, error) {
	if cur == nil || !now.Before(cur.RetainUntil()) {
		return nil, fmt.Errorf("complete %q: %w (entry expired)", c.Key, ErrFenced)
	}
	if cur.State == c.State && cur.Owner == c.Owner && cur.Result == c.Result && c.State != Pending {
		// The same completion again: a retry after a timeout whose first
		// attempt did reach the store, or an abandoned batch asking that
		// an entry it completed be kept longer (its records will be read
		// again): the longer keep is granted, nothing else changes.
		if keep := now.Add(c.KeepAtLeast); c.State == Success && cur.ExpiresAt.Before(keep) {
			e := *cur
			e.ExpiresAt = keep
			return &e, nil
		}
		return cur, nil
	}
	if cur.State != Pending || cur.Owner != c.Owner {
		return nil, fmt.Errorf("complete %q as %s: %w (%s by %s)", c.Key, c.Owner.Token(), ErrFenced, cur.State, cur.Owner.Token())
	}
	e := *cur
	if c.State == Pending {
		if now.Before(e.LeaseUntil) {
			e.LeaseUntil = now
		}
		return &e, nil
	}
	e.State = c.State
	e.Result = c.Result
	e.LeaseUntil = time.Time{}
	if c.State == Failed {
		e.ExpiresAt = now.Add(c.FailedTTL)
	} else if keep := now.Add(c.KeepAtLeast); e.ExpiresAt.Before(keep) {
		e.ExpiresAt = keep
	}
	return &e, nil
}

// DecisionID names the decision that made e: the source of its first copy
// and the start of its window, which a takeover keeps and a new window (or
// a FAILED key's rerun) changes. Every result carries it, so that a
// recovery scan never takes the result of a key's previous window for the
// result of this one.
func (e *Entry) DecisionID() string {
	return e.FirstSource + "@" + strconv.FormatInt(e.WindowStart.UnixMilli(), 10)
}
