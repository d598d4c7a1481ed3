package redisstore

import (
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// The compact entry: what a window's keys cost in Redis is mostly their
// entries, and the text entry spells out what a reader never needs as
// text. The compact entry keeps every field a decision or a completion
// reads, in binary, and leaves out what the reader already has:
//
//	byte 0      the state: 1 PENDING, 2 SUCCESS, 3 FAILED, plus flags of
//	            the intent (compactIntent … compactFloorText); below 32,
//	            where a text entry starts with a letter
//	byte 1      flags (compactFingerprint … compactKey below)
//	fingerprint 32 bytes of SHA-256, or a text
//	rules       the first 8 bytes of the SHA-256 rules digest, or a text
//	holder      a PENDING entry's holder as text; a finished entry's as the
//	            first 4 bytes of its SHA-1
//	source      the owner's record: the first 4 bytes of the SHA-1 of its
//	            topic, the partition and the offset, or a text
//	first       the first copy's record, as source, unless it is source
//	result      partition and offset
//	intent      partition and floor (a finished entry's where it has one:
//	            as the floor's distance below the result's offset when
//	            they share a partition); a floor beyond the numbers'
//	            range as a text
//	times       the window's start (ms), its end and the lease's end as
//	            differences from it
//	key         the key when its name holds its hash, else its length
//
// A text is a varint length and its bytes; numbers are zig-zag varints.
//
// What is stored as a hash is given back by the reader of the entry: the
// key from the name read; the holder, rules digest and topic from the
// request or completion that reads it (readContext), and for a lookup the
// topics the store was told of (WithSourceTopics). A hash that matches
// none reads as "#" and its hex (a holder, a topic) or as the digest's
// first 16 hex digits (rules), which no request carries: compared with a
// request, it differs, as the full value would. Encoding those forms
// again gives the same bytes, so an entry read and written back without
// the value is unchanged.
//
// The hashes decide nothing alone. A finished entry's holder is compared
// only in "the same completion again" (decide.Complete), beside the state
// and the result's position. A FAILED completion has no position, so two
// holders of one key (a takeover of the same record) that both fail it
// are told apart by 32 bits alone: the stale one's completion passes for
// done with a chance of 2^-32, and changes nothing (a FAILED entry stays
// as it is; its dead letter was written before it completed). A rules
// digest's 64 bits tell one set of rules from another; a topic's 32 bits
// tell the pipeline's input from another topic after a change of input,
// beside the partition and offset.
//
// A store that writes text writes an entry it read compact back as text
// once it resolved every hash in it, and compact while it did not
// (appendEntryOver): compact entries end once no store writes them. An
// entry with a number beyond maxCompactInt (but an intent's floor, kept
// as text) is written as text; no entry the pipeline or the front door
// makes has one.
//
// Go and entry.lua write the same bytes for the same entry
// (TestLuaWritesWhatGoWrites); FuzzDecodeCompact holds the decoder to
// never panic and to decode only what it can encode again.

// Flags of byte 1.
const (
	compactFingerprint = 1 << iota // a 32-byte SHA-256
	compactRules                   // 8 bytes of a SHA-256 digest
	compactHolderHash              // 4 bytes of the holder's SHA-1
	compactSourceNum               // the source as topic hash, partition, offset
	compactFirstSame               // the first source is the source
	compactFirstNum                // the first source as topic hash, partition, offset
	compactLease                   // the lease's end follows the window's
	compactKey                     // the key follows, to the end; else its length
)

// The state in byte 0's two low bits. 0 is none: kept for a later
// format, which this release reads as no entry of its own and refuses to
// decide over (entry.lua, load).
const (
	compactPending byte = 1
	compactSuccess byte = 2
	compactFailed  byte = 3
)

// Flags of byte 0, beside the state.
const (
	compactIntent    = 4  // a finished entry keeps an intent (a PENDING one always does)
	compactIntentRel = 8  // the intent is the result's partition, its floor the distance below the result's offset
	compactFloorText = 16 // the intent's floor is a text (beyond maxCompactInt)
)

// maxCompactOffset bounds the offsets written as numbers: entry.lua reads
// them into doubles, exact below 2^53.
const maxCompactOffset = 1e15

// readContext is what the reader of an entry knows that a compact entry
// keeps only a hash of: the name it read (which holds the key), the
// holder, rules digest and topic of the request or completion that reads
// it, and the other topics the store knows.
type readContext struct {
	name   string
	holder string
	rules  string
	topic  string
	// source is the reader's own source when it parses (topic, part,
	// off): an entry that names it gets this string back, not a new one.
	source    string
	part, off uint64
	// What the store was told to give back (WithSourceTopics,
	// WithRulesDigests).
	topics, digests []string
}

func (s *Store) readContext(name, holder, rules, source string) readContext {
	c := readContext{name: name, holder: holder, rules: rules, topics: s.topics, digests: s.digests}
	if topic, p, o, ok := splitSource(source); ok {
		c.topic, c.source, c.part, c.off = topic, source, p, o
	}
	return c
}

// requestContext is the context of a decision's read.
func (s *Store) requestContext(name string, r dedupe.DecideRequest) readContext {
	return s.readContext(name, r.Owner.Holder, r.RulesDigest, r.Owner.Source)
}

var errNotEntry = errors.New("stored entry is not an idemstream entry")

// maxCompactInt bounds the numbers of a compact entry: entry.lua reads
// them into doubles, which hold integers exactly below 2^53, and a
// number is written zig-zag, twice its size.
const maxCompactInt = 1 << 52

// compactable reports whether e's numbers are within maxCompactInt: an
// entry with one beyond is written as text, which keeps any number.
func compactable(e *dedupe.Entry) bool {
	ws := e.WindowStart.UnixMilli()
	lease := int64(0)
	if !e.LeaseUntil.IsZero() {
		lease = e.LeaseUntil.UnixMilli() - ws
	}
	for _, v := range [...]int64{e.Result.Offset, ws, e.ExpiresAt.UnixMilli() - ws, lease} {
		if !inCompactRange(v) {
			return false
		}
	}
	return true
}

func inCompactRange(v int64) bool { return -maxCompactInt < v && v < maxCompactInt }

// appendIntent appends e's intent, if it keeps one, and returns the flags
// of byte 0 that say how.
func appendIntent(b []byte, e *dedupe.Entry) ([]byte, byte) {
	var flags byte
	finished := e.State != dedupe.Pending
	if finished {
		if e.Intent == (dedupe.Intent{Partition: -1, Floor: dedupe.NoPosition}) {
			return b, 0
		}
		flags |= compactIntent
	}
	floor := e.Intent.Floor
	switch {
	case finished && e.Intent.Partition == e.Result.Partition && inCompactRange(floor) && inCompactRange(e.Result.Offset-floor):
		return appendZigzag(b, e.Result.Offset-floor), flags | compactIntentRel
	case inCompactRange(floor):
		return appendZigzag(appendZigzag(b, int64(e.Intent.Partition)), floor), flags
	}
	return appendText(appendZigzag(b, int64(e.Intent.Partition)), strconv.FormatInt(floor, 10)), flags | compactFloorText
}

// appendCompact appends e's compact encoding, or its text encoding when
// it has a number no compact entry holds.
func appendCompact(b []byte, e *dedupe.Entry) []byte {
	if !compactable(e) {
		return appendTextEntry(b, e)
	}
	var state byte
	switch e.State {
	case dedupe.Pending:
		state = compactPending
	case dedupe.Success:
		state = compactSuccess
	case dedupe.Failed:
		state = compactFailed
	}
	at := len(b)
	b = append(b, state, 0)
	var flags byte
	if fp, ok := sha256Hex(e.Fingerprint, 64); ok {
		flags |= compactFingerprint
		b = appendHexBytes(b, fp)
	} else {
		b = appendText(b, e.Fingerprint)
	}
	if rd, ok := sha256Hex(e.RulesDigest, 16); ok {
		flags |= compactRules
		b = appendHexBytes(b, rd[:16])
	} else {
		b = appendText(b, e.RulesDigest)
	}
	if e.State != dedupe.Pending {
		flags |= compactHolderHash
		b = appendHash(b, e.Owner.Holder)
	} else {
		b = appendText(b, e.Owner.Holder)
	}
	var num bool
	if b, num = appendSource(b, e.Owner.Source); num {
		flags |= compactSourceNum
	}
	if e.FirstSource == e.Owner.Source {
		flags |= compactFirstSame
	} else if b, num = appendSource(b, e.FirstSource); num {
		flags |= compactFirstNum
	}
	b = appendZigzag(appendZigzag(b, int64(e.Result.Partition)), e.Result.Offset)
	b, intent := appendIntent(b, e)
	b[at] |= intent
	ws := e.WindowStart.UnixMilli()
	b = appendZigzag(appendZigzag(b, ws), e.ExpiresAt.UnixMilli()-ws)
	if !e.LeaseUntil.IsZero() {
		flags |= compactLease
		b = appendZigzag(b, e.LeaseUntil.UnixMilli()-ws)
	}
	if len(e.Key) > maxKeyInName {
		flags |= compactKey
		b = append(b, e.Key...)
	} else {
		b = binary.AppendUvarint(b, uint64(len(e.Key)))
	}
	b[at+1] = flags
	return b
}

// decodeCompact decodes a compact entry read under c.
func decodeCompact(e *dedupe.Entry, raw string, c readContext) error {
	if len(raw) < 2 {
		return errNotEntry
	}
	state, intent, ok := compactState(raw[0])
	if !ok {
		return errNotEntry
	}
	e.State = state
	flags := raw[1]
	r := compactReader{raw: raw, pos: 2}
	// Each field is read in the one form appendCompact writes it in: an
	// entry that spells a digest or a record's source as a text, say, was
	// not written by it, and is no entry.
	if flags&compactFingerprint != 0 {
		e.Fingerprint = sha256Text(r.next(32))
	} else if e.Fingerprint = r.text(); isDigest(e.Fingerprint, 64) {
		r.err = errNotEntry
	}
	if flags&compactRules != 0 {
		e.RulesDigest = c.rulesOf(r.next(8))
	} else if e.RulesDigest = r.text(); isDigest(e.RulesDigest, 16) {
		r.err = errNotEntry
	}
	if (flags&compactHolderHash != 0) != (e.State != dedupe.Pending) {
		r.err = errNotEntry
	}
	if flags&compactHolderHash != 0 {
		e.Owner.Holder = resolveHash(r.next(4), c.holder)
	} else {
		e.Owner.Holder = r.text()
	}
	e.Owner.Source = r.source(flags&compactSourceNum != 0, c)
	switch {
	case flags&compactFirstSame != 0:
		e.FirstSource = e.Owner.Source
		if flags&compactFirstNum != 0 {
			r.err = errNotEntry
		}
	default:
		if e.FirstSource = r.source(flags&compactFirstNum != 0, c); e.FirstSource == e.Owner.Source {
			r.err = errNotEntry
		}
	}
	e.Result = dedupe.ResultRef{Partition: r.int32(), Offset: r.zigzag()}
	e.Intent = dedupe.Intent{Partition: -1, Floor: dedupe.NoPosition}
	if e.State == dedupe.Pending || intent&compactIntent != 0 {
		e.Intent = r.intent(intent, e.Result)
	}
	ws := r.zigzag()
	e.WindowStart = time.UnixMilli(ws)
	e.ExpiresAt = time.UnixMilli(ws + r.zigzag())
	if flags&compactLease != 0 {
		e.LeaseUntil = time.UnixMilli(ws + r.zigzag())
	}
	e.Key = r.key(flags&compactKey != 0, c.name)
	if r.err != nil || r.pos != len(r.raw) {
		return errNotEntry
	}
	return nil
}

// compactState reads byte 0: the state and the intent's flags, which a
// PENDING entry never has (it always keeps an intent) and a finished one
// has only with compactIntent.
func compactState(b byte) (state dedupe.State, intent byte, ok bool) {
	switch b & 3 {
	case compactPending:
		state = dedupe.Pending
	case compactSuccess:
		state = dedupe.Success
	case compactFailed:
		state = dedupe.Failed
	default:
		return "", 0, false
	}
	intent = b &^ 3
	if b >= 32 || state == dedupe.Pending && intent&compactIntent != 0 ||
		state != dedupe.Pending && intent != 0 && intent&compactIntent == 0 {
		return "", 0, false
	}
	return state, intent, true
}

// key reads the key: kept, the rest of the entry (only a key too long
// for a name is); else its length, and the key from the name read, which
// ends with ":<key>}".
func (r *compactReader) key(kept bool, name string) string {
	if kept {
		k := r.raw[r.pos:]
		if r.pos = len(r.raw); len(k) <= maxKeyInName {
			r.err = errNotEntry
		}
		return k
	}
	n := r.uvarint()
	if end := len(name) - 1; r.err == nil && n <= maxKeyInName && n <= uint64(end) {
		return name[end-int(n) : end]
	}
	r.err = errNotEntry
	return ""
}

// compactReader reads a compact entry's fields; the first error sticks.
type compactReader struct {
	raw string
	pos int
	err error
}

func (r *compactReader) next(n int) string {
	if r.err != nil || n < 0 || n > len(r.raw)-r.pos {
		r.err = errNotEntry
		return ""
	}
	s := r.raw[r.pos : r.pos+n]
	r.pos += n
	return s
}

func (r *compactReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	// Ten bytes at most, as encoding/binary reads them.
	v, n := binary.Uvarint([]byte(r.raw[r.pos:min(len(r.raw), r.pos+binary.MaxVarintLen64)]))
	if n <= 0 || v >= 1<<53 {
		r.err = errNotEntry
		return 0
	}
	r.pos += n
	return v
}

func (r *compactReader) zigzag() int64 {
	u := r.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (r *compactReader) int32() int32 {
	v := r.zigzag()
	if int64(int32(v)) != v {
		r.err = errNotEntry
	}
	return int32(v)
}

// intent reads an intent written with the flags of byte 0 in flags.
func (r *compactReader) intent(flags byte, result dedupe.ResultRef) dedupe.Intent {
	switch {
	case flags&compactIntentRel != 0 && flags&compactFloorText != 0:
		r.err = errNotEntry
	case flags&compactIntentRel != 0:
		return dedupe.Intent{Partition: result.Partition, Floor: result.Offset - r.zigzag()}
	case flags&compactFloorText != 0:
		p, s := r.int32(), r.text()
		floor, err := strconv.ParseInt(s, 10, 64)
		if err != nil || strconv.FormatInt(floor, 10) != s {
			r.err = errNotEntry
		}
		return dedupe.Intent{Partition: p, Floor: floor}
	}
	return dedupe.Intent{Partition: r.int32(), Floor: r.zigzag()}
}

func (r *compactReader) text() string {
	n := r.uvarint()
	if n > uint64(len(r.raw)) {
		r.err = errNotEntry
		return ""
	}
	return r.next(int(n))
}

// source reads a source, as numbers (num) or as a text.
func (r *compactReader) source(num bool, c readContext) string {
	if !num {
		s := r.text()
		if _, _, _, ok := splitSource(s); ok {
			r.err = errNotEntry
		}
		return s
	}
	h := r.next(4)
	p, o := r.uvarint(), r.uvarint()
	if r.err != nil || p > 1<<31-1 || o >= maxCompactOffset {
		r.err = errNotEntry
		return ""
	}
	if c.source != "" && p == c.part && o == c.off && sameHash(c.topic, h) {
		// What topicOf and the numbers would spell: splitSource takes
		// only canonical numbers, and topicOf tries c.topic first.
		return c.source
	}
	return c.topicOf(h) + "/" + strconv.FormatUint(p, 10) + "/" + strconv.FormatUint(o, 10)
}

// rulesOf is the rules digest whose first 8 bytes are raw: the reader's,
// one the store knows, or the text of those 8 bytes ("sha256:" and 16 hex
// digits), made only then: the reader's may be that text already (a
// completion passes the digest of the entry it read before).
func (c readContext) rulesOf(raw string) string {
	var buf [23]byte
	rd := hex.AppendEncode(append(buf[:0], "sha256:"...), []byte(raw))
	if len(c.rules) == 71 && c.rules[:23] == string(rd) {
		return c.rules
	}
	for _, d := range c.digests {
		if len(d) == 71 && d[:23] == string(rd) {
			return d
		}
	}
	if c.rules == string(rd) {
		return c.rules
	}
	return string(rd)
}

// topicOf is the topic whose hash is h: the reader's, one the store knows,
// or h's unresolved form.
func (c readContext) topicOf(h string) string {
	if c.topic != "" && sameHash(c.topic, h) {
		return c.topic
	}
	for _, t := range c.topics {
		if sameHash(t, h) {
			return t
		}
	}
	return "#" + hex.EncodeToString([]byte(h))
}

// appendSource appends a source, as numbers where it is a Kafka record's
// (topic/partition/offset, in the forms entry.lua writes alike).
func appendSource(b []byte, source string) ([]byte, bool) {
	topic, p, o, ok := splitSource(source)
	if !ok {
		return appendText(b, source), false
	}
	b = appendHash(b, topic)
	return binary.AppendUvarint(binary.AppendUvarint(b, p), o), true
}

// splitSource splits topic/partition/offset: a topic of Kafka's
// characters (or a hash as decodeCompact writes it), numbers in their
// shortest decimal form, the offset below maxCompactOffset.
func splitSource(s string) (topic string, p, o uint64, ok bool) {
	i := lastSlash(s)
	if i < 0 {
		return "", 0, 0, false
	}
	j := lastSlash(s[:i])
	if j <= 0 {
		return "", 0, 0, false
	}
	topic = s[:j]
	if !kafkaTopic(topic) && !hashForm(topic) {
		return "", 0, 0, false
	}
	p, okP := decimal(s[j+1 : i])
	o, okO := decimal(s[i+1:])
	if !okP || !okO || p > 1<<31-1 || o >= maxCompactOffset {
		return "", 0, 0, false
	}
	return topic, p, o, true
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}

// decimal reads digits without a sign or a leading zero (but "0").
func decimal(s string) (uint64, bool) {
	if s == "" || len(s) > 15 || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		v = v*10 + uint64(s[i]-'0')
	}
	return v, true
}

func kafkaTopic(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// hashForm reports whether s is a hash as decodeCompact writes one it
// cannot resolve: "#" and 8 lowercase hex digits.
func hashForm(s string) bool {
	if len(s) != 9 || s[0] != '#' {
		return false
	}
	return lowerHex(s[1:])
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if hexNibble[s[i]] > 0xf {
			return false
		}
	}
	return true
}

// hexNibble is the value of each lowercase hex digit, and 0xff for every
// other byte: one load a character where digests are checked and decoded
// for every entry written and read.
var hexNibble = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c-'a') + 10
	}
	return t
}()

// appendHexBytes appends the bytes that s, an even number of lowercase
// hex digits (checked by the caller), spells.
func appendHexBytes(b []byte, s string) []byte {
	for i := 0; i+1 < len(s); i += 2 {
		b = append(b, hexNibble[s[i]]<<4|hexNibble[s[i+1]])
	}
	return b
}

func isDigest(s string, n int) bool {
	_, ok := sha256Hex(s, n)
	return ok
}

// sha256Hex returns the hex of "sha256:<hex>" when it has n or 64 lowercase
// hex digits (n: what an unresolved rules digest keeps).
func sha256Hex(s string, n int) (string, bool) {
	if len(s) < 7 || s[:7] != "sha256:" {
		return "", false
	}
	h := s[7:]
	return h, (len(h) == 64 || len(h) == n) && lowerHex(h)
}

// sameHash reports whether h is the hash of s.
func sameHash(s, h string) bool {
	sum := hash4(s)
	return string(sum[:]) == h
}

// hash4 is the 4 bytes a compact entry keeps of a holder or a topic. The
// last few names hashed are remembered: a
// process hashes the same holders (one a partition it owns) and topics
// again for every entry it completes or reads.
func hash4(s string) [4]byte {
	slot := &hashMemo[(len(s)*31+int(lastByte(s)))%len(hashMemo)]
	if m := slot.Load(); m != nil && m.s == s {
		return m.sum
	}
	var sum [sha1.Size]byte
	if len(s) <= 128 {
		// Copied to the stack first: a conversion keeps 32 bytes at
		// most there.
		var buf [128]byte
		sum = sha1.Sum(append(buf[:0], s...))
	} else {
		sum = sha1.Sum([]byte(s))
	}
	m := &memoHash{s: s, sum: [4]byte(sum[:4])}
	slot.Store(m)
	return m.sum
}

var hashMemo [64]atomic.Pointer[memoHash]

type memoHash struct {
	s   string
	sum [4]byte
}

func lastByte(s string) byte {
	if s == "" {
		return 0
	}
	return s[len(s)-1]
}

// appendHash appends the hash of s, or the bytes of a hash in its
// unresolved form.
func appendHash(b []byte, s string) []byte {
	if hashForm(s) {
		return appendHexBytes(b, s[1:])
	}
	h := hash4(s)
	return append(b, h[:]...)
}

// sha256Text is the text form of the digest (or prefix of one) raw, in
// one allocation.
func sha256Text(raw string) string {
	var buf [7 + 2*32]byte
	b := append(buf[:0], "sha256:"...)
	return string(hex.AppendEncode(b, []byte(raw)))
}

// resolveHash gives back known when h is its hash, else h's unresolved
// form.
func resolveHash(h, known string) string {
	if known != "" && sameHash(known, h) {
		return known
	}
	return "#" + hex.EncodeToString([]byte(h))
}

func appendText(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendZigzag(b []byte, v int64) []byte {
	return binary.AppendUvarint(b, uint64(v<<1)^uint64(v>>63))
}
