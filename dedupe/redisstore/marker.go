package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
)

// The generation marker: how the store tells a server that still holds
// its decisions from one that forgot them (see doc.go, "A store that
// forgot").
//
// A marker is a plain string without expiry under the prefix, one on a
// single node or a Sentinel master, one per hash slot on a Cluster (so
// that it lives and dies with the entries of its slot: a node restored
// empty loses the markers of its slots with their entries). Its value is
// one of
//
//	armed <generation> <previous generation or -> <armed at, ms>
//	forgot <generation> <detected at, ms> <reason>
//
// Every round trip that decides, renews or completes carries, behind its
// writes and on the same connection, a GET of the marker of each slot it
// writes to. A server runs one connection's commands in order, and only
// FLUSHALL, a restart or a full resync replaces its dataset, none of
// which brings back the value a store armed: so a GET that answers the
// armed value proves that the writes before it met the decisions of
// this generation. Any other answer fails the call with
// dedupe.ErrStoreForgot before a decision of it is used, records the
// loss in the marker for every member to see, and holds every decision
// until an operator accepts the loss (AcceptLoss) or the hold
// (WithForgetHold: the longest window) has passed on the server's clock.

// markerSlots is how many markers a Cluster has: one per hash slot.
const markerSlots = 16384

// markerPoll bounds how often a store that forgot asks the server whether
// the loss was accepted or its hold has passed.
const markerPoll = time.Second

// WithForgetHold sets how long after a loss was detected the store starts
// deciding again by itself: the longest window of the pipelines that use
// it, after which every entry the loss took would have ended anyway. Zero
// (the default) waits for an operator (AcceptLoss).
func WithForgetHold(d time.Duration) Option {
	return func(s *Store) { s.gen.hold = d }
}

// ForgotError describes a store that lost decisions.
type ForgotError struct {
	Generation string    // the generation whose decisions were lost
	Since      time.Time // when the loss was detected (the server's clock)
	Reason     string
	Hold       time.Duration // zero: only an operator resumes
}

func (e *ForgotError) Error() string {
	msg := fmt.Sprintf("the store forgot decisions it had made: %s (generation %s, detected %s); nothing is decided until an operator runs `idemstream store accept-loss`",
		e.Reason, e.Generation, e.Since.UTC().Format(time.RFC3339))
	if e.Hold > 0 {
		msg += " or the window passes at " + e.Since.Add(e.Hold).UTC().Format(time.RFC3339)
	}
	return msg
}

func (e *ForgotError) Unwrap() error { return dedupe.ErrStoreForgot }

// marker is a parsed marker value.
type marker struct {
	raw    string
	armed  bool
	gen    string
	prev   string // armed: the generation it replaced ("-" for none)
	at     int64  // armed: when, in ms of the arming store's clock
	since  int64  // forgot: when, in ms of the server's clock
	reason string
}

func parseMarker(raw string) (marker, bool) {
	m := marker{raw: raw}
	f := strings.SplitN(raw, " ", 4)
	if len(f) != 4 {
		return m, false
	}
	switch f[0] {
	case "armed":
		at, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			return m, false
		}
		m.armed, m.gen, m.prev, m.at = true, f[1], f[2], at
		return m, true
	case "forgot":
		ms, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return m, false
		}
		m.gen, m.since, m.reason = f[1], ms, f[3]
		return m, true
	}
	return m, false
}

func (m marker) forgotError(hold time.Duration) *ForgotError {
	return &ForgotError{Generation: m.gen, Since: time.UnixMilli(m.since), Reason: m.reason, Hold: hold}
}

// generation is the store's view of its marker.
type generation struct {
	hold time.Duration

	namesOnce sync.Once
	names     []string // every marker's name (markerNames)

	mu   sync.Mutex
	want string // the armed value every round trip must read
	// known is the last armed value this store decided under, kept when
	// want is cleared: a store that knew a generation takes no marker, or
	// a new arm that does not succeed one, for a new store.
	known  string
	forgot *ForgotError // set while the store is known to have forgotten
	polled time.Time    // the last time a forgotten store asked the server
}

func (s *Store) isCluster() bool { _, ok := s.client.(*redis.ClusterClient); return ok }

// markerNames are the names of every marker of the store, built once: a
// Cluster has one per slot, named with a hash tag of that slot (index
// slot); anything else has one.
func (s *Store) markerNames() []string {
	s.gen.namesOnce.Do(func() {
		if !s.isCluster() {
			s.gen.names = []string{s.prefix + ":marker"}
			return
		}
		s.gen.names = make([]string, markerSlots)
		for i, tag := range slotTags() {
			s.gen.names[i] = s.prefix + ":marker:{" + tag + "}"
		}
	})
	return s.gen.names
}

// markerFor is the marker that guards a write to name.
func (s *Store) markerFor(name string) string {
	names := s.markerNames()
	if len(names) == 1 {
		return names[0]
	}
	return names[hashSlot(name)]
}

// slotTags holds, per hash slot, the shortest decimal string that hashes
// to it: the hash tag of that slot's marker.
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, markerSlots)
	for n, found := 0, 0; found < markerSlots; n++ {
		t := strconv.Itoa(n)
		if slot := crc16(t) % markerSlots; tags[slot] == "" {
			tags[slot] = t
			found++
		}
	}
	return tags
})

// Forgot returns the loss the store knows of, or nil: /readyz and the
// idemstream_store_forgot gauge report it.
func (s *Store) Forgot() error {
	s.gen.mu.Lock()
	defer s.gen.mu.Unlock()
	if s.gen.forgot == nil {
		return nil
	}
	return s.gen.forgot
}

// ready makes sure the store decides under a generation it knows the
// server still holds: it reads (or, on a store never armed, arms) the
// markers before the first decision, and while a loss holds it asks the
// server at most once a second whether it was accepted or its hold
// passed. It returns the loss while it holds.
func (s *Store) ready(ctx context.Context) error {
	s.gen.mu.Lock()
	defer s.gen.mu.Unlock()
	if s.gen.want != "" && s.gen.forgot == nil {
		return nil
	}
	if s.gen.forgot != nil {
		if time.Since(s.gen.polled) < markerPoll {
			return s.gen.forgot
		}
		s.gen.polled = time.Now()
	}
	if err := s.syncMarkers(ctx); err != nil {
		return err
	}
	if s.gen.forgot != nil {
		return s.gen.forgot
	}
	return nil
}

// adopt makes v the generation the store decides under.
func (s *Store) adopt(v string) {
	s.gen.want, s.gen.known, s.gen.forgot = v, v, nil
}

// succeeds reports whether armed value v may replace what the store knew:
// a store that never armed takes anything, and a generation armed anew
// after a loss (by an operator or a hold, prev set) replaces any; a new
// arm (prev "-") over a known generation is the loss of that generation.
func (s *Store) succeeds(v string) bool {
	m, ok := parseMarker(v)
	return ok && m.armed && (s.gen.known == "" || v == s.gen.known || m.prev != "-")
}

// syncMarkers reads every marker and sets the generation from them, under
// gen.mu: none, on a store that never knew one, a new generation; all
// armed alike with one that succeeds what the store knew (succeeds), that
// one; an arm still being written, finished; anything else is the loss
// (recorded where it was not yet), resumed once its hold passed.
func (s *Store) syncMarkers(ctx context.Context) error {
	names := s.markerNames()
	vals, err := s.readMarkers(ctx, names)
	if err != nil {
		return err
	}
	first, counts := summarize(vals)
	fresh := s.gen.known == "" && s.gen.forgot == nil
	switch {
	case counts.absent == len(vals) && fresh:
		v, err := s.armFresh(ctx, names)
		if err != nil {
			return err
		}
		s.adopt(v)
		return nil
	case counts.armed == len(vals) && counts.distinct == 1 && s.succeeds(first.raw):
		s.adopt(first.raw)
		return nil
	}
	if v, ok := armInProgress(vals, time.Now()); ok && s.succeeds(v) {
		// Another store is arming (or was stopped arming) the markers of
		// a Cluster one slot after the other: finish it.
		var behind []string
		for i, x := range vals {
			if x != v {
				behind = append(behind, names[i])
			}
		}
		if err := s.setMarkers(ctx, behind, v, false); err != nil {
			return err
		}
		s.adopt(v)
		return nil
	}
	loss, ok := recordedLoss(vals)
	if !ok {
		// Markers missing or different with no loss recorded: a part of
		// the store forgot (a Cluster node restored empty) or another
		// generation replaced this one.
		gen := s.gen.known
		if gen == "" {
			gen = first.raw
		}
		m, _ := parseMarker(gen)
		if s.gen.forgot != nil {
			m.gen = s.gen.forgot.Generation
		}
		reason := fmt.Sprintf("%d of %d markers are missing and %d differ from the generation this store decided under: the store lost its data", counts.absent, len(vals), len(vals)-counts.absent-holding(vals, s.gen.known))
		if loss, err = s.recordLoss(ctx, names, vals, m.gen, reason); err != nil {
			return err
		}
	}
	s.gen.forgot = loss.forgotError(s.gen.hold)
	if s.gen.hold > 0 {
		if err := s.resumeAfterHold(ctx, names, loss); err != nil {
			return err
		}
	}
	return nil
}

// armGrace is how long after a store armed a generation (new, after a
// loss accepted, after a hold) markers that do not hold it yet are taken
// for an arm still under way rather than for a loss: a Cluster's markers
// are written one slot after the other, and a store reading them meanwhile
// must not take the ones not yet written for lost. A node that loses its
// data within armGrace of an arm is not noticed.
const armGrace = time.Minute

// armInProgress returns the newest armed value when it is younger than
// armGrace and every other marker is on its way to it: missing, or
// (after a loss) the generation it replaces, armed or recorded lost.
func armInProgress(vals []string, now time.Time) (string, bool) {
	var newest marker
	for _, v := range vals {
		if m, ok := parseMarker(v); ok && m.armed && (newest.raw == "" || m.at > newest.at) {
			newest = m
		}
	}
	if newest.raw == "" || now.Sub(time.UnixMilli(newest.at)).Abs() > armGrace {
		return "", false
	}
	for _, v := range vals {
		if v == "" || v == newest.raw {
			continue
		}
		m, ok := parseMarker(v)
		if !ok || newest.prev == "-" || m.gen != newest.prev {
			return "", false
		}
	}
	return newest.raw, true
}

type markerCounts struct{ absent, armed, distinct int }

// holding counts the markers that hold known.
func holding(vals []string, known string) int {
	n := 0
	for _, v := range vals {
		if v != "" && v == known {
			n++
		}
	}
	return n
}

// summarize counts the markers; first is the first present one.
func summarize(vals []string) (first marker, c markerCounts) {
	seen := map[string]bool{}
	for _, v := range vals {
		if v == "" {
			c.absent++
			continue
		}
		m, _ := parseMarker(v)
		if first.raw == "" {
			first = m
		}
		if m.armed {
			c.armed++
		}
		if !seen[v] {
			seen[v] = true
			c.distinct++
		}
	}
	return first, c
}

// recordedLoss is the loss a marker records, the latest if several do:
// its hold runs from the last loss.
func recordedLoss(vals []string) (marker, bool) {
	var loss marker
	found := false
	for _, v := range vals {
		if m, ok := parseMarker(v); ok && !m.armed && (!found || m.since > loss.since) {
			loss, found = m, true
		}
	}
	return loss, found
}

func (s *Store) readMarkers(ctx context.Context, names []string) ([]string, error) {
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(names))
	for i, n := range names {
		cmds[i] = pipe.Get(ctx, n)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, classify("marker", err)
	}
	vals := make([]string, len(names))
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, classify("marker", err)
		}
		vals[i] = v
	}
	return vals, nil
}

func newGeneration() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// armFresh arms a store that has no marker. The first marker decides the
// generation (SET NX: of stores arming at once, one wins), and the others
// copy it, so that every store arming at once arms the same.
func (s *Store) armFresh(ctx context.Context, names []string) (string, error) {
	v := fmt.Sprintf("armed %s - %d", newGeneration(), time.Now().UnixMilli())
	pipe := s.client.Pipeline()
	pipe.SetNX(ctx, names[0], v, 0)
	got := pipe.Get(ctx, names[0])
	if _, err := pipe.Exec(ctx); err != nil {
		return "", classify("marker", err)
	}
	v = got.Val()
	if m, ok := parseMarker(v); !ok || !m.armed {
		return "", fmt.Errorf("marker: %w: %s holds %q while the others are missing", dedupe.ErrStoreUnavailable, names[0], v)
	}
	if len(names) > 1 {
		if err := s.setMarkers(ctx, names[1:], v, true); err != nil {
			return "", err
		}
	}
	return v, nil
}

// setMarkers writes v to every name (only where none is, with nx).
func (s *Store) setMarkers(ctx context.Context, names []string, v string, nx bool) error {
	pipe := s.client.Pipeline()
	for _, n := range names {
		if nx {
			pipe.SetNX(ctx, n, v, 0)
		} else {
			pipe.Set(ctx, n, v, 0)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return classify("marker", err)
	}
	return nil
}

// markForgotScript records a loss in a marker that still holds what was
// read (ARGV[1], "" for none), on the server's clock, and returns the
// marker's value as it leaves it.
var markForgotScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return cur end
local t = redis.call('TIME')
local v = 'forgot ' .. ARGV[2] .. ' ' .. tostring(t[1] * 1000 + math.floor(t[2] / 1000)) .. ' ' .. ARGV[3]
redis.call('SET', KEYS[1], v)
return v`)

// resumeScript arms a marker anew (ARGV[3]) if it still holds what was
// read (ARGV[1]) and the server's clock has reached ARGV[2] (ms; 0 for
// now), and returns the marker's value as it leaves it.
var resumeScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1]) or ''
if cur ~= ARGV[1] then return cur end
local t = redis.call('TIME')
if t[1] * 1000 + math.floor(t[2] / 1000) < tonumber(ARGV[2]) then return cur end
redis.call('SET', KEYS[1], ARGV[3])
return ARGV[3]`)

// recordLoss writes the loss into every marker that does not hold the
// armed value the others share, and returns the loss as recorded (by this
// store, or by another that was first).
func (s *Store) recordLoss(ctx context.Context, names, vals []string, gen, reason string) (marker, error) {
	var loss marker
	for i, v := range vals {
		if v != "" && v == s.gen.known {
			continue // this marker still holds the generation
		}
		got, err := markForgotScript.Run(ctx, s.client, []string{names[i]}, v, gen, reason).Text()
		if m, ok := parseMarker(got); err == nil && ok && m.armed && m.prev == "-" {
			// A store that found no marker armed it meanwhile, on the
			// data that forgot: the loss goes over its arm.
			got, err = markForgotScript.Run(ctx, s.client, []string{names[i]}, got, gen, reason).Text()
		}
		if err != nil {
			return marker{}, classify("marker", err)
		}
		if m, ok := parseMarker(got); ok && !m.armed && (loss.raw == "" || m.since > loss.since) {
			loss = m
		}
	}
	if loss.raw == "" {
		return marker{}, fmt.Errorf("marker: %w: the loss could not be recorded", dedupe.ErrStoreUnavailable)
	}
	return loss, nil
}

// resumeAfterHold arms a new generation once the loss's hold has passed on
// the server's clock: the first marker decides (of stores resuming at
// once, one wins) and the others copy it.
func (s *Store) resumeAfterHold(ctx context.Context, names []string, loss marker) error {
	due := loss.since + s.gen.hold.Milliseconds()
	return s.resume(ctx, names, loss, due)
}

// resume replaces the loss with a new generation, if the first marker
// still holds the loss and the server's clock has reached due.
func (s *Store) resume(ctx context.Context, names []string, loss marker, due int64) error {
	next := fmt.Sprintf("armed %s %s %d", newGeneration(), loss.gen, time.Now().UnixMilli())
	cur, err := s.readMarkers(ctx, names[:1])
	if err != nil {
		return err
	}
	got := cur[0]
	if c, ok := parseMarker(cur[0]); !ok || !c.armed || c.prev != loss.gen {
		// Not yet resumed by another store: replace the loss, or the
		// lost generation a slot that did not lose it still holds, and
		// nothing else.
		if ok && c.armed && cur[0] != s.gen.known {
			return nil
		}
		if got, err = resumeScript.Run(ctx, s.client, []string{names[0]}, cur[0], due, next).Text(); err != nil {
			return classify("marker", err)
		}
	}
	m, ok := parseMarker(got)
	if !ok || !m.armed || m.prev != loss.gen {
		return nil // not due yet, or another loss meanwhile
	}
	if len(names) > 1 {
		if err := s.setMarkers(ctx, names[1:], got, false); err != nil {
			return err
		}
	}
	s.adopt(got)
	return nil
}

// AcceptLoss is the operator's word that the store may decide again after
// it forgot: a new generation replaces the loss (or whatever the markers
// hold), and every store that sees it resumes. Keys whose entries were
// lost are decided first again when their commands come back. It returns
// the new marker value.
func (s *Store) AcceptLoss(ctx context.Context) (string, error) {
	names := s.markerNames()
	vals, err := s.readMarkers(ctx, names)
	if err != nil {
		return "", err
	}
	// The new generation names one it succeeds, never "-": stores that
	// knew another generation take it for an accepted loss, not a new arm.
	gen := "accepted"
	if loss, ok := recordedLoss(vals); ok {
		gen = loss.gen
	} else if first, _ := summarize(vals); first.raw != "" {
		gen = first.gen
	}
	next := fmt.Sprintf("armed %s %s %d", newGeneration(), gen, time.Now().UnixMilli())
	if err := s.setMarkers(ctx, names, next, false); err != nil {
		return "", err
	}
	return next, nil
}

// MarkerStatus is what the markers say, for `idemstream store status`.
type MarkerStatus struct {
	Markers int            // how many the store has (1, or one per Cluster slot)
	Absent  int            // how many are missing
	Values  map[string]int // each distinct value and how many markers hold it
	Loss    *ForgotError   // the loss recorded, if any
	Armed   string         // the armed value all share, if they do
}

// Status reads every marker.
func (s *Store) Status(ctx context.Context) (MarkerStatus, error) {
	names := s.markerNames()
	vals, err := s.readMarkers(ctx, names)
	if err != nil {
		return MarkerStatus{}, err
	}
	st := MarkerStatus{Markers: len(vals), Values: map[string]int{}}
	for _, v := range vals {
		if v == "" {
			st.Absent++
			continue
		}
		st.Values[v]++
	}
	if loss, ok := recordedLoss(vals); ok {
		st.Loss = loss.forgotError(s.gen.hold)
	}
	first, c := summarize(vals)
	if c.armed == len(vals) && c.distinct == 1 {
		st.Armed = first.raw
	}
	return st, nil
}

// checkMarkers verifies the marker GETs of a round trip whose commands
// answered: every one must read the armed value. Anything else is the
// loss, recorded for every member to see; a value armed anew over this
// generation (a loss accepted, a hold passed) fails the call as
// unavailable and makes the next call read the markers again.
func (s *Store) checkMarkers(ctx context.Context, want string, gets []*redis.StringCmd) error {
	if want == "" {
		return markerFailure{fmt.Errorf("marker: %w: the store is not armed", dedupe.ErrStoreUnavailable)}
	}
	for _, g := range gets {
		if err := g.Err(); err != nil && !errors.Is(err, redis.Nil) {
			// Not answered: the round trip's own error says why.
			return markerFailure{classify("marker", err)}
		}
	}
	for _, g := range gets {
		if v := g.Val(); v != want {
			return markerFailure{s.noteMismatch(ctx, want, v)}
		}
	}
	return nil
}

// markerFailure is a round trip whose markers did not read the armed
// value: none of its answers may be used.
type markerFailure struct{ error }

func (m markerFailure) Unwrap() error { return m.error }

func isMarkerFailure(err error) bool { var m markerFailure; return errors.As(err, &m) }

// noteMismatch handles a marker read that is not the armed value want.
func (s *Store) noteMismatch(ctx context.Context, want, got string) error {
	s.gen.mu.Lock()
	defer s.gen.mu.Unlock()
	if s.gen.want != want {
		// The generation moved on while this call was out: read again.
		return fmt.Errorf("marker: %w: the store's generation changed during the call", dedupe.ErrStoreUnavailable)
	}
	w, _ := parseMarker(want)
	if m, ok := parseMarker(got); ok && m.armed && m.prev != "-" {
		// Armed anew after a loss (accepted, or its hold passed), maybe
		// more than once: read every marker again before deciding.
		s.gen.want = ""
		return fmt.Errorf("marker: %w: the store was armed anew after a loss; reading its markers again", dedupe.ErrStoreUnavailable)
	}
	reason := "the marker is gone: the dataset was emptied (FLUSHALL, a restart without persistence, a failover onto a replica that never synced, a node restored empty)"
	if got != "" {
		if m, ok := parseMarker(got); ok && !m.armed {
			s.gen.forgot, s.gen.polled = m.forgotError(s.gen.hold), time.Now()
			return s.gen.forgot
		}
		reason = fmt.Sprintf("the marker holds %q, another generation's: the dataset was replaced (a restore, a failover onto a store that was armed anew)", got)
	}
	names := s.markerNames()
	vals, err := s.readMarkers(ctx, names)
	if err != nil {
		// The loss is certain even if it cannot be recorded yet.
		s.gen.forgot = &ForgotError{Generation: w.gen, Since: time.Now(), Reason: reason, Hold: s.gen.hold}
		s.gen.polled = time.Now()
		return s.gen.forgot
	}
	loss, err := s.recordLoss(ctx, names, vals, w.gen, reason)
	if err != nil {
		s.gen.forgot = &ForgotError{Generation: w.gen, Since: time.Now(), Reason: reason, Hold: s.gen.hold}
	} else {
		s.gen.forgot = loss.forgotError(s.gen.hold)
	}
	s.gen.polled = time.Now()
	return s.gen.forgot
}

// guards reports whether a round trip of op must read the markers: every
// one that writes a decision or its completion.
func guards(op string) bool { return op == "decide" || op == "complete" || op == "keep" }

// markerGet is the GET of a single node's marker and the armed value it
// must read, for the paths that only a single node or a Sentinel master
// takes (the compare-and-set and WATCH completions).
func (s *Store) markerGet(ctx context.Context) (*redis.StringCmd, string) {
	_, _, gets, want := s.markerGets(ctx, nil, nil)
	return gets[0], want
}

// markerGets adds to cmds (routed by keys) a GET of the marker of each
// slot that keys write to, behind them, and returns the commands, their
// routes, the GETs, and the armed value they must read.
func (s *Store) markerGets(ctx context.Context, keys []string, cmds []redis.Cmder) ([]string, []redis.Cmder, []*redis.StringCmd, string) {
	s.gen.mu.Lock()
	want := s.gen.want
	s.gen.mu.Unlock()
	names := s.markerNames()
	if len(names) == 1 {
		g := redis.NewStringCmd(ctx, "GET", names[0])
		return append(keys[:len(keys):len(keys)], names[0]), append(cmds[:len(cmds):len(cmds)], g), []*redis.StringCmd{g}, want
	}
	seen := map[string]bool{}
	outKeys := keys[:len(keys):len(keys)]
	outCmds := cmds[:len(cmds):len(cmds)]
	var gets []*redis.StringCmd
	for _, k := range keys {
		m := s.markerFor(k)
		if seen[m] {
			continue
		}
		seen[m] = true
		g := redis.NewStringCmd(ctx, "GET", m)
		gets = append(gets, g)
		outKeys, outCmds = append(outKeys, m), append(outCmds, g)
	}
	return outKeys, outCmds, gets, want
}
