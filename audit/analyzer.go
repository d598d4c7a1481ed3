package audit

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// DefaultVolatileShare is the share of keys with several copies in which a
// field must change to be proposed as volatile.
const DefaultVolatileShare = 0.5

// Options say how records are read and grouped.
type Options struct {
	// Policy gives the key rules (where the key is, its format), the
	// payload limit, the schema and, when Configured, the canonical rules
	// and the window. Without Configured only the key rules and the
	// limits are used, and the rules start empty.
	Policy dedupe.Policy
	// Configured says the policy comes from a pipeline of a configuration
	// file: its rules and window are what idemstream decides with, and
	// the report proposes what they lack.
	Configured bool
	// VolatileShare is --volatile-share (DefaultVolatileShare when 0).
	VolatileShare float64
	// ClientMaxRetryInterval is the pipeline's client_max_retry_interval,
	// kept when no key was seen twice.
	ClientMaxRetryInterval time.Duration
}

func (o Options) withDefaults() Options {
	if o.VolatileShare <= 0 {
		o.VolatileShare = DefaultVolatileShare
	}
	if !o.Configured {
		o.Policy.Rules = dedupe.CanonicalRules{Payload: o.Policy.Rules.Payload, Decoder: o.Policy.Rules.Decoder}
		o.Policy.Semantics = dedupe.Strict
		o.Policy.Window = dedupe.Strict.DefaultWindow()
	}
	if o.Policy.Semantics == "" {
		o.Policy.Semantics = dedupe.Strict
	}
	if o.Policy.Window <= 0 {
		o.Policy.Window = o.Policy.Semantics.DefaultWindow()
	}
	if o.Policy.PendingTimeout <= 0 {
		o.Policy.PendingTimeout = 30 * time.Second
	}
	if o.Policy.FailedTTL <= 0 {
		o.Policy.FailedTTL = o.Policy.Window
	}
	if o.Policy.Pipeline == "" {
		o.Policy.Pipeline = "audit"
	}
	return o
}

// keyState is what the analysis keeps per idempotency key: counts and
// times always, and the summary of the first copy of its current window
// only while that window is open.
type keyState struct {
	key     string
	copies  uint32
	last    int64 // time of the latest copy, Unix ns
	maxGap  int64 // longest time between two consecutive copies
	sStart  int64 // time of the first copy of the current window
	summary summary
	// diffs lists the generalized pointers (genReorder set for a reorder
	// of that array) at which some copy differed from its window's first
	// copy, each once.
	diffs []uint32
}

const genReorder = 1 << 31

type episode struct {
	ks    *keyState
	start int64
}

// pointerStats counts the keys in which a pointer differed.
type pointerStats struct {
	keys     int64
	examples []string
}

// analyzer is the first pass of an audit: it groups records by key and
// finds which values change between copies of one key. It keeps a
// summary of a key's first copy (one 8-byte entry per JSON value) while
// the window of that copy is open, and about a hundred bytes per key
// after that.
type analyzer struct {
	opts    Options
	decider *dedupe.Decider
	canon   *dedupe.Canonicalizer
	raw     bool
	err     error // the first error that was not a record's fault

	paths  *paths
	walker *walker
	keys   map[string]*keyState
	queue  []episode
	head   int
	canonB []byte
	tSum   summary

	records   int64
	watermark int64
	window    int64
	invalid   map[dedupe.Reason]*invalidStats
	intervals histogram
	pointers  map[uint32]*pointerStats
	reorders  map[uint32]*pointerStats
	truncated int64
	topic     string
	parts     map[int]bool
}

type invalidStats struct {
	count    int64
	examples []string
}

// newAnalyzer checks the options and builds the first pass.
func newAnalyzer(opts Options) (*analyzer, error) {
	opts = opts.withDefaults()
	d, err := dedupe.NewDecider(opts.Policy, nil)
	if err != nil {
		return nil, err
	}
	p := newPaths()
	return &analyzer{
		opts: opts, decider: d, canon: d.Canonicalizer(), raw: d.Canonicalizer().Rules().Payload == dedupe.PayloadRaw,
		paths: p, walker: newWalker(p), keys: map[string]*keyState{},
		window:  int64(opts.Policy.Window),
		invalid: map[dedupe.Reason]*invalidStats{}, pointers: map[uint32]*pointerStats{}, reorders: map[uint32]*pointerStats{},
		parts: map[int]bool{},
	}, nil
}

// Options returns the options in effect, defaults filled in.
func (a *analyzer) Options() Options { return a.opts }

// Keys returns the number of keys tracked.
func (a *analyzer) Keys() int { return len(a.keys) }

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Add looks at one record. Records of one partition must come in offset
// order; records of several partitions roughly in time order (see Source).
func (a *analyzer) Add(rec *dedupe.Record) {
	a.records++
	if a.topic == "" {
		a.topic = rec.Topic
	}
	a.parts[rec.Partition] = true
	prep := a.decider.Prepare(rec)
	if prep.Err != nil && dedupe.Classify(prep.Err) != dedupe.Poison {
		// A schema registry that did not answer: the record is not
		// invalid, and the report would be wrong; Run says so.
		a.err = cmp.Or(a.err, prep.Err)
		return
	}
	if prep.Err != nil {
		countInvalid(a.invalid, prep.Err, rec)
		return
	}
	t := unixNano(rec.Time)
	a.watermark = max(a.watermark, t)
	ks := a.keys[prep.Key]
	if ks == nil {
		ks = &keyState{key: prep.Key}
		a.keys[prep.Key] = ks
	} else {
		gap := max(t-ks.last, 0)
		a.intervals.add(time.Duration(gap))
		ks.maxGap = max(ks.maxGap, gap)
	}
	ks.copies++
	ks.last = max(ks.last, t)
	if !a.raw {
		a.look(ks, rec, t)
	}
	a.sweep()
}

// countInvalid counts a record that cannot be decided, with its position
// as an example.
func countInvalid(m map[dedupe.Reason]*invalidStats, err error, rec *dedupe.Record) {
	r := dedupe.ReasonOf(err)
	if r == "" {
		r = dedupe.ReasonMalformedPayload
	}
	st := m[r]
	if st == nil {
		st = &invalidStats{}
		m[r] = st
	}
	st.count++
	if len(st.examples) < maxExamples {
		st.examples = append(st.examples, rec.Source())
	}
}

const maxExamples = 3

// look compares the payload with the first copy of the key's window, or
// makes it the first copy of a new window.
func (a *analyzer) look(ks *keyState, rec *dedupe.Record, t int64) {
	var err error
	a.canonB, err = a.canon.AppendCanonical(a.canonB[:0], rec.Value)
	if err != nil {
		return // Prepare accepted it: cannot happen
	}
	truncated, err := a.walker.walk(a.canonB)
	if err != nil {
		return
	}
	if truncated {
		a.truncated++
	}
	if ks.summary != nil && t-ks.sStart < a.window {
		a.tSum = a.walker.summarize(a.tSum)
		a.compare(ks, ks.summary, a.tSum)
		return
	}
	n := 0
	for _, nd := range a.walker.nodes {
		if nd.id != noPath {
			n++
		}
	}
	ks.summary = a.walker.summarize(make(summary, 0, n))
	ks.sStart = t
	a.queue = append(a.queue, episode{ks, t})
}

// sweep drops the summaries of windows that are over: a later copy starts
// a new window and never compares with them.
func (a *analyzer) sweep() {
	for a.head < len(a.queue) {
		e := a.queue[a.head]
		if a.watermark-e.start < a.window {
			break
		}
		if e.ks.sStart == e.start {
			e.ks.summary = nil
		}
		a.queue[a.head] = episode{}
		a.head++
	}
	if a.head > 1024 && a.head*2 > len(a.queue) {
		a.queue = append(a.queue[:0], a.queue[a.head:]...)
		a.head = 0
	}
}

type diffEntry struct {
	id       uint32
	s, t     uint32
	inS, inT bool
}

// compare finds where the payload just walked (t) differs from the first
// copy (s) and counts each differing pointer once per key.
func (a *analyzer) compare(ks *keyState, s, t summary) {
	if len(s) > 0 && len(t) > 0 && s[0] == t[0] && s[0]>>32 == 0 {
		return // the whole payloads are equal (entry 0 is the root)
	}
	var diffs []diffEntry
	i, j := 0, 0
	for i < len(s) || j < len(t) {
		var d diffEntry
		switch {
		case j >= len(t) || (i < len(s) && s[i]>>32 < t[j]>>32):
			d = diffEntry{id: uint32(s[i] >> 32), s: uint32(s[i]), inS: true}
			i++
		case i >= len(s) || t[j]>>32 < s[i]>>32:
			d = diffEntry{id: uint32(t[j] >> 32), t: uint32(t[j]), inT: true}
			j++
		default:
			if s[i] == t[j] {
				i, j = i+1, j+1
				continue
			}
			d = diffEntry{id: uint32(s[i] >> 32), s: uint32(s[i]), t: uint32(t[j]), inS: true, inT: true}
			i, j = i+1, j+1
		}
		diffs = append(diffs, d)
	}
	// Arrays whose elements changed inside and also moved: match the
	// elements before comparing them, so that a reordered list whose
	// items carry a timestamp reports the timestamp, not every field.
	var matched []uint32
	for _, d := range diffs {
		if d.inS && d.inT && d.s&kindMask == kindArray && d.t&kindMask == kindArray && !a.under(d.id, matched) {
			if a.matchElements(ks, d.id, s) {
				matched = append(matched, d.id)
			}
		}
	}
	for _, d := range diffs {
		info := a.paths.info[d.id]
		if a.under(d.id, matched) {
			continue
		}
		if arr, ok := a.reordered(d.id, s, t); ok {
			a.note(ks, a.paths.info[arr].gen|genReorder, "")
			continue
		}
		if info.order {
			// The order entry of a long array whose elements are the
			// same (else the array itself differs and reports).
			sh, okS := s.find(info.parent)
			th, okT := t.find(info.parent)
			if okS && okT && sh == th {
				a.note(ks, a.paths.info[info.parent].gen|genReorder, "")
			}
			continue
		}
		if d.inS && d.inT && d.s&kindMask == d.t&kindMask && d.s&kindMask != kindScalar {
			continue // a container: what differs inside it reports
		}
		if info.parent != noPath && d.inS != d.inT {
			// Added or removed: report the outermost value only, and
			// nothing below a value that changed its type.
			sh, pS := s.find(info.parent)
			th, pT := t.find(info.parent)
			if pS != pT || sh&kindMask != th&kindMask {
				continue
			}
		}
		example := "(absent)"
		if d.inT {
			example = a.valueOf(d.id)
		}
		a.note(ks, info.gen, example)
	}
}

// under reports whether an ancestor of id is one of arrays.
func (a *analyzer) under(id uint32, arrays []uint32) bool {
	if len(arrays) == 0 {
		return false
	}
	for p := a.paths.info[id].parent; p != noPath; p = a.paths.info[p].parent {
		if slices.Contains(arrays, p) {
			return true
		}
	}
	return false
}

// matchElements pairs the elements of the array at id in the payload just
// walked with those of the first copy (s), each with the one it shares
// most values with. When that pairing beats the elements' own positions,
// the array was reordered: it notes the reorder and what differs inside
// the paired elements, and returns true. Otherwise the positions stand.
func (a *analyzer) matchElements(ks *keyState, id uint32, s summary) bool {
	elems := a.elements(id)
	sElems := a.firstCopyElements(id, s)
	if len(elems) < 2 || len(sElems) < 2 {
		return false
	}
	pair, identity, best := a.pairElements(elems, sElems, s)
	if best <= identity {
		return false
	}
	nodes := a.walker.nodes
	a.note(ks, a.paths.info[id].gen|genReorder, "")
	for i, e := range elems {
		j := pair[i]
		if j < 0 {
			a.note(ks, a.paths.info[nodes[e].id].gen, exampleText(a.canonB[nodes[e].start:nodes[e].end]))
			continue
		}
		a.diffElement(ks, e, sElems[j], s)
	}
	return true
}

// elements are the node indexes of the elements of the array at id in
// the payload just walked, in order; none when it has no such array.
func (a *analyzer) elements(id uint32) []int {
	nodes := a.walker.nodes
	arr := -1
	for i, n := range nodes {
		if n.id == id {
			arr = i
			break
		}
	}
	if arr < 0 {
		return nil
	}
	var elems []int
	for i := arr + 1; i < len(nodes) && nodes[i].start < nodes[arr].end; i++ {
		if nodes[i].parent == int32(arr) {
			elems = append(elems, i)
		}
	}
	return elems
}

// firstCopyElements are the pointers of the elements of the array at id
// in the first copy (s).
func (a *analyzer) firstCopyElements(id uint32, s summary) []string {
	base := a.paths.info[id].ptr
	var sElems []string
	for j := 0; ; j++ {
		ptr := base + "/" + strconv.Itoa(j)
		eid, ok := a.paths.ids[ptr]
		if !ok {
			break
		}
		if _, ok := s.find(eid); !ok {
			break
		}
		sElems = append(sElems, ptr)
	}
	return sElems
}

// pairElements pairs each element (a node index) with the first copy's
// element (sElems, pointers) it shares most values with, greedily in
// order, its own position first among equals. pair[i] is elems[i]'s
// partner in sElems, -1 for none; identity is the values shared by
// position, best by the pairing.
func (a *analyzer) pairElements(elems []int, sElems []string, s summary) (pair []int, identity, best int) {
	pair = make([]int, len(elems))
	used := make([]bool, len(sElems))
	for i, e := range elems {
		if i < len(sElems) {
			identity += a.similarity(e, sElems[i], s)
		}
		pick, score := -1, -1
		for j := range sElems {
			if used[j] {
				continue
			}
			sc := a.similarity(e, sElems[j], s)
			if sc > score || (sc == score && j == i) {
				pick, score = j, sc
			}
		}
		pair[i] = pick
		if pick >= 0 {
			used[pick] = true
			best += score
		}
	}
	return pair, identity, best
}

// similarity counts the values of the element at node e equal at the same
// place in the first copy's element at sElem.
func (a *analyzer) similarity(e int, sElem string, s summary) int {
	nodes := a.walker.nodes
	prefix := a.paths.info[nodes[e].id].ptr
	n := 0
	for k := e; k < len(nodes) && nodes[k].start < nodes[e].end; k++ {
		if nodes[k].kind() != kindScalar || nodes[k].id == noPath {
			continue
		}
		sid, ok := a.paths.ids[sElem+a.paths.info[nodes[k].id].ptr[len(prefix):]]
		if !ok {
			continue
		}
		if h, ok := s.find(sid); ok && h == nodes[k].hash {
			n++
		}
	}
	return n
}

// diffElement notes what differs between T's element at node e and S's
// element at pointer sPtr, place by place. Values only in S's element
// are not named: their pointers are not in T, and a removed field of a
// moved element is rare enough to leave to the positions.
func (a *analyzer) diffElement(ks *keyState, e int, sPtr string, s summary) {
	nodes := a.walker.nodes
	prefix := a.paths.info[nodes[e].id].ptr
	skipUntil := int32(-1)
	for k := e; k < len(nodes) && nodes[k].start < nodes[e].end; k++ {
		n := nodes[k]
		if n.start < skipUntil || n.id == noPath {
			continue
		}
		sid, ok := a.paths.ids[sPtr+a.paths.info[n.id].ptr[len(prefix):]]
		h, found := uint32(0), false
		if ok {
			h, found = s.find(sid)
		}
		switch {
		case !found:
			a.note(ks, a.paths.info[n.id].gen, exampleText(a.canonB[n.start:n.end]))
			skipUntil = n.end
		case h == n.hash:
			skipUntil = n.end
		case h&kindMask != n.kind() || n.kind() == kindScalar:
			a.note(ks, a.paths.info[n.id].gen, exampleText(a.canonB[n.start:n.end]))
			skipUntil = n.end
		}
	}
}

// reordered reports the outermost array above id whose elements are the
// same in both copies, in another order.
func (a *analyzer) reordered(id uint32, s, t summary) (uint32, bool) {
	found, ok := noPath, false
	for p := a.paths.info[id].parent; p != noPath; p = a.paths.info[p].parent {
		sh, okS := s.find(p)
		th, okT := t.find(p)
		if okS && okT && sh == th && sh&kindMask == kindArray {
			found, ok = p, true
		}
	}
	return found, ok
}

// valueOf returns the value at id in the payload just walked, clipped, as
// an example.
func (a *analyzer) valueOf(id uint32) string {
	for _, n := range a.walker.nodes {
		if n.id == id {
			return exampleText(a.canonB[n.start:n.end])
		}
	}
	return ""
}

func exampleText(b []byte) string {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' {
		if u, err := strconv.Unquote(s); err == nil {
			s = u
		}
	}
	const maxLen = 48
	if len(s) > maxLen {
		cut := maxLen
		for cut > 0 && s[cut]&0xC0 == 0x80 {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// note counts gen for the key once, and keeps up to two distinct examples.
func (a *analyzer) note(ks *keyState, gen uint32, example string) {
	if slices.Contains(ks.diffs, gen) {
		a.addExample(gen, example)
		return
	}
	ks.diffs = append(ks.diffs, gen)
	m := a.pointers
	if gen&genReorder != 0 {
		m = a.reorders
	}
	st := m[gen&^genReorder]
	if st == nil {
		st = &pointerStats{}
		m[gen&^genReorder] = st
	}
	st.keys++
	a.addExample(gen, example)
}

func (a *analyzer) addExample(gen uint32, example string) {
	if gen&genReorder != 0 || example == "" {
		return
	}
	st := a.pointers[gen]
	if len(st.examples) < 2 && !slices.Contains(st.examples, example) {
		st.examples = append(st.examples, example)
	}
}

func (a *analyzer) gen(id uint32) string { return a.paths.gens[id] }

func (a *analyzer) String() string {
	return fmt.Sprintf("audit of %d records, %d keys", a.records, len(a.keys))
}
