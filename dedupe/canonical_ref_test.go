package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// The reference canonicalizer: the straightforward recursive parser and
// emitter the optimized code replaced, kept to test it against. Every
// payload must give both the same canonical bytes or the same error.

const (
	// refFlagEscaped marks a string token that contains a backslash escape.
	refFlagEscaped uint8 = 1 << iota
	// refFlagKeyDecoded marks a member whose name had escapes and was decoded
	// into refParser.names; keyStart and keyEnd then index that buffer.
	refFlagKeyDecoded
	// refFlagPlainNumber marks an integer literal of at most 21 digits, which
	// is already in canonical form except for "-0".
	refFlagPlainNumber
)

// refNode is one value of a parsed payload. Nodes are stored in document
// (pre-)order in one flat slice, so a container's first child is the node
// right after it and each node knows where its subtree ends.
type refNode struct {
	start, end       int32 // the value's bytes, quotes and brackets included
	keyStart, keyEnd int32 // member name without quotes, in the payload or in refParser.names
	keyQuote         int32 // offset of the member name's opening quote
	next             int32 // index of the first node after this subtree
	count            int32 // number of members or elements
	order            int32 // objects: start of the members' sorted indices in refParser.order
	kind             valueKind
	flags            uint8
}

// refParser validates a payload and records its structure. It keeps every
// buffer between uses; see refScratch.
type refParser struct {
	data  []byte
	pos   int
	nodes []refNode
	order []int32        // for each object, its member nodes sorted by name
	names []byte         // decoded member names that had escapes
	keys  []refMemberKey // one object's members while they are sorted
	num   []byte         // digit buffer for number formatting
}

func (p *refParser) skipSpace() {
	for p.pos < len(p.data) && isJSONSpace(p.data[p.pos]) {
		p.pos++
	}
}

// parse validates data as one JSON text and records its nodes.
func (p *refParser) parse(data []byte) error {
	if len(data) > math.MaxInt32 {
		return malformedAt(math.MaxInt32, "payload larger than 2 GiB")
	}
	p.data = data
	p.pos = 0
	p.nodes = p.nodes[:0]
	p.order = p.order[:0]
	p.names = p.names[:0]
	p.skipSpace()
	if err := p.value(0); err != nil {
		return err
	}
	p.skipSpace()
	if p.pos < len(p.data) {
		return malformedAt(p.pos, "trailing data after the top-level value")
	}
	return nil
}

func (p *refParser) eof() error { return malformedAt(len(p.data), "unexpected end of input") }

// value parses the value at p.pos; depth is the number of containers
// enclosing it.
func (p *refParser) value(depth int) error {
	if p.pos >= len(p.data) {
		return p.eof()
	}
	start := p.pos
	switch c := p.data[p.pos]; c {
	case '{':
		return p.object(depth + 1)
	case '[':
		return p.array(depth + 1)
	case '"':
		end, escaped, err := p.scanString(start)
		if err != nil {
			return err
		}
		var fl uint8
		if escaped {
			fl = refFlagEscaped
		}
		p.pos = end
		p.nodes = append(p.nodes, refNode{kind: vString, flags: fl, start: int32(start), end: int32(end), next: int32(len(p.nodes) + 1)})
		return nil
	case 't':
		return p.literal("true", vTrue)
	case 'f':
		return p.literal("false", vFalse)
	case 'n':
		return p.literal("null", vNull)
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return p.number()
		}
		return malformedAt(start, "invalid character "+describeByte(c)+" looking for a value")
	}
}

func (p *refParser) literal(word string, k valueKind) error {
	start := p.pos
	end := start + len(word)
	if end > len(p.data) || string(p.data[start:end]) != word {
		for i := 0; i < len(word); i++ {
			if start+i >= len(p.data) {
				return p.eof()
			}
			if p.data[start+i] != word[i] {
				return malformedAt(start+i, "invalid character "+describeByte(p.data[start+i])+" in literal "+word)
			}
		}
	}
	p.pos = end
	p.nodes = append(p.nodes, refNode{kind: k, start: int32(start), end: int32(end), next: int32(len(p.nodes) + 1)})
	return nil
}

func (p *refParser) number() error {
	d := p.data
	start := p.pos
	i := start
	if d[i] == '-' {
		i++
	}
	if i >= len(d) {
		return p.eof()
	}
	intStart := i
	switch {
	case d[i] == '0':
		i++
	case d[i] >= '1' && d[i] <= '9':
		i++
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		return malformedAt(i, "invalid character "+describeByte(d[i])+" in number")
	}
	plain := i-intStart <= 21
	if i < len(d) && d[i] == '.' {
		plain = false
		i++
		if i >= len(d) {
			return p.eof()
		}
		if d[i] < '0' || d[i] > '9' {
			return malformedAt(i, "invalid character "+describeByte(d[i])+" after decimal point")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		plain = false
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) {
			return p.eof()
		}
		if d[i] < '0' || d[i] > '9' {
			return malformedAt(i, "invalid character "+describeByte(d[i])+" in exponent")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	var fl uint8
	if plain {
		fl = refFlagPlainNumber
	}
	p.pos = i
	p.nodes = append(p.nodes, refNode{kind: vNumber, flags: fl, start: int32(start), end: int32(i), next: int32(len(p.nodes) + 1)})
	return nil
}

// scanString validates the string whose opening quote is at start and
// returns the offset just past its closing quote.
func (p *refParser) scanString(start int) (end int, escaped bool, err error) {
	d := p.data
	i := start + 1
	for i < len(d) {
		if i+8 <= len(d) {
			// Eight bytes at a time: flag each control character, quote,
			// backslash and non-ASCII byte with the "has a zero byte"
			// tests. They can flag a byte after a real hit, never one
			// before it, so the lowest flag is the first byte to handle.
			x := binary.LittleEndian.Uint64(d[i:])
			q, b := x^(lsb*'"'), x^(lsb*'\\')
			hits := (x | (x-lsb*0x20)&^x | (q-lsb)&^q | (b-lsb)&^b) & msb
			if hits == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(hits) >> 3
		} else if stringSafe[d[i]] {
			i++
			continue
		}
		c := d[i]
		switch {
		case c == '"':
			return i + 1, escaped, nil
		case c == '\\':
			escaped = true
			n, err := p.checkEscape(i)
			if err != nil {
				return 0, false, err
			}
			i += n
		case c < 0x20:
			return 0, false, malformedAt(i, "control character 0x"+strconv.FormatUint(uint64(c), 16)+" in string")
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, false, malformedAt(i, "invalid utf-8")
			}
			i += size
		}
	}
	return 0, false, malformedAt(start, "unterminated string")
}

// checkEscape validates the escape sequence at i and returns its length.
func (p *refParser) checkEscape(i int) (int, error) {
	d := p.data
	if i+1 >= len(d) {
		return 0, p.eof()
	}
	switch d[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
	default:
		return 0, malformedAt(i, "invalid escape \\"+describeEscapeByte(d[i+1]))
	}
	r, ok := hex4(d, i+2)
	if !ok {
		return 0, malformedAt(i, `invalid \u escape`)
	}
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return 0, malformedAt(i, "lone surrogate \\u"+strconv.FormatUint(uint64(r), 16))
	case r >= 0xD800 && r <= 0xDBFF:
		if i+7 < len(d) && d[i+6] == '\\' && d[i+7] == 'u' {
			if r2, ok := hex4(d, i+8); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
				return 12, nil
			}
		}
		return 0, malformedAt(i, "lone surrogate \\u"+strconv.FormatUint(uint64(r), 16))
	}
	return 6, nil
}

func (p *refParser) array(depth int) error {
	start := p.pos
	if depth > MaxNestingDepth {
		return malformedAt(start, "nesting deeper than "+strconv.Itoa(MaxNestingDepth)+" levels")
	}
	idx := len(p.nodes)
	p.nodes = append(p.nodes, refNode{kind: vArray, start: int32(start)})
	p.pos++
	p.skipSpace()
	count := int32(0)
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		for {
			if err := p.value(depth); err != nil {
				return err
			}
			count++
			p.skipSpace()
			if p.pos >= len(p.data) {
				return p.eof()
			}
			c := p.data[p.pos]
			p.pos++
			if c == ']' {
				break
			}
			if c != ',' {
				return malformedAt(p.pos-1, "invalid character "+describeByte(c)+" after array element")
			}
			p.skipSpace()
		}
	}
	n := &p.nodes[idx]
	n.end = int32(p.pos)
	n.count = count
	n.next = int32(len(p.nodes))
	return nil
}

func (p *refParser) object(depth int) error {
	start := p.pos
	if depth > MaxNestingDepth {
		return malformedAt(start, "nesting deeper than "+strconv.Itoa(MaxNestingDepth)+" levels")
	}
	idx := len(p.nodes)
	p.nodes = append(p.nodes, refNode{kind: vObject, start: int32(start)})
	p.pos++
	p.skipSpace()
	count := int32(0)
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
	} else {
		for {
			if p.pos >= len(p.data) {
				return p.eof()
			}
			if c := p.data[p.pos]; c != '"' {
				return malformedAt(p.pos, "invalid character "+describeByte(c)+" looking for a member name")
			}
			quote := p.pos
			end, escaped, err := p.scanString(quote)
			if err != nil {
				return err
			}
			keyStart, keyEnd := int32(quote+1), int32(end-1)
			var fl uint8
			if escaped {
				fl = refFlagKeyDecoded
				ns := len(p.names)
				p.names = appendDecoded(p.names, p.data[quote+1:end-1])
				keyStart, keyEnd = int32(ns), int32(len(p.names))
			}
			p.pos = end
			p.skipSpace()
			if p.pos >= len(p.data) {
				return p.eof()
			}
			if c := p.data[p.pos]; c != ':' {
				return malformedAt(p.pos, "invalid character "+describeByte(c)+" after member name")
			}
			p.pos++
			p.skipSpace()
			v := len(p.nodes)
			if err := p.value(depth); err != nil {
				return err
			}
			vn := &p.nodes[v]
			vn.keyStart, vn.keyEnd, vn.keyQuote = keyStart, keyEnd, int32(quote)
			vn.flags |= fl
			count++
			p.skipSpace()
			if p.pos >= len(p.data) {
				return p.eof()
			}
			c := p.data[p.pos]
			p.pos++
			if c == '}' {
				break
			}
			if c != ',' {
				return malformedAt(p.pos-1, "invalid character "+describeByte(c)+" after object member")
			}
			p.skipSpace()
		}
	}
	n := &p.nodes[idx]
	n.end = int32(p.pos)
	n.count = count
	n.next = int32(len(p.nodes))
	n.order = int32(len(p.order))
	return p.sortMembers(idx, count)
}

// refMemberKey pairs a member's decoded name with its node while an object's
// members are sorted, so comparisons do not chase node indices.
type refMemberKey struct {
	name []byte
	node int32
}

// sortMembers records the object's members in canonical order and rejects
// duplicate names, which sorting brings next to each other.
func (p *refParser) sortMembers(idx int, count int32) error {
	keys := p.keys[:0]
	child := int32(idx + 1)
	for k := int32(0); k < count; k++ {
		keys = append(keys, refMemberKey{p.key(child), child})
		child = p.nodes[child].next
	}
	p.keys = keys
	if len(keys) > 1 {
		tied := true
		// Most objects are small; insertion sort with the comparison
		// inlined beats the generic sort's overhead there. It compares
		// every two members that end up next to each other, so a
		// duplicate name shows as a tie.
		if len(keys) <= 12 {
			tied = false
			for i := 1; i < len(keys); i++ {
				k := keys[i]
				j := i
				for ; j > 0; j-- {
					cmp := compareUTF16(k.name, keys[j-1].name)
					if cmp >= 0 {
						tied = tied || cmp == 0
						break
					}
					keys[j] = keys[j-1]
				}
				keys[j] = k
			}
		} else {
			slices.SortFunc(keys, func(a, b refMemberKey) int { return compareUTF16(a.name, b.name) })
		}
		if tied {
			if err := p.checkDuplicates(keys); err != nil {
				return err
			}
		}
	}
	for _, k := range keys {
		p.order = append(p.order, k.node)
	}
	return nil
}

func (p *refParser) checkDuplicates(keys []refMemberKey) error {
	dup := -1
	var dupName []byte
	for k := 1; k < len(keys); k++ {
		if string(keys[k-1].name) != string(keys[k].name) {
			continue
		}
		// Report the later of the two occurrences, and the earliest such
		// one, so the message points where a reader would first notice.
		off := int(max(p.nodes[keys[k-1].node].keyQuote, p.nodes[keys[k].node].keyQuote))
		if dup < 0 || off < dup {
			dup, dupName = off, keys[k].name
		}
	}
	if dup >= 0 {
		return malformedAt(dup, "duplicate member name "+quoteName(dupName))
	}
	return nil
}

// key returns the decoded name of member node i.
func (p *refParser) key(i int32) []byte {
	n := &p.nodes[i]
	if n.flags&refFlagKeyDecoded != 0 {
		return p.names[n.keyStart:n.keyEnd]
	}
	return p.data[n.keyStart:n.keyEnd]
}

type refSpan struct{ start, end int }

type refScratch struct {
	refParser
	states []int32   // active path-matcher states, one run per open level
	spans  []refSpan // element spans of unordered arrays being emitted
	tmp    []byte    // copy of an unordered array's elements while they are reordered
}

// refEmitter writes the canonical form of a parsed payload.
type refEmitter struct {
	s *refScratch
	m *pathMatcher
}

// emit appends the canonical form of node i. The path-matcher states that
// the node's path reached are s.states[lo:hi]; unordered says whether one of
// them marks the node unordered.
func (e *refEmitter) emit(dst []byte, i, lo, hi int32, unordered bool) []byte {
	s := e.s
	n := &s.nodes[i]
	switch n.kind {
	case vNull:
		return append(dst, "null"...)
	case vTrue:
		return append(dst, "true"...)
	case vFalse:
		return append(dst, "false"...)
	case vNumber:
		lit := s.data[n.start:n.end]
		if n.flags&refFlagPlainNumber != 0 {
			if len(lit) == 2 && lit[0] == '-' && lit[1] == '0' {
				return append(dst, '0')
			}
			return append(dst, lit...)
		}
		var out []byte
		out, s.num = appendNumber(dst, lit, s.num)
		return out
	case vString:
		if n.flags&refFlagEscaped == 0 {
			return append(dst, s.data[n.start:n.end]...)
		}
		return appendEscapedString(dst, s.data[n.start+1:n.end-1])
	case vObject:
		return e.emitObject(dst, n, lo, hi)
	default:
		return e.emitArray(dst, i, n, lo, hi, unordered)
	}
}

func (e *refEmitter) emitObject(dst []byte, n *refNode, lo, hi int32) []byte {
	s := e.s
	dst = append(dst, '{')
	members := s.order[n.order : n.order+n.count]
	first := true
	for _, m := range members {
		childLo := int32(len(s.states))
		var fl matchFlags
		if lo < hi {
			fl = e.m.stepName(&s.states, lo, hi, s.key(m))
			if fl&matchVolatile != 0 {
				s.states = s.states[:childLo]
				continue
			}
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		mn := &s.nodes[m]
		if mn.flags&refFlagKeyDecoded != 0 {
			dst = appendQuotedUTF8(dst, s.names[mn.keyStart:mn.keyEnd])
		} else {
			dst = append(dst, s.data[mn.keyStart-1:mn.keyEnd+1]...)
		}
		dst = append(dst, ':')
		dst = e.emit(dst, m, childLo, int32(len(s.states)), fl&matchUnordered != 0)
		s.states = s.states[:childLo]
	}
	return append(dst, '}')
}

func (e *refEmitter) emitArray(dst []byte, i int32, n *refNode, lo, hi int32, unordered bool) []byte {
	s := e.s
	dst = append(dst, '[')
	base := len(dst)
	spanLo := len(s.spans)
	written := 0
	child := i + 1
	for k := int32(0); k < n.count; k, child = k+1, s.nodes[child].next {
		childLo := int32(len(s.states))
		var fl matchFlags
		if lo < hi {
			fl = e.m.stepIndex(&s.states, lo, hi, int(k))
			if fl&matchVolatile != 0 {
				s.states = s.states[:childLo]
				continue
			}
		}
		if written > 0 {
			dst = append(dst, ',')
		}
		written++
		start := len(dst)
		dst = e.emit(dst, child, childLo, int32(len(s.states)), fl&matchUnordered != 0)
		s.states = s.states[:childLo]
		if unordered {
			s.spans = append(s.spans, refSpan{start, len(dst)})
		}
	}
	if unordered && written > 1 {
		dst = e.reorder(dst, base, spanLo)
	}
	s.spans = s.spans[:spanLo]
	return append(dst, ']')
}

// reorder rewrites the elements written since base, whose spans are
// s.spans[spanLo:], in bytewise order of their canonical encodings. Sorting
// the already canonical bytes makes the order independent of how the
// elements were spelled and of the members removed from inside them.
func (e *refEmitter) reorder(dst []byte, base, spanLo int) []byte {
	s := e.s
	spans := s.spans[spanLo:]
	slices.SortFunc(spans, func(a, b refSpan) int {
		return bytes.Compare(dst[a.start:a.end], dst[b.start:b.end])
	})
	s.tmp = append(s.tmp[:0], dst[base:]...)
	dst = dst[:base]
	for j, sp := range spans {
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, s.tmp[sp.start-base:sp.end-base]...)
	}
	return dst
}

// refCanonical canonicalizes payload under rules with the reference
// implementation.
func refCanonical(rules CanonicalRules, payload []byte) ([]byte, error) {
	var m *pathMatcher
	var vol, unord []Pointer
	for _, s := range rules.Volatile {
		p, err := ParsePointer(s)
		if err != nil {
			return nil, err
		}
		vol = append(vol, p)
	}
	for _, s := range rules.Unordered {
		p, err := ParsePointer(s)
		if err != nil {
			return nil, err
		}
		unord = append(unord, p)
	}
	if len(vol)+len(unord) > 0 {
		m = newPathMatcher(vol, unord)
	}
	s := new(refScratch)
	if err := s.parse(payload); err != nil {
		return nil, err
	}
	e := refEmitter{s: s, m: m}
	if m != nil {
		s.states = append(s.states, 0)
	}
	return e.emit(nil, 0, 0, int32(len(s.states)), false), nil
}

// referenceRules are rule sets that exercise every kind of path step:
// literal names, wildcards over members and elements, array indices, and
// rules at several depths that can match the same location.
var referenceRules = []CanonicalRules{
	{},
	specRules,
	{Volatile: []string{"/*/id", "/a/*/b", "/tags/0", "/items/1", "/x/~1y/~0z"}, Unordered: []string{"/*", "/a/*", "/items/*/attrs"}},
	{Volatile: []string{"/a/b/c/d/e/f/g/h/i", "/0", "/a/10", "/longer member name than eight bytes"}, Unordered: []string{"/a", "/a/*/*", "/a/b"}},
}

func checkAgainstReference(t *testing.T, data []byte) {
	t.Helper()
	// Diff's tree parser must accept and reject the same payloads.
	var p jsonParser
	_, refErr := refCanonical(CanonicalRules{}, data)
	if err := p.parse(data); fmt.Sprint(err) != fmt.Sprint(refErr) {
		t.Fatalf("input %q: jsonParser err = %v, reference err = %v", data, err, refErr)
	}
	for _, rules := range referenceRules {
		c := newCanon(t, rules)
		want, wantErr := refCanonical(rules, data)
		got, err := c.AppendCanonical([]byte("prefix"), data)
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("rules %+v, input %q: err = %v, reference err = %v", rules, data, err, wantErr)
		case err != nil:
			if err.Error() != wantErr.Error() {
				t.Fatalf("rules %+v, input %q: err = %q, reference err = %q", rules, data, err, wantErr)
			}
			if string(got) != "prefix" {
				t.Fatalf("rules %+v, input %q: dst changed to %q on error", rules, data, got)
			}
		case string(got) != "prefix"+string(want):
			t.Fatalf("rules %+v, input %q:\n got %q\nwant %q", rules, data, got[len("prefix"):], want)
		}
		fp, err := c.Fingerprint(data)
		if wantErr == nil {
			sum := sha256.Sum256(want)
			if err != nil || fp != "sha256:"+hex.EncodeToString(sum[:]) {
				t.Fatalf("rules %+v, input %q: Fingerprint = %s, %v", rules, data, fp, err)
			}
		} else if err == nil || err.Error() != wantErr.Error() {
			t.Fatalf("rules %+v, input %q: Fingerprint err = %v, reference err = %v", rules, data, err, wantErr)
		}
	}
}

// referenceCorpus returns payloads that reach every branch of the scanner:
// the fuzz seeds and goldens, the benchmark payloads, and every prefix and
// many one-byte mutations of a payload that has every kind of token.
func referenceCorpus(tb testing.TB) [][]byte {
	corpus := [][]byte{benchPayload(1 << 10), loadPayload(7)}
	for _, s := range fuzzSeeds {
		corpus = append(corpus, []byte(s))
	}
	golden, _ := filepath.Glob(filepath.Join("testdata", "canonical", "*.json"))
	for _, path := range golden {
		b, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		corpus = append(corpus, b)
	}
	rich := []byte(` {"b" : [3, 1.50, -0, 1e2, "x\u00e9\/", true, {"z":null, "a":false}], "a":{"id":1, "\u0069d2":[]}, ` +
		`"items":[{"n":2,"client_ts":1},{"n":1}], "tags":["b","a",{}], "x":{"/y":{"~z":1,"k":2}}, "0":[0], "😀":"\ud83d\ude00"} `)
	corpus = append(corpus, rich)
	for n := range len(rich) {
		corpus = append(corpus, rich[:n])
	}
	rng := rand.New(rand.NewPCG(8785, 1))
	const alphabet = "{}[]:,\"\\ \t\n01-.eE+tfnu/\x00\x1f\x7f\xc3\xa9\xff"
	for range 3000 {
		b := slices.Clone(rich)
		for range 1 + rng.IntN(3) {
			b[rng.IntN(len(b))] = alphabet[rng.IntN(len(alphabet))]
		}
		corpus = append(corpus, b)
	}
	return corpus
}

func TestCanonicalMatchesReference(t *testing.T) {
	checkAgainstReference(t, benchPayload(64<<10))
	for _, data := range referenceCorpus(t) {
		checkAgainstReference(t, data)
	}
	// Objects big enough for the generic sort, with and without duplicates,
	// and names that share long prefixes or hold non-ASCII bytes.
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "ab", "a\\u0000", "\\u0000", "aaaaaaaa", "aaaaaaaab", "aaaaaaaaa", "\\uffff", "\\ud83d\\ude00", "\ue000", "é", "items", "tags", "client_ts"}
	for range 2000 {
		var b strings.Builder
		b.WriteByte('{')
		n := rng.IntN(20)
		for k := range n {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"%s%d":%d`, names[rng.IntN(len(names))], rng.IntN(3), k)
		}
		b.WriteByte('}')
		checkAgainstReference(t, []byte(b.String()))
		checkAgainstReference(t, []byte(`{"a":[`+b.String()+`,`+b.String()+`]}`))
	}
}

// FuzzCanonicalReference checks that the canonicalizer and the reference
// implementation agree on every input: the same canonical bytes, or the
// same error.
func FuzzCanonicalReference(f *testing.F) {
	for _, data := range referenceCorpus(f)[:200] {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstReference(t, data)
	})
}

// TestCanonicalNumberPrefix checks the claim scanNumber's fast path rests
// on: when it reports a canonical prefix, appendNumber writes exactly that
// prefix.
func TestCanonicalNumberPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 6))
	lits := []string{"0", "-0", "0.0", "-0.0", "0.000001", "0.0000001", "-0.0000010", "1.50", "3.00", "100.0",
		"123456789012345678901", "1234567890123456789012", "123456789012345678901.5", "1234567890123456789012.5", "10.010"}
	for range 20000 {
		lits = append(lits, randomNumberLiteral(rng))
	}
	for _, lit := range lits {
		end, canonEnd, err := scanNumber([]byte(lit), 0)
		if err != nil || end != len(lit) {
			t.Fatalf("scanNumber(%q) = %d, %v", lit, end, err)
		}
		want, _ := appendNumber(nil, []byte(lit), nil)
		if canonEnd >= 0 && lit[:canonEnd] != string(want) {
			t.Fatalf("%q: canonical prefix %q, appendNumber %q", lit, lit[:canonEnd], want)
		}
	}
}

// The reference walks the tree matcher one step at a time; the production
// code steps the compiled matcher (canonical_match.go) instead.

// stepName pushes onto *states the states reached from (*states)[lo:hi] by
// the member name, and returns the union of their flags.
func (m *pathMatcher) stepName(states *[]int32, lo, hi int32, name []byte) matchFlags {
	var fl matchFlags
	for j := lo; j < hi; j++ {
		n := &m.nodes[(*states)[j]]
		if n.wild >= 0 {
			*states = append(*states, n.wild)
			fl |= m.nodes[n.wild].flags
		}
		if next, ok := n.literal(name); ok {
			*states = append(*states, next)
			fl |= m.nodes[next].flags
		}
	}
	return fl
}

// stepIndex is stepName for an array element.
func (m *pathMatcher) stepIndex(states *[]int32, lo, hi int32, index int) matchFlags {
	var fl matchFlags
	for j := lo; j < hi; j++ {
		n := &m.nodes[(*states)[j]]
		if n.wild >= 0 {
			*states = append(*states, n.wild)
			fl |= m.nodes[n.wild].flags
		}
		if n.indices != nil {
			if next, ok := n.indices[index]; ok {
				*states = append(*states, next)
				fl |= m.nodes[next].flags
			}
		}
	}
	return fl
}

// literal returns the state reached from n by the literal token name.
func (n *matcherNode) literal(name []byte) (int32, bool) {
	for _, e := range n.lits {
		if e.token == string(name) {
			return e.next, true
		}
	}
	if n.names != nil {
		next, ok := n.names[string(name)]
		return next, ok
	}
	return 0, false
}
