package dedupe

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
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

// Known reports whether s is one of the three states: a store reads no
// entry in another, nor writes one.
func (s State) Known() bool { return s == Pending || s == Success || s == Failed }

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

// HolderDigest is what a store may keep of a finished entry's holder in
// place of the holder: "#" and the first 8 hex digits of its SHA-1. Only
// a PENDING entry's holder is acted on (fencing, resuming); a finished
// entry's is compared with a completion's, which a digest does as well,
// and shown. A store that keeps the digest gives it back from Lookup;
// Decide and Complete compare the holder they are given with it.
func HolderDigest(holder string) string {
	sum := sha1.Sum([]byte(holder))
	return "#" + hex.EncodeToString(sum[:4])
}

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
	// that came after its window ended (see internal/decide.Complete).
	KeepAtLeast time.Duration
}

// Store holds per-key state and decides atomically. Implementations must
// pass the storetest conformance suite.
//
// Decide applies the decision table (internal/decide.Decide) to each request in order, atomically per request,
// and returns one Decision per request. Requests for the same key in one
// call are decided in order, each seeing the effect of the previous.
//
// Complete moves PENDING entries owned by the given token to Success (kept
// until the window ends) or Failed (kept FailedTTL), or releases them
// (State Pending; the rule is internal/decide.Complete). It returns one error per
// completion: nil, or one wrapping ErrFenced when the token no longer owns
// the key (it was taken over, or the entry expired).
//
// Lookup returns the stored entry of a key, and false when there is none.
// A store may give a finished entry's holder as its HolderDigest, and
// what else it keeps only as a hash in a form that says so (redisstore's
// compact entries); Decide and Complete compare with what their caller
// brings, and see no difference.
//
// Every method returns an error wrapping ErrStoreUnavailable when the store
// did not answer; no decision or completion in that call may be assumed.
type Store interface {
	Decide(ctx context.Context, reqs []DecideRequest) ([]Decision, error)
	Complete(ctx context.Context, comps []Completion) ([]error, error)
	Lookup(ctx context.Context, namespace, key string) (Entry, bool, error)
}

// CheckCompletions refuses a call that asks for a state no store keeps:
// a completion is SUCCESS, FAILED or PENDING (a release). Written, any
// other would be an entry every reader refuses as unreadable. Every Store
// checks a call with it before it changes anything; the error is the
// caller's mistake, fatal.
func CheckCompletions(comps []Completion) error {
	for _, c := range comps {
		if !c.State.Known() {
			return fmt.Errorf("complete %q: state %q is none of %s, %s and %s", c.Key, c.State, Success, Failed, Pending)
		}
	}
	return nil
}

// Probe reports whether s answers: it looks up a key no record uses. A
// value there that s does not read (ErrEntryUnreadable) is still an
// answer; its content is not the probe's concern, and a readiness that
// failed on it would hold every pipeline back for one stray value. Every
// readiness check of a store (the consumer's, the front door's) asks
// through Probe, so that they agree on what "answers" means.
func Probe(ctx context.Context, s Store) error {
	_, _, err := s.Lookup(ctx, "idemstream-readyz", "probe")
	if errors.Is(err, ErrEntryUnreadable) {
		return nil
	}
	return err
}

// DecisionID names the decision that made e: the source of its first copy
// and the start of its window, which a takeover keeps and a new window (or
// a FAILED key's rerun) changes. Every result carries it, so that a
// recovery scan never takes the result of a key's previous window for the
// result of this one.
func (e *Entry) DecisionID() string {
	// In one allocation: every first copy's result carries it.
	var buf [96]byte
	b := append(append(buf[:0], e.FirstSource...), '@')
	return string(strconv.AppendInt(b, e.WindowStart.UnixMilli(), 10))
}
