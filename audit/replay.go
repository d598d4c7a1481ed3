package audit

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/decide"
)

// The three rules a replay compares.
const (
	RuleIdemstream = "idemstream" // key + canonical fingerprint, strict
	RuleRawBody    = "raw_body"   // key + hash of the raw bytes: the incident's rule
	RuleKeyOnly    = "key_only"   // key only, lenient
)

// Counts are the outcomes of one rule over the records read.
type Counts struct {
	First    int64 `json:"first"`
	Replay   int64 `json:"replay"`
	Conflict int64 `json:"conflict"`
	Invalid  int64 `json:"invalid"`
	// Mismatch counts replays whose body differed from the first copy's
	// (lenient_mismatch under key_only).
	Mismatch int64 `json:"lenient_mismatch,omitempty"`
}

func (c *Counts) add(v dedupe.Verdict, mismatch bool) {
	switch v {
	case dedupe.VerdictFirst:
		c.First++
	case dedupe.VerdictReplay:
		c.Replay++
		if mismatch {
			c.Mismatch++
		}
	case dedupe.VerdictConflict:
		c.Conflict++
	}
}

// Decisions are the outcomes of the three rules, for the same records.
type Decisions struct {
	Idemstream Counts `json:"idemstream"`
	RawBody    Counts `json:"raw_body"`
	KeyOnly    Counts `json:"key_only"`
}

// replayer decides records as idemstream would, with the decision table
// of the store (decide.Decide) and the decider's key and fingerprint
// ([dedupe.Decider.Prepare]), so that an audit and a consumer with the
// same rules cannot disagree. Time is the records' timestamps (as with
// clock: event); every first copy counts as handled successfully. It keeps
// 16 bytes per rule and key while the key's window is open.
type replayer struct {
	window   time.Duration
	idem     *dedupe.Decider
	raw      *dedupe.Decider
	digest   string
	keys     map[string]*replayKey
	counts   Decisions
	records  int64
	lastSeen int64
	err      error // the first error that was not a record's fault
}

type replayKey struct {
	idem, keyOnly compact
	raw           []compact // one per distinct body inside the window
}

// compact is a SUCCESS entry: the window start and 64 bits of the
// fingerprint.
type compact struct {
	start int64
	fp    uint64
	set   bool
}

// newReplayer replays under the policy's key rules, canonical rules and
// window, with strict semantics for the idemstream rule.
func newReplayer(p dedupe.Policy) (*replayer, error) {
	p.Semantics = dedupe.Strict
	idem, err := dedupe.NewDecider(p, nil)
	if err != nil {
		return nil, err
	}
	rawPol := p
	rawPol.Rules = dedupe.CanonicalRules{Payload: dedupe.PayloadRaw}
	rawPol.Schema = nil
	raw, err := dedupe.NewDecider(rawPol, nil)
	if err != nil {
		return nil, err
	}
	return &replayer{window: p.Window, idem: idem, raw: raw, digest: idem.Canonicalizer().RulesDigest(), keys: map[string]*replayKey{}}, nil
}

// Records returns the number of records decided.
func (r *replayer) Records() int64 { return r.records }

// Decisions returns the counts so far.
func (r *replayer) Decisions() Decisions { return r.counts }

// Add decides one record under the three rules.
func (r *replayer) Add(rec *dedupe.Record) {
	r.records++
	t := unixNano(rec.Time)
	ip := r.idem.Prepare(rec)
	if ip.Err != nil && dedupe.Classify(ip.Err) != dedupe.Poison {
		r.err = cmp.Or(r.err, ip.Err)
		return
	}
	rp := r.raw.Prepare(rec)
	key := ip.Key
	if ip.Err != nil {
		r.counts.Idemstream.Invalid++
		key = rp.Key
	}
	if rp.Err != nil {
		r.counts.RawBody.Invalid++
		r.counts.KeyOnly.Invalid++
	}
	if key == "" {
		return
	}
	rk := r.keys[key]
	if rk == nil {
		rk = &replayKey{}
		r.keys[key] = rk
	}
	if ip.Err == nil {
		v, mismatch := r.apply(&rk.idem, key, ip.Fingerprint, dedupe.Strict, t)
		r.counts.Idemstream.add(v, mismatch)
	}
	if rp.Err != nil {
		return
	}
	v, mismatch := r.apply(&rk.keyOnly, key, rp.Fingerprint, dedupe.Lenient, t)
	r.counts.KeyOnly.add(v, mismatch)

	// raw_body: the identity is the key and the exact bytes, so each
	// distinct body has an entry of its own.
	fp := fpBits(rp.Fingerprint)
	slot := -1
	live := rk.raw[:0]
	for _, e := range rk.raw {
		if t-e.start >= int64(r.window) {
			continue // window over: the entry is gone
		}
		if e.fp == fp {
			slot = len(live)
		}
		live = append(live, e)
	}
	rk.raw = live
	if slot < 0 {
		rk.raw = append(rk.raw, compact{})
		slot = len(rk.raw) - 1
	}
	v, _ = r.apply(&rk.raw[slot], key, rp.Fingerprint, dedupe.Strict, t)
	r.counts.RawBody.add(v, false)
}

// apply runs the store's decision table on a compact entry and keeps the
// entry it leaves.
func (r *replayer) apply(e *compact, key, fingerprint string, sem dedupe.Semantics, t int64) (dedupe.Verdict, bool) {
	now := time.Unix(0, t)
	fp := fingerprint[len("sha256:") : len("sha256:")+16]
	req := dedupe.DecideRequest{
		Namespace: "audit", Key: key, Fingerprint: fp, RulesDigest: r.digest,
		Semantics: sem, Window: r.window, Lease: r.window,
		Owner:     dedupe.Owner{Holder: "audit"},
		EventTime: now,
	}
	var cur *dedupe.Entry
	if e.set {
		start := time.Unix(0, e.start)
		cur = &dedupe.Entry{
			Key: key, State: dedupe.Success, Fingerprint: fpText(e.fp), RulesDigest: r.digest,
			Owner: dedupe.Owner{Holder: "audit"}, WindowStart: start, ExpiresAt: start.Add(r.window),
		}
	}
	d, next := decide.Decide(cur, req, now)
	if d.Verdict == dedupe.VerdictFirst && next != nil {
		*e = compact{start: next.WindowStart.UnixNano(), fp: fpBits(fingerprint), set: true}
	}
	return d.Verdict, d.Mismatch
}

// fpBits is the first 64 bits of a "sha256:<hex>" fingerprint.
func fpBits(fingerprint string) uint64 {
	v, _ := strconv.ParseUint(fingerprint[len("sha256:"):len("sha256:")+16], 16, 64)
	return v
}

// fpText spells fpBits back as the hex prefix decide.Decide compares.
func fpText(v uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return hex.EncodeToString(b[:])
}
