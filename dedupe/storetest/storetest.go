// Package storetest is the conformance suite of dedupe.Store. Every Store
// implementation runs it from its own tests, so that the memory store the
// unit tests use and the Redis store production uses cannot drift apart:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness {
//			clock := storetest.NewManualClock()
//			return storetest.Harness{Store: memstore.New(memstore.WithClock(clock.Now)), Advance: clock.Advance, Simulated: true}
//		})
//	}
//
// The suite uses windows of about a second, so a store on a real clock can
// implement Advance by sleeping.
package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// Harness is one fresh, empty store and the means to move its clock.
type Harness struct {
	Store dedupe.Store
	// Advance moves the store's clock forward by at least d.
	Advance func(d time.Duration)
	// Simulated says Advance costs no real time (a manual clock): the
	// cases that move the clock by a day run only then.
	Simulated bool
}

// ManualClock is a clock that moves only when told.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock starts at a fixed instant.
func NewManualClock() *ManualClock {
	return &ManualClock{now: time.Date(2026, 6, 18, 0, 0, 0, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

const (
	window = 1200 * time.Millisecond
	lease  = 400 * time.Millisecond
	// slack keeps a step clear of a boundary on stores with real clocks.
	slack = 150 * time.Millisecond
)

var (
	holderA = "instance-a/gen-1/commands/0"
	holderB = "instance-b/gen-1/commands/1"
)

// Fingerprints and rules digests as the pipeline makes them, so that a
// store that keeps them in binary is held to giving them back.
var (
	fpA, fpB, fpOther = digest("a"), digest("b"), digest("other")
	rules1, rules2    = digest("rules-1"), digest("rules-2")
)

// SourceTopics and RulesDigests are the topics of the suite's records and
// the rules digests of its requests, for a store that keeps only hashes
// of them and must be told them to give them back from Lookup.
var (
	SourceTopics = []string{"commands"}
	RulesDigests = []string{rules1, rules2}
)

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// sameOwner reports whether e is owned by o: a store may keep a finished
// entry's holder as its dedupe.HolderDigest.
func sameOwner(e dedupe.Entry, o dedupe.Owner) bool {
	if e.Owner == o {
		return true
	}
	return e.State != dedupe.Pending && e.Owner.Source == o.Source && e.Owner.Holder == dedupe.HolderDigest(o.Holder)
}

func req(key, fp string, sem dedupe.Semantics, holder, source string) dedupe.DecideRequest {
	return dedupe.DecideRequest{
		Namespace:   "conformance",
		Key:         key,
		Fingerprint: fp,
		RulesDigest: rules1,
		Semantics:   sem,
		Window:      window,
		Lease:       lease,
		Owner:       dedupe.Owner{Holder: holder, Source: source},
		Intent:      dedupe.Intent{Partition: 2, Floor: 100},
	}
}

func complete(r dedupe.DecideRequest, st dedupe.State, offset int64) dedupe.Completion {
	return dedupe.Completion{
		Namespace: r.Namespace, Key: r.Key, Owner: r.Owner, State: st,
		Result:    dedupe.ResultRef{Partition: r.Intent.Partition, Offset: offset},
		FailedTTL: window,
	}
}

// Run runs the whole suite; newHarness is called once per subtest. Every
// case runs twice: with each completion alone in its call, and with each
// completion first in a call of batchedCompletions (the others complete
// keys that were never decided, and must be fenced), since a store may
// finish small and large calls in different ways.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, batched := range []bool{false, true} {
		for _, tc := range cases {
			name := tc.name
			if batched {
				name += "/InABatch"
			}
			t.Run(name, func(t *testing.T) {
				h := newHarness(t)
				tc.run(t, h, &driver{t: t, h: h, batched: batched})
			})
		}
	}
}

// batchedCompletions is the size of a call in the batched run of a case.
const batchedCompletions = 40

type driver struct {
	t       *testing.T
	h       Harness
	batched bool
}

func (d *driver) decide(reqs ...dedupe.DecideRequest) []dedupe.Decision {
	d.t.Helper()
	out, err := d.h.Store.Decide(context.Background(), reqs)
	if err != nil {
		d.t.Fatalf("Decide: %v", err)
	}
	if len(out) != len(reqs) {
		d.t.Fatalf("Decide returned %d decisions for %d requests", len(out), len(reqs))
	}
	return out
}

func (d *driver) one(r dedupe.DecideRequest, want dedupe.Verdict) dedupe.Decision {
	d.t.Helper()
	dec := d.decide(r)[0]
	if dec.Verdict != want {
		d.t.Fatalf("decide %s (%s, fp %s, owner %s): verdict %v, want %v (entry %+v)",
			r.Key, r.Semantics, r.Fingerprint, r.Owner.Token(), dec.Verdict, want, dec.Entry)
	}
	return dec
}

func (d *driver) complete(c dedupe.Completion) error {
	d.t.Helper()
	comps := []dedupe.Completion{c}
	if d.batched {
		for i := 1; i < batchedCompletions; i++ {
			f := c
			f.Key = fmt.Sprintf("never-decided-%d", i)
			comps = append(comps, f)
		}
	}
	errs, err := d.h.Store.Complete(context.Background(), comps)
	if err != nil {
		d.t.Fatalf("Complete: %v", err)
	}
	if len(errs) != len(comps) {
		d.t.Fatalf("Complete returned %d errors for %d completions", len(errs), len(comps))
	}
	for i, err := range errs[1:] {
		if !errors.Is(err, dedupe.ErrFenced) {
			d.t.Fatalf("completion %d of a key never decided: %v, want ErrFenced", i+1, err)
		}
	}
	return errs[0]
}

func (d *driver) mustComplete(c dedupe.Completion) {
	d.t.Helper()
	if err := d.complete(c); err != nil {
		d.t.Fatalf("complete %s by %s: %v", c.Key, c.Owner.Token(), err)
	}
}

func (d *driver) lookup(key string) (dedupe.Entry, bool) {
	d.t.Helper()
	e, ok, err := d.h.Store.Lookup(context.Background(), "conformance", key)
	if err != nil {
		d.t.Fatalf("Lookup: %v", err)
	}
	return e, ok
}

type testCase struct {
	name string
	run  func(t *testing.T, h Harness, d *driver)
}

var cases = []testCase{
	{"FirstCreatesPendingWithIntent", func(t *testing.T, h Harness, d *driver) {
		r := req("k1", fpA, dedupe.Strict, holderA, "commands/0/10")
		dec := d.one(r, dedupe.VerdictFirst)
		if dec.Resumed || dec.Rerun || dec.Mismatch || dec.RulesChanged {
			t.Errorf("fresh first carries flags: %+v", dec)
		}
		e, ok := d.lookup("k1")
		if !ok {
			t.Fatal("no entry after first")
		}
		if e.State != dedupe.Pending || e.Fingerprint != fpA || e.RulesDigest != rules1 ||
			e.Owner != r.Owner || e.FirstSource != "commands/0/10" || e.Intent != r.Intent {
			t.Errorf("stored entry = %+v", e)
		}
		// Measured from the decision's clock, not the lookup's: on a
		// loaded machine a replica's acknowledgement and the lookup can
		// take longer than the lease.
		if left := e.LeaseUntil.Sub(dec.Entry.Now); left <= 0 || left > lease {
			t.Errorf("lease of %v from the decision, want within (0, %v]", left, lease)
		}
		if left := e.ExpiresAt.Sub(dec.Entry.Now); left <= lease || left > window {
			t.Errorf("window of %v from the decision, want within (%v, %v]", left, lease, window)
		}
	}},
	{"CompleteStoresResultAndReplays", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Success, 777))
		e, _ := d.lookup("k")
		if e.State != dedupe.Success || e.Result != (dedupe.ResultRef{Partition: 2, Offset: 777}) {
			t.Errorf("after complete: %+v", e)
		}
		dec := d.one(req("k", fpA, dedupe.Strict, holderB, "commands/1/5"), dedupe.VerdictReplay)
		if dec.Mismatch || dec.Entry.Result.Offset != 777 || dec.Entry.FirstSource != "commands/0/10" {
			t.Errorf("replay decision = %+v", dec)
		}
		// A finished entry keeps its intent: the front door names a kept
		// answer by it.
		if dec.Entry.Intent != r.Intent {
			t.Errorf("the finished entry's intent is %+v, was %+v", dec.Entry.Intent, r.Intent)
		}
		// An intent of any floor (the front door's are random attempts
		// of 63 bits), on another partition than its result.
		far := req("far", fpA, dedupe.Strict, holderA, "commands/0/11")
		far.Intent = dedupe.Intent{Partition: 5, Floor: 1<<62 + 12345}
		d.one(far, dedupe.VerdictFirst)
		d.mustComplete(complete(far, dedupe.Failed, dedupe.NoPosition))
		if e, _ := d.lookup("far"); e.State != dedupe.Failed || e.Intent != far.Intent {
			t.Errorf("after a FAILED completion: %+v, want intent %+v", e, far.Intent)
		}
	}},
	{"StrictConflictLeavesStateUnchanged", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Success, 1))
		dec := d.one(req("k", fpB, dedupe.Strict, holderB, "commands/1/5"), dedupe.VerdictConflict)
		if !dec.Mismatch || dec.Entry.Fingerprint != fpA || dec.Entry.FirstSource != "commands/0/10" {
			t.Errorf("conflict evidence = %+v", dec)
		}
		e, _ := d.lookup("k")
		if e.Fingerprint != fpA || e.State != dedupe.Success {
			t.Errorf("conflict changed state: %+v", e)
		}
	}},
	{"LenientMismatchIsReplay", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Lenient, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Success, 1))
		dec := d.one(req("k", fpB, dedupe.Lenient, holderB, "commands/1/5"), dedupe.VerdictReplay)
		if !dec.Mismatch {
			t.Error("lenient replay of another body not marked as mismatch")
		}
	}},
	{"WindowEndsAndKeyIsNewAgain", func(t *testing.T, h Harness, d *driver) {
		for _, sem := range []dedupe.Semantics{dedupe.Strict, dedupe.Lenient, dedupe.Window} {
			key := "k-" + string(sem)
			r := req(key, fpA, sem, holderA, "commands/0/10")
			d.one(r, dedupe.VerdictFirst)
			d.mustComplete(complete(r, dedupe.Success, 1))
			d.one(req(key, fpB, sem, holderB, "commands/1/5"), map[dedupe.Semantics]dedupe.Verdict{
				dedupe.Strict: dedupe.VerdictConflict, dedupe.Lenient: dedupe.VerdictReplay, dedupe.Window: dedupe.VerdictReplay,
			}[sem])
		}
		h.Advance(window + slack)
		for _, sem := range []dedupe.Semantics{dedupe.Strict, dedupe.Lenient, dedupe.Window} {
			dec := d.one(req("k-"+string(sem), fpB, sem, holderB, "commands/1/6"), dedupe.VerdictFirst)
			if dec.Resumed || dec.Rerun {
				t.Errorf("%s: a key past its window is new, got %+v", sem, dec)
			}
		}
	}},
	{"RulesChangedIsReplayNotConflict", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Success, 1))
		r2 := req("k", fpB, dedupe.Strict, holderB, "commands/1/5")
		r2.RulesDigest = rules2
		dec := d.one(r2, dedupe.VerdictReplay)
		if !dec.RulesChanged {
			t.Error("replay under changed rules not flagged RulesChanged")
		}
	}},
	{"FailedReruns", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Failed, dedupe.NoPosition))
		if e, _ := d.lookup("k"); e.State != dedupe.Failed {
			t.Fatalf("state after failure = %s", e.State)
		}
		d.one(req("k", fpOther, dedupe.Strict, holderB, "commands/1/5"), dedupe.VerdictConflict)
		r2 := req("k", fpA, dedupe.Strict, holderB, "commands/1/6")
		dec := d.one(r2, dedupe.VerdictFirst)
		if !dec.Rerun || dec.Entry.Owner != r2.Owner {
			t.Errorf("rerun decision = %+v", dec)
		}
		d.mustComplete(complete(r2, dedupe.Success, 9))
		d.one(req("k", fpA, dedupe.Strict, holderA, "commands/0/11"), dedupe.VerdictReplay)
	}},
	{"FailedLenientRerunsAnyBody", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Lenient, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Failed, dedupe.NoPosition))
		dec := d.one(req("k", fpB, dedupe.Lenient, holderB, "commands/1/5"), dedupe.VerdictFirst)
		if !dec.Rerun || dec.Entry.Fingerprint != fpB {
			t.Errorf("lenient rerun = %+v", dec)
		}
	}},
	{"FailedExpiresAfterTTL", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		c := complete(r, dedupe.Failed, dedupe.NoPosition)
		c.FailedTTL = lease
		d.mustComplete(c)
		h.Advance(lease + slack)
		if _, ok := d.lookup("k"); ok {
			t.Error("failed entry still stored after failed_ttl")
		}
		dec := d.one(req("k", fpB, dedupe.Strict, holderB, "commands/1/5"), dedupe.VerdictFirst)
		if dec.Rerun {
			t.Error("a key past failed_ttl is new, not a rerun")
		}
	}},
	{"PendingElsewhereWaitsThenDecides", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		other := req("k", fpA, dedupe.Strict, holderB, "commands/1/5")
		dec := d.one(other, dedupe.VerdictPending)
		if left := dec.Entry.LeaseUntil.Sub(dec.Entry.Now); left <= 0 {
			t.Errorf("pending decision shows no lease left: %v", left)
		}
		other.Final = true
		d.one(other, dedupe.VerdictReplay)
		bad := req("k", fpB, dedupe.Strict, holderB, "commands/1/6")
		bad.Final = true
		d.one(bad, dedupe.VerdictConflict)
		if e, _ := d.lookup("k"); e.Owner != r.Owner || e.State != dedupe.Pending {
			t.Errorf("waiters changed the owner's entry: %+v", e)
		}
	}},
	{"SameHolderDecidesAgainstItsOwnPending", func(t *testing.T, h Harness, d *driver) {
		decs := d.decide(
			req("k", fpA, dedupe.Strict, holderA, "commands/0/10"),
			req("k", fpA, dedupe.Strict, holderA, "commands/0/11"),
			req("k", fpB, dedupe.Strict, holderA, "commands/0/12"),
		)
		want := []dedupe.Verdict{dedupe.VerdictFirst, dedupe.VerdictReplay, dedupe.VerdictConflict}
		for i, w := range want {
			if decs[i].Verdict != w {
				t.Errorf("batch[%d] = %v, want %v", i, decs[i].Verdict, w)
			}
		}
	}},
	{"RedeliveryToSameOwnerResumes", func(t *testing.T, h Harness, d *driver) {
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		again := r
		again.Intent = dedupe.Intent{Partition: 2, Floor: 150}
		dec := d.one(again, dedupe.VerdictFirst)
		if !dec.Resumed || dec.Entry.Intent.Floor != 100 {
			t.Errorf("resume = %+v, want Resumed with the first intent (floor 100)", dec)
		}
	}},
	{"ExpiredLeaseIsTakenOverAndOldOwnerFenced", func(t *testing.T, h Harness, d *driver) {
		old := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(old, dedupe.VerdictFirst)
		h.Advance(lease + slack)
		taker := req("k", fpA, dedupe.Strict, holderB, "commands/1/5")
		taker.Intent = dedupe.Intent{Partition: 2, Floor: 300}
		dec := d.one(taker, dedupe.VerdictFirst)
		if !dec.Resumed || dec.Entry.Owner != taker.Owner || dec.Entry.Intent.Floor != 100 ||
			dec.Entry.FirstSource != "commands/0/10" {
			t.Errorf("takeover = %+v, want Resumed, new owner, intent floor kept at 100", dec)
		}
		err := d.complete(complete(old, dedupe.Success, 1))
		if !errors.Is(err, dedupe.ErrFenced) {
			t.Errorf("stale owner's completion: %v, want ErrFenced", err)
		}
		d.mustComplete(complete(taker, dedupe.Success, 2))
		if e, _ := d.lookup("k"); e.Result.Offset != 2 || !sameOwner(e, taker.Owner) {
			t.Errorf("after takeover completion: %+v", e)
		}
		if err := d.complete(complete(taker, dedupe.Success, 3)); !errors.Is(err, dedupe.ErrFenced) {
			t.Errorf("a completion that contradicts the finished one: %v, want ErrFenced", err)
		}
		if err := d.complete(complete(taker, dedupe.Success, 2)); err != nil {
			t.Errorf("the same completion again (a retry after a timeout): %v, want accepted", err)
		}
	}},
	{"OwnRecordAtAnotherHolderWaitsForTheLease", func(t *testing.T, h Harness, d *driver) {
		// The owner's batch ended without a result (a rebalance, a crash)
		// and its record reaches the next holder: it must not be a replay,
		// even once the waiter has given up (Final), or the key never gets
		// a result.
		old := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(old, dedupe.VerdictFirst)
		next := req("k", fpA, dedupe.Strict, holderB, "commands/0/10")
		next.Intent = dedupe.Intent{Partition: 2, Floor: 300}
		d.one(next, dedupe.VerdictPending)
		next.Final = true
		d.one(next, dedupe.VerdictPending)
		h.Advance(lease + slack)
		dec := d.one(next, dedupe.VerdictFirst)
		if !dec.Resumed || dec.Entry.Owner != next.Owner || dec.Entry.Intent.Floor != 100 {
			t.Errorf("own record after the lease = %+v, want Resumed by the new holder, intent floor kept at 100", dec)
		}
	}},
	{"ReleasedKeyIsTakenOverAtOnce", func(t *testing.T, h Harness, d *driver) {
		old := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(old, dedupe.VerdictFirst)
		stranger := req("k", fpA, dedupe.Strict, holderB, "commands/1/5")
		rel := complete(stranger, dedupe.Pending, dedupe.NoPosition)
		if err := d.complete(rel); !errors.Is(err, dedupe.ErrFenced) {
			t.Errorf("release by a holder that does not own the key: %v, want ErrFenced", err)
		}
		d.mustComplete(complete(old, dedupe.Pending, dedupe.NoPosition))
		e, ok := d.lookup("k")
		if !ok || e.State != dedupe.Pending || e.LeaseUntil.After(e.Now) || e.Intent.Floor != 100 {
			t.Fatalf("after release: %+v (found %v), want PENDING, lease over, intent kept", e, ok)
		}
		next := req("k", fpA, dedupe.Strict, holderB, "commands/0/10")
		dec := d.one(next, dedupe.VerdictFirst)
		if !dec.Resumed || dec.Entry.Owner != next.Owner {
			t.Errorf("after release = %+v, want Resumed by the next holder at once", dec)
		}
		if err := d.complete(complete(old, dedupe.Success, 1)); !errors.Is(err, dedupe.ErrFenced) {
			t.Errorf("completion by the holder that released the key: %v, want ErrFenced", err)
		}
	}},
	{"PendingOutlivesItsWindow", func(t *testing.T, h Harness, d *driver) {
		// Redis or the output was away for longer than the window: the
		// owner still completes, and its own record is then a replay.
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		h.Advance(window + slack)
		if e, ok := d.lookup("k"); !ok || e.State != dedupe.Pending {
			t.Fatalf("PENDING entry past its window: %+v (found %v), want kept", e, ok)
		}
		c := complete(r, dedupe.Success, 5)
		c.KeepAtLeast = window
		d.mustComplete(c)
		again := req("k", fpA, dedupe.Strict, holderB, "commands/0/10")
		d.one(again, dedupe.VerdictReplay)
		d.one(req("k", fpA, dedupe.Strict, holderB, "commands/1/6"), dedupe.VerdictFirst)
	}},
	{"PendingIsForgottenADayAfterItsLease", func(t *testing.T, h Harness, d *driver) {
		// dedupe.PendingRetention: a PENDING entry outlives its lease by
		// a day, and no longer (consumer/doc.go, "Assumptions").
		if !h.Simulated {
			t.Skip("the store's clock is real: a day cannot pass here")
		}
		d.one(req("k", fpA, dedupe.Strict, holderA, "commands/0/10"), dedupe.VerdictFirst)
		h.Advance(lease + dedupe.PendingRetention - slack)
		if e, ok := d.lookup("k"); !ok || e.State != dedupe.Pending {
			t.Fatalf("PENDING entry just under a day past its lease: %+v (found %v), want kept", e, ok)
		}
		h.Advance(2 * slack)
		if e, ok := d.lookup("k"); ok {
			t.Fatalf("PENDING entry a day past its lease: %+v, want forgotten", e)
		}
		dec := d.one(req("k", fpA, dedupe.Strict, holderB, "commands/1/5"), dedupe.VerdictFirst)
		if dec.Resumed {
			t.Errorf("a key forgotten a day after its lease = %+v, want new, not resumed", dec)
		}
	}},
	{"CompletionAgainMayKeepLonger", func(t *testing.T, h Harness, d *driver) {
		// An abandoned batch completes again, asking for a longer keep,
		// a key it completed before: granted, nothing else changes.
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		c := complete(r, dedupe.Success, 5)
		c.KeepAtLeast = window
		d.mustComplete(c)
		c.KeepAtLeast = dedupe.PendingRetention
		d.mustComplete(c)
		e, ok := d.lookup("k")
		if !ok || e.State != dedupe.Success || e.Result.Offset != 5 || e.ExpiresAt.Sub(e.Now) < dedupe.PendingRetention-time.Minute {
			t.Errorf("after the longer completion: %+v (found %v), want SUCCESS at 5 kept a day", e, ok)
		}
	}},
	{"FailedOwnRecordIsAReplay", func(t *testing.T, h Harness, d *driver) {
		// The record whose decision failed, delivered again before its
		// offset was committed, has had its outcome (the dead letter).
		a := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(a, dedupe.VerdictFirst)
		d.mustComplete(complete(a, dedupe.Failed, -1))
		d.one(req("k", fpA, dedupe.Strict, holderB, "commands/0/10"), dedupe.VerdictReplay)
		b := req("k", fpA, dedupe.Strict, holderB, "commands/1/5")
		if dec := d.one(b, dedupe.VerdictFirst); !dec.Rerun {
			t.Errorf("another copy of a FAILED key = %+v, want a rerun", dec)
		}
		// The rerun fails too: the first copy, delivered again, is still
		// a replay.
		d.mustComplete(complete(b, dedupe.Failed, -1))
		d.one(req("k", fpA, dedupe.Strict, holderB, "commands/0/10"), dedupe.VerdictReplay)
	}},
	{"RulesChangeActsOnlyOnceChecked", func(t *testing.T, h Harness, d *driver) {
		// Under changed rules a mismatch may be a replay (the caller
		// checks it), but it reruns a FAILED key or takes a PENDING one
		// over only once the caller has checked the first copy.
		newRules := func(r dedupe.DecideRequest, checked bool) dedupe.DecideRequest {
			r.RulesDigest, r.RulesChecked = rules2, checked
			return r
		}
		failed := req("f", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(failed, dedupe.VerdictFirst)
		d.mustComplete(complete(failed, dedupe.Failed, -1))
		if dec := d.one(newRules(req("f", fpB, dedupe.Strict, holderB, "commands/1/5"), false), dedupe.VerdictConflict); !dec.RulesChanged || !dec.Mismatch {
			t.Errorf("unchecked rerun under new rules = %+v, want a conflict flagged RulesChanged and Mismatch", dec)
		}
		if dec := d.one(newRules(req("f", fpB, dedupe.Strict, holderB, "commands/1/5"), true), dedupe.VerdictFirst); !dec.Rerun {
			t.Errorf("checked rerun under new rules = %+v, want a rerun", dec)
		}

		pending := req("p", fpA, dedupe.Strict, holderA, "commands/0/11")
		d.one(pending, dedupe.VerdictFirst)
		h.Advance(lease + slack)
		d.one(newRules(req("p", fpB, dedupe.Strict, holderB, "commands/1/6"), false), dedupe.VerdictConflict)
		if dec := d.one(newRules(req("p", fpB, dedupe.Strict, holderB, "commands/1/6"), true), dedupe.VerdictFirst); !dec.Resumed {
			t.Errorf("checked takeover under new rules = %+v, want resumed", dec)
		}

		done := req("s", fpA, dedupe.Strict, holderA, "commands/0/12")
		d.one(done, dedupe.VerdictFirst)
		d.mustComplete(complete(done, dedupe.Success, 7))
		if dec := d.one(newRules(req("s", fpB, dedupe.Strict, holderB, "commands/1/7"), false), dedupe.VerdictReplay); !dec.RulesChanged {
			t.Errorf("a mismatch under new rules on SUCCESS = %+v, want a replay flagged RulesChanged", dec)
		}
	}},
	{"PendingPastItsWindowIsResumedNotNew", func(t *testing.T, h Harness, d *driver) {
		d.one(req("k", fpA, dedupe.Strict, holderA, "commands/0/10"), dedupe.VerdictFirst)
		h.Advance(window + slack)
		taker := req("k", fpA, dedupe.Strict, holderB, "commands/1/5")
		taker.Intent = dedupe.Intent{Partition: 2, Floor: 300}
		dec := d.one(taker, dedupe.VerdictFirst)
		if !dec.Resumed || dec.Entry.Intent.Floor != 100 {
			t.Errorf("PENDING past its window = %+v, want Resumed with the old intent (a result may exist)", dec)
		}
	}},
	{"RenewalNeverTakesOverNorCreates", func(t *testing.T, h Harness, d *driver) {
		renew := func(r dedupe.DecideRequest) dedupe.DecideRequest { r.RenewOnly = true; return r }
		a := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(a, dedupe.VerdictFirst)
		if dec := d.one(renew(a), dedupe.VerdictFirst); !dec.Resumed {
			t.Errorf("owner's renewal = %+v, want Resumed", dec)
		}
		h.Advance(lease + slack)
		b := req("k", fpA, dedupe.Strict, holderB, "commands/1/5")
		d.one(b, dedupe.VerdictFirst)
		// The old owner wakes up and renews: lost, and the entry stays B's.
		d.one(renew(a), dedupe.VerdictPending)
		if e, _ := d.lookup("k"); !sameOwner(e, b.Owner) {
			t.Errorf("a stale renewal changed the owner: %+v", e)
		}
		d.one(renew(req("absent", fpA, dedupe.Strict, holderA, "commands/0/11")), dedupe.VerdictPending)
		if _, ok := d.lookup("absent"); ok {
			t.Error("a renewal created an entry")
		}
		f := req("f", fpA, dedupe.Strict, holderA, "commands/0/12")
		d.one(f, dedupe.VerdictFirst)
		d.mustComplete(complete(f, dedupe.Failed, dedupe.NoPosition))
		d.one(renew(f), dedupe.VerdictPending)
		if e, _ := d.lookup("f"); e.State != dedupe.Failed {
			t.Errorf("a renewal changed a FAILED entry: %+v", e)
		}
	}},
	{"ExpiredLeaseWithOtherBodyIsConflict", func(t *testing.T, h Harness, d *driver) {
		d.one(req("k", fpA, dedupe.Strict, holderA, "commands/0/10"), dedupe.VerdictFirst)
		h.Advance(lease + slack)
		d.one(req("k", fpB, dedupe.Strict, holderB, "commands/1/5"), dedupe.VerdictConflict)
	}},
	{"CompleteWithoutEntryIsFenced", func(t *testing.T, h Harness, d *driver) {
		r := req("ghost", fpA, dedupe.Strict, holderA, "commands/0/10")
		if err := d.complete(complete(r, dedupe.Success, 1)); !errors.Is(err, dedupe.ErrFenced) {
			t.Errorf("completion of an unknown key: %v, want ErrFenced", err)
		}
		if _, ok := d.lookup("ghost"); ok {
			t.Error("a refused completion created an entry")
		}
	}},
	{"CompleteRefusesAnUnknownState", func(t *testing.T, h Harness, d *driver) {
		// Written, such a state would be an entry no reader takes: the
		// whole call is refused before anything changes.
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		d.one(r, dedupe.VerdictFirst)
		ok := complete(req("other", fpA, dedupe.Strict, holderA, "commands/0/11"), dedupe.Success, 2)
		d.one(req("other", fpA, dedupe.Strict, holderA, "commands/0/11"), dedupe.VerdictFirst)
		for _, st := range []dedupe.State{"DONE", "success", ""} {
			errs, err := h.Store.Complete(context.Background(), []dedupe.Completion{ok, complete(r, st, 1)})
			if err == nil || dedupe.IsRetryable(err) || !strings.Contains(err.Error(), "none of") {
				t.Errorf("completion as %q: %v, %v; want a fatal error naming the states", st, errs, err)
			}
		}
		for _, key := range []string{"k", "other"} {
			if e, found := d.lookup(key); !found || e.State != dedupe.Pending {
				t.Errorf("%s after the refused calls: %+v (found %v), want it PENDING", key, e, found)
			}
		}
	}},
	{"NamespacesAreIsolated", func(t *testing.T, h Harness, d *driver) {
		a := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		b := a
		b.Namespace = "other-pipeline"
		b.Fingerprint = fpB
		d.one(a, dedupe.VerdictFirst)
		d.one(b, dedupe.VerdictFirst)
	}},
	{"KeysAreOpaqueBytes", func(t *testing.T, h Harness, d *driver) {
		keys := []string{"a:b", "{tag}", "ключ-ü", "9F8A2C1D", "9f8a2c1d", string(make([]byte, 300))}
		for i, k := range keys {
			d.one(req(k, fpA, dedupe.Strict, holderA, fmt.Sprintf("commands/0/%d", i)), dedupe.VerdictFirst)
		}
		for _, k := range keys {
			if e, ok := d.lookup(k); !ok || e.Key != k {
				t.Errorf("lookup %q = %+v, %v", k, e.Key, ok)
			}
		}
	}},
	{"EventClockWindow", func(t *testing.T, h Harness, d *driver) {
		at := time.Date(2026, 6, 18, 10, 0, 0, 0, time.UTC)
		r := req("k", fpA, dedupe.Window, holderA, "commands/0/10")
		r.EventTime = at
		d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Success, 1))
		inside := req("k", fpA, dedupe.Window, holderB, "commands/1/5")
		inside.EventTime = at.Add(window - slack)
		d.one(inside, dedupe.VerdictReplay)
		after := inside
		after.EventTime = at.Add(window)
		d.one(after, dedupe.VerdictFirst)
	}},
	{"FarEventTimeIsResumedAsStored", func(t *testing.T, h Harness, d *driver) {
		// A producer that stamps nanoseconds as milliseconds: the window
		// start that the decision gives (and a result's header carries)
		// must be the one stored, or the next holder's resumed batch would
		// not recognise the result its owner wrote.
		r := req("k", fpA, dedupe.Strict, holderA, "commands/0/10")
		r.EventTime = time.UnixMilli(1764957600123456789)
		first := d.one(r, dedupe.VerdictFirst)
		if e, ok := d.lookup("k"); !ok || e.DecisionID() != first.Entry.DecisionID() {
			t.Errorf("decided %s, stored %s (%v)", first.Entry.DecisionID(), e.DecisionID(), ok)
		}
		h.Advance(lease + slack)
		next := r
		next.Owner.Holder = holderB
		dec := d.one(next, dedupe.VerdictFirst)
		if !dec.Resumed || dec.Entry.DecisionID() != first.Entry.DecisionID() {
			t.Errorf("resumed %v as %s, want resumed as %s", dec.Resumed, dec.Entry.DecisionID(), first.Entry.DecisionID())
		}
	}},
	{"FarEventTimeWindowIsExact", func(t *testing.T, h Harness, d *driver) {
		// Event times beyond 2^53 ms are kept as the nearest doubles (256
		// ms apart here): the window still ends where the times say, on
		// every path, not where a rounded sum would put it.
		const w = 1100 * time.Millisecond
		at := time.UnixMilli(1764957600123456789)
		r := req("k", fpA, dedupe.Window, holderA, "commands/0/10")
		r.EventTime, r.Window = at, w
		first := d.one(r, dedupe.VerdictFirst)
		d.mustComplete(complete(r, dedupe.Success, 1))
		ws := first.Entry.WindowStart
		inside := req("k", fpA, dedupe.Window, holderB, "commands/1/5")
		inside.EventTime, inside.Window = ws.Add(1024*time.Millisecond), w
		d.one(inside, dedupe.VerdictReplay)
		after := inside
		after.EventTime = ws.Add(1280 * time.Millisecond)
		d.one(after, dedupe.VerdictFirst)
	}},
	{"RacingHoldersDecideOnce", func(t *testing.T, h Harness, d *driver) {
		const racers = 16
		var firsts atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, racers)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := req("race", fpA, dedupe.Strict, fmt.Sprintf("racer-%d", i), fmt.Sprintf("commands/%d/1", i))
				decs, err := h.Store.Decide(context.Background(), []dedupe.DecideRequest{r})
				if err != nil {
					errs <- err
					return
				}
				if decs[0].Verdict == dedupe.VerdictFirst {
					firsts.Add(1)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Decide: %v", err)
		}
		if n := firsts.Load(); n != 1 {
			t.Errorf("%d racers were told first, want exactly 1", n)
		}
	}},
	{"ManyCompletionsInOneCallFollowTheirOwnRules", func(t *testing.T, h Harness, d *driver) {
		var firsts []dedupe.DecideRequest
		for i := range 12 {
			firsts = append(firsts, req(fmt.Sprintf("m%02d", i), fpA, dedupe.Strict, holderA, fmt.Sprintf("commands/0/%d", i)))
		}
		d.decide(firsts...)
		d.mustComplete(complete(firsts[9], dedupe.Success, 90)) // finished in an earlier call
		stranger := complete(firsts[3], dedupe.Success, 5)
		stranger.Owner = dedupe.Owner{Holder: holderB, Source: "commands/1/3"}
		comps := []dedupe.Completion{
			complete(firsts[0], dedupe.Success, 10),
			complete(firsts[1], dedupe.Failed, dedupe.NoPosition),
			complete(firsts[2], dedupe.Pending, dedupe.NoPosition), // a release
			stranger,
			complete(firsts[4], dedupe.Success, 40),
			complete(firsts[4], dedupe.Success, 40), // the same again
			complete(firsts[5], dedupe.Success, 50),
			complete(firsts[5], dedupe.Failed, dedupe.NoPosition), // no longer PENDING
			complete(req("m-none", fpA, dedupe.Strict, holderA, "commands/0/99"), dedupe.Success, 1),
			complete(firsts[9], dedupe.Success, 90), // a retry of the earlier call
			complete(firsts[9], dedupe.Success, 91), // another result: fenced
			complete(firsts[10], dedupe.Success, 100),
			complete(firsts[11], dedupe.Success, 110),
		}
		fenced := map[int]bool{3: true, 7: true, 8: true, 10: true}
		errs, err := h.Store.Complete(context.Background(), comps)
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if len(errs) != len(comps) {
			t.Fatalf("Complete returned %d errors for %d completions", len(errs), len(comps))
		}
		for i, err := range errs {
			if fenced[i] != errors.Is(err, dedupe.ErrFenced) || (!fenced[i] && err != nil) {
				t.Errorf("completion %d (%s %s by %s): %v, want fenced %v", i, comps[i].Key, comps[i].State, comps[i].Owner.Token(), err, fenced[i])
			}
		}
		want := map[string]struct {
			state  dedupe.State
			offset int64
		}{
			"m00": {dedupe.Success, 10}, "m01": {dedupe.Failed, dedupe.NoPosition}, "m02": {dedupe.Pending, dedupe.NoPosition},
			"m03": {dedupe.Pending, dedupe.NoPosition}, "m04": {dedupe.Success, 40}, "m05": {dedupe.Success, 50},
			"m09": {dedupe.Success, 90}, "m10": {dedupe.Success, 100}, "m11": {dedupe.Success, 110},
		}
		for key, w := range want {
			e, ok := d.lookup(key)
			if !ok || e.State != w.state || (w.state != dedupe.Pending && e.Result.Offset != w.offset) || !sameOwner(e, dedupe.Owner{Holder: holderA, Source: e.Owner.Source}) {
				t.Errorf("%s after the call: found %v, %+v; want %s with offset %d by %s", key, ok, e, w.state, w.offset, holderA)
			}
		}
		if _, ok := d.lookup("m-none"); ok {
			t.Error("a completion of a key never decided created an entry")
		}
		// The released key is taken over at once.
		dec := d.one(req("m02", fpA, dedupe.Strict, holderB, "commands/0/2"), dedupe.VerdictFirst)
		if !dec.Resumed {
			t.Errorf("takeover of a released key: %+v, want resumed", dec)
		}
	}},
	{"RacingCompletionAndTakeoverNeverBothWin", func(t *testing.T, h Harness, d *driver) {
		// The owner finishes its keys just as another holder takes them
		// over after the lease: per key, either the completion holds and
		// the other holder sees a replay, or the takeover holds and the
		// completion is fenced; never both a result and a new first.
		const keys = 40
		var mine, theirs []dedupe.DecideRequest
		for i := range keys {
			mine = append(mine, req(fmt.Sprintf("r%02d", i), fpA, dedupe.Strict, holderA, fmt.Sprintf("commands/0/%d", i)))
			r := req(fmt.Sprintf("r%02d", i), fpA, dedupe.Strict, holderB, fmt.Sprintf("commands/1/%d", i))
			r.Final = true
			theirs = append(theirs, r)
		}
		d.decide(mine...)
		h.Advance(lease + slack)
		var comps []dedupe.Completion
		for i, r := range mine {
			comps = append(comps, complete(r, dedupe.Success, int64(i)))
		}
		var wg sync.WaitGroup
		var errs []error
		var decs []dedupe.Decision
		var cerr, derr error
		wg.Add(2)
		go func() { defer wg.Done(); errs, cerr = h.Store.Complete(context.Background(), comps) }()
		go func() { defer wg.Done(); decs, derr = h.Store.Decide(context.Background(), theirs) }()
		wg.Wait()
		if cerr != nil || derr != nil {
			t.Fatalf("Complete: %v; Decide: %v", cerr, derr)
		}
		for i := range keys {
			completed := errs[i] == nil
			tookOver := decs[i].Verdict == dedupe.VerdictFirst
			if completed == tookOver {
				t.Errorf("key %d: completion error %v, other holder's verdict %v: exactly one of them must win", i, errs[i], decs[i].Verdict)
			}
			if completed && decs[i].Verdict != dedupe.VerdictReplay {
				t.Errorf("key %d: completed, but the other holder was told %v, want replay", i, decs[i].Verdict)
			}
		}
	}},
}
