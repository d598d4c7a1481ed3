// Package decide holds the reference rules every store applies: the
// decision table (Decide) and the completion rule (Complete). memstore
// applies them as they are; redisstore applies them on its fast path and
// mirrors them in its Lua scripts, and the storetest conformance suite
// holds every store to them. The audit's replay decides with them too.
package decide

import (
	"fmt"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// Decide is the reference decision table that every Store implements. It
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
// [dedupe.Entry.RetainUntil], and a late record finds it and resumes, scanning
// for a result already written), and a SUCCESS entry answers the record
// that produced it (its owner source) as a replay for as long as it is
// stored, even past the window.
func Decide(cur *dedupe.Entry, req dedupe.DecideRequest, now time.Time) (dedupe.Decision, *dedupe.Entry) {
	clock := now
	if !req.EventTime.IsZero() {
		clock = req.EventTime
	}
	if req.RenewOnly {
		if cur == nil || cur.State != dedupe.Pending || cur.Owner != req.Owner || !now.Before(cur.RetainUntil()) {
			d := dedupe.Decision{Verdict: dedupe.VerdictPending}
			if cur != nil {
				d.Entry = *cur
			}
			return d, nil
		}
		e := *cur
		e.LeaseUntil = now.Add(req.Lease)
		return dedupe.Decision{Verdict: dedupe.VerdictFirst, Resumed: true, Entry: e}, &e
	}
	if cur != nil && expired(cur, req, clock, now) {
		cur = nil
	}
	if cur == nil {
		e := NewEntry(req, clock, now)
		return dedupe.Decision{Verdict: dedupe.VerdictFirst, Entry: e}, &e
	}

	d := dedupe.Decision{Entry: *cur}
	d.RulesChanged = cur.RulesDigest != req.RulesDigest
	d.Mismatch = cur.Fingerprint != req.Fingerprint
	sameRequest := !d.Mismatch || d.RulesChanged || req.Semantics != dedupe.Strict
	// A rerun or a takeover acts on the key: see RulesChecked.
	sameToAct := !d.Mismatch || req.RulesChecked || req.Semantics != dedupe.Strict

	switch cur.State {
	case dedupe.Success:
		d.Verdict = replayOrConflict(sameRequest)
		return d, nil
	case dedupe.Failed:
		if cur.Owner.Source == req.Owner.Source || cur.FirstSource == req.Owner.Source {
			// The record whose own decision failed, delivered again (a
			// crash before its offset was committed): it has had its one
			// outcome, the dead letter. Running it again could give the
			// same input a result too. (A rerun by another copy that
			// failed too keeps the first copy as FirstSource.)
			d.Verdict = dedupe.VerdictReplay
			return d, nil
		}
		if !sameToAct {
			d.Verdict = dedupe.VerdictConflict
			return d, nil
		}
		e := *cur
		e.State = dedupe.Pending
		e.Fingerprint, e.RulesDigest = req.Fingerprint, req.RulesDigest
		e.Owner = req.Owner
		e.Intent = req.Intent
		e.Result = dedupe.ResultRef{Partition: -1, Offset: dedupe.NoPosition}
		e.LeaseUntil = now.Add(req.Lease)
		// A rerun gets the window it would have had as a first copy:
		// the failure did not consume it.
		e.WindowStart = clock
		e.ExpiresAt = now.Add(req.Window)
		d.Verdict, d.Rerun, d.Entry = dedupe.VerdictFirst, true, e
		return d, &e
	}

	return decidePending(cur, req, d, now, sameRequest, sameToAct)
}

// decidePending is Decide for a PENDING entry cur: d is the decision so
// far (the entry and its flags), sameRequest and sameToAct Decide's
// judgements of req against cur.
func decidePending(cur *dedupe.Entry, req dedupe.DecideRequest, d dedupe.Decision, now time.Time, sameRequest, sameToAct bool) (dedupe.Decision, *dedupe.Entry) {
	switch {
	case cur.Owner == req.Owner:
		e := *cur
		e.LeaseUntil = now.Add(req.Lease)
		d.Verdict, d.Resumed, d.Entry = dedupe.VerdictFirst, true, e
		return d, &e
	case cur.Owner.Source == req.Owner.Source:
		// The owner's own record, delivered to another holder (the next
		// generation, or another member after a rebalance). Its offset was
		// never committed, and it is the only record left that will give
		// the key its result: it is never a replay. It waits for the lease,
		// Final or not, then takes the key over.
		if now.Before(cur.LeaseUntil) {
			d.Verdict = dedupe.VerdictPending
			return d, nil
		}
	case cur.Owner.Holder == req.Owner.Holder:
		d.Verdict = replayOrConflict(sameRequest)
		return d, nil
	case now.Before(cur.LeaseUntil):
		if !req.Final {
			d.Verdict = dedupe.VerdictPending
			return d, nil
		}
		d.Verdict = replayOrConflict(sameRequest)
		return d, nil
	case !sameToAct:
		d.Verdict = dedupe.VerdictConflict
		return d, nil
	}
	// The lease ran out (or was released): take over, keeping the intent of the previous
	// owner so that the scan starts low enough to find its write.
	e := *cur
	e.Owner = req.Owner
	e.LeaseUntil = now.Add(req.Lease)
	if e.Intent.Floor == dedupe.NoPosition {
		e.Intent = req.Intent
	}
	d.Verdict, d.Resumed, d.Entry = dedupe.VerdictFirst, true, e
	return d, &e
}

// NewEntry is the entry a key gets from its first record req, decided at
// now on the store's clock, its window starting at clock (now, or the
// record's time under clock: event).
func NewEntry(req dedupe.DecideRequest, clock, now time.Time) dedupe.Entry {
	return dedupe.Entry{
		Key:         req.Key,
		State:       dedupe.Pending,
		Fingerprint: req.Fingerprint,
		RulesDigest: req.RulesDigest,
		Owner:       req.Owner,
		FirstSource: req.Owner.Source,
		Intent:      req.Intent,
		Result:      dedupe.ResultRef{Partition: -1, Offset: dedupe.NoPosition},
		WindowStart: clock,
		LeaseUntil:  now.Add(req.Lease),
		ExpiresAt:   now.Add(req.Window),
	}
}

// expired reports whether cur no longer counts for req (see Decide).
func expired(cur *dedupe.Entry, req dedupe.DecideRequest, clock, now time.Time) bool {
	switch cur.State {
	case dedupe.Pending:
		return !now.Before(cur.RetainUntil())
	case dedupe.Failed:
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

func replayOrConflict(sameRequest bool) dedupe.Verdict {
	if sameRequest {
		return dedupe.VerdictReplay
	}
	return dedupe.VerdictConflict
}

// Complete is the reference completion rule: only the current owner
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
//
// The entry comes back by value, *cur when nothing changes: a store
// completes an entry per first copy, and a pointer to a new one would be
// an allocation each.
func Complete(cur *dedupe.Entry, c dedupe.Completion, now time.Time) (dedupe.Entry, error) {
	if cur == nil || !now.Before(cur.RetainUntil()) {
		return dedupe.Entry{}, fmt.Errorf("complete %q: %w (entry expired)", c.Key, dedupe.ErrFenced)
	}
	if cur.State == c.State && cur.Owner == c.Owner && cur.Result == c.Result && c.State != dedupe.Pending {
		// The same completion again: a retry after a timeout whose first
		// attempt did reach the store, or an abandoned batch asking that
		// an entry it completed be kept longer (its records will be read
		// again): the longer keep is granted, nothing else changes.
		e := *cur
		if keep := now.Add(c.KeepAtLeast); c.State == dedupe.Success && cur.ExpiresAt.Before(keep) {
			e.ExpiresAt = keep
		}
		return e, nil
	}
	if cur.State != dedupe.Pending || cur.Owner != c.Owner {
		return dedupe.Entry{}, fmt.Errorf("complete %q as %s: %w (%s by %s)", c.Key, c.Owner.Token(), dedupe.ErrFenced, cur.State, cur.Owner.Token())
	}
	e := *cur
	if c.State == dedupe.Pending {
		if now.Before(e.LeaseUntil) {
			e.LeaseUntil = now
		}
		return e, nil
	}
	e.State = c.State
	e.Result = c.Result
	e.LeaseUntil = time.Time{}
	if c.State == dedupe.Failed {
		e.ExpiresAt = now.Add(c.FailedTTL)
	} else if keep := now.Add(c.KeepAtLeast); e.ExpiresAt.Before(keep) {
		e.ExpiresAt = keep
	}
	return e, nil
}
