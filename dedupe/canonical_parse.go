package dedupe

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"
)

// This file holds the token-level validation shared by the canonicalizer
// (canonical_scan.go) and jsonParser, which records a payload's structure
// as a tree. The canonicalizer does not need the tree; Diff walks it.

// malformedError reports why and where a payload is not canonicalizable.
type malformedError struct {
	msg    string
	offset int
}

func (e *malformedError) Error() string {
	return ErrMalformedPayload.Error() + ": " + e.msg + " at offset " + strconv.Itoa(e.offset)
}

func (e *malformedError) Unwrap() error { return ErrMalformedPayload }

func malformedAt(offset int, msg string) error {
	return &malformedError{msg: msg, offset: offset}
}

// describeByte names an unexpected input byte readably and safely for logs.
func describeByte(c byte) string {
	if c > ' ' && c < utf8.RuneSelf {
		return strconv.QuoteRune(rune(c))
	}
	return "byte 0x" + strconv.FormatUint(uint64(c), 16)
}

// maxQuotedName bounds how much of a member name goes into an error message.
const maxQuotedName = 64

func quoteName(name []byte) string {
	if len(name) > maxQuotedName {
		cut := maxQuotedName
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		return strconv.Quote(string(name[:cut])) + "..."
	}
	return strconv.Quote(string(name))
}

// stringSafe[c] is true for ASCII bytes that stand for themselves inside a
// JSON string.
var stringSafe = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// lsb and msb have the lowest and the highest bit of each byte set: the
// string scanner tests eight bytes at once with them.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

func isJSONSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

// skipSpace returns the offset of the first byte from i on that is not
// whitespace. Every whitespace byte is at most ' ', which lets the common
// case of a token right at i cost one comparison.
func skipSpace(d []byte, i int) int {
	for uint(i) < uint(len(d)) && d[i] <= ' ' && isJSONSpace(d[i]) {
		i++
	}
	return i
}

// literalError reports where the text at start stops spelling word.
func literalError(d []byte, start int, word string) error {
	for i := 0; i < len(word); i++ {
		if start+i >= len(d) {
			return eofError(d)
		}
		if d[start+i] != word[i] {
			return malformedAt(start+i, "invalid character "+describeByte(d[start+i])+" in literal "+word)
		}
	}
	panic("literalError called on a matching literal")
}

func eofError(d []byte) error { return malformedAt(len(d), "unexpected end of input") }

// scanNumber validates the number literal at start and returns the offset
// just past it. canonEnd is the end of the literal's canonical form when
// that form is a prefix of the literal, and -1 otherwise.
//
// The canonical form is a prefix for an integer of at most 21 digits other
// than minus zero, and for a fraction without exponent whose integer part
// has at most 21 digits, or is 0 and followed by at most five zeros before
// the first significant digit: ECMAScript writes such a value in plain
// notation with the literal's digits, only without trailing fraction zeros
// (and without the point when nothing is left after it). Everything else,
// exponents above all, goes through appendNumber.
func scanNumber(d []byte, start int) (end, canonEnd int, err error) {
	i := start
	if d[i] == '-' {
		i++
	}
	if i >= len(d) {
		return 0, 0, eofError(d)
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
		return 0, 0, malformedAt(i, "invalid character "+describeByte(d[i])+" in number")
	}
	canonEnd = i
	if i-intStart > 21 {
		canonEnd = -1
	}
	zeroInt := d[intStart] == '0'
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) {
			return 0, 0, eofError(d)
		}
		if d[i] < '0' || d[i] > '9' {
			return 0, 0, malformedAt(i, "invalid character "+describeByte(d[i])+" after decimal point")
		}
		fracStart, firstNonZero, lastNonZero := i, -1, -1
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			if d[i] != '0' {
				if firstNonZero < 0 {
					firstNonZero = i
				}
				lastNonZero = i
			}
			i++
		}
		if canonEnd >= 0 && lastNonZero >= 0 {
			canonEnd = lastNonZero + 1
			if zeroInt && firstNonZero-fracStart > 5 {
				canonEnd = -1
			}
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		canonEnd = -1
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) {
			return 0, 0, eofError(d)
		}
		if d[i] < '0' || d[i] > '9' {
			return 0, 0, malformedAt(i, "invalid character "+describeByte(d[i])+" in exponent")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	if zeroInt && canonEnd == intStart+1 && intStart != start {
		canonEnd = -1 // minus zero is written "0"
	}
	return i, canonEnd, nil
}

// plainEnd returns the offset of the first byte from i on that is a quote,
// a backslash, a control character or not ASCII: the end of a run of
// string content that stands for itself.
//
// The comparisons are unsigned so that the compiler can prove the loads in
// bounds without checks of its own.
func plainEnd(d []byte, i int) int {
	for ; uint(i)+16 <= uint(len(d)); i += 16 {
		w := d[i : i+16]
		if hits := plainHits(binary.LittleEndian.Uint64(w)); hits != 0 {
			return i + bits.TrailingZeros64(hits)>>3
		}
		if hits := plainHits(binary.LittleEndian.Uint64(w[8:])); hits != 0 {
			return i + 8 + bits.TrailingZeros64(hits)>>3
		}
	}
	if uint(i)+8 <= uint(len(d)) {
		if hits := plainHits(binary.LittleEndian.Uint64(d[i : i+8])); hits != 0 {
			return i + bits.TrailingZeros64(hits)>>3
		}
		i += 8
	}
	for uint(i) < uint(len(d)) && stringSafe[d[i]] {
		i++
	}
	return i
}

// plainHits flags the high bit of each byte of x that plainEnd stops at,
// with the "has a zero byte" tests: (v-lsb) &^ v & msb for v = x^c, and
// (x-lsb*0x20) &^ x & msb for bytes below 0x20. They can flag a byte after
// a real hit, never one before it, so the lowest flag is the first byte to
// stop at. The "&^ v" only clears flags on bytes whose high bit is set, and
// those are flagged anyway, as not ASCII; so it can go.
func plainHits(x uint64) uint64 {
	return (x | (x - lsb*0x20) | (x ^ (lsb * '"') - lsb) | (x ^ (lsb * '\\') - lsb)) & msb
}

// scanString validates the string whose opening quote is at start and
// returns the offset just past its closing quote.
func scanString(d []byte, start int) (end int, escaped bool, err error) {
	i := start + 1
	for {
		if i = plainEnd(d, i); i >= len(d) {
			return 0, false, malformedAt(start, "unterminated string")
		}
		c := d[i]
		switch {
		case c == '"':
			return i + 1, escaped, nil
		case c == '\\':
			escaped = true
			n, err := checkEscape(d, i)
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
}

// checkEscape validates the escape sequence at i and returns its length.
func checkEscape(d []byte, i int) (int, error) {
	if i+1 >= len(d) {
		return 0, eofError(d)
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

func describeEscapeByte(c byte) string {
	if c > ' ' && c < utf8.RuneSelf {
		return string(rune(c))
	}
	return "followed by byte 0x" + strconv.FormatUint(uint64(c), 16)
}

// hex4 decodes the four hex digits at d[i:i+4].
func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// decodeEscape decodes the validated escape sequence at s[i], returning the
// rune and the sequence's length.
func decodeEscape(s []byte, i int) (rune, int) {
	switch s[i+1] {
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r, _ := hex4(s, i+2)
		if r >= 0xD800 && r <= 0xDBFF {
			r2, _ := hex4(s, i+8)
			return 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00), 12
		}
		return r, 6
	default: // '"', '\\', '/'
		return rune(s[i+1]), 2
	}
}

// appendDecoded appends the UTF-8 text of the validated string content s.
func appendDecoded(b, s []byte) []byte {
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] != '\\' {
			j++
		}
		b = append(b, s[i:j]...)
		if j == len(s) {
			break
		}
		r, n := decodeEscape(s, j)
		b = utf8.AppendRune(b, r)
		i = j + n
	}
	return b
}

type valueKind uint8

const (
	vNull valueKind = iota
	vTrue
	vFalse
	vNumber
	vString
	vObject
	vArray
)

// flagKeyDecoded marks a member whose name had escapes and was decoded
// into jsonParser.names; keyStart and keyEnd then index that buffer.
const flagKeyDecoded uint8 = 1

// valueNode is one value of a parsed payload. Nodes are stored in document
// (pre-)order in one flat slice, so a container's first child is the node
// right after it and each node knows where its subtree ends.
type valueNode struct {
	start, end       int32 // the value's bytes, quotes and brackets included
	keyStart, keyEnd int32 // member name without quotes, in the payload or in jsonParser.names
	keyQuote         int32 // offset of the member name's opening quote
	next             int32 // index of the first node after this subtree
	count            int32 // number of members or elements
	order            int32 // objects: start of the members' sorted indices in jsonParser.order
	kind             valueKind
	flags            uint8
}

// jsonParser validates a payload and records its structure as a tree of
// valueNodes, for Diff. It accepts and rejects exactly what the
// canonicalizer does, but favours simplicity over speed.
type jsonParser struct {
	data  []byte
	pos   int
	nodes []valueNode
	order []int32     // for each object, its member nodes sorted by name
	names []byte      // decoded member names that had escapes
	keys  []memberKey // one object's members while they are sorted
}

// parse validates data as one JSON text and records its nodes.
func (p *jsonParser) parse(data []byte) error {
	if len(data) > math.MaxInt32 {
		return malformedAt(math.MaxInt32, "payload larger than 2 GiB")
	}
	p.data = data
	p.nodes = p.nodes[:0]
	p.order = p.order[:0]
	p.names = p.names[:0]
	p.pos = skipSpace(data, 0)
	if err := p.value(0); err != nil {
		return err
	}
	if p.pos = skipSpace(data, p.pos); p.pos < len(data) {
		return malformedAt(p.pos, "trailing data after the top-level value")
	}
	return nil
}

func (p *jsonParser) skipSpace() { p.pos = skipSpace(p.data, p.pos) }

func (p *jsonParser) eof() error { return eofError(p.data) }

func (p *jsonParser) leaf(k valueKind, start, end int) {
	p.pos = end
	p.nodes = append(p.nodes, valueNode{kind: k, start: int32(start), end: int32(end), next: int32(len(p.nodes) + 1)})
}

// value parses the value at p.pos; depth is the number of containers
// enclosing it.
func (p *jsonParser) value(depth int) error {
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
		end, _, err := scanString(p.data, start)
		if err != nil {
			return err
		}
		p.leaf(vString, start, end)
	case 't', 'f', 'n':
		word, k := "true", vTrue
		if c == 'f' {
			word, k = "false", vFalse
		} else if c == 'n' {
			word, k = "null", vNull
		}
		end := start + len(word)
		if end > len(p.data) || string(p.data[start:end]) != word {
			return literalError(p.data, start, word)
		}
		p.leaf(k, start, end)
	default:
		if c != '-' && (c < '0' || c > '9') {
			return malformedAt(start, "invalid character "+describeByte(c)+" looking for a value")
		}
		end, _, err := scanNumber(p.data, start)
		if err != nil {
			return err
		}
		p.leaf(vNumber, start, end)
	}
	return nil
}

func (p *jsonParser) array(depth int) error {
	start := p.pos
	if depth > MaxNestingDepth {
		return malformedAt(start, "nesting deeper than "+strconv.Itoa(MaxNestingDepth)+" levels")
	}
	idx := len(p.nodes)
	p.nodes = append(p.nodes, valueNode{kind: vArray, start: int32(start)})
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

func (p *jsonParser) object(depth int) error {
	start := p.pos
	if depth > MaxNestingDepth {
		return malformedAt(start, "nesting deeper than "+strconv.Itoa(MaxNestingDepth)+" levels")
	}
	idx := len(p.nodes)
	p.nodes = append(p.nodes, valueNode{kind: vObject, start: int32(start)})
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
			end, escaped, err := scanString(p.data, quote)
			if err != nil {
				return err
			}
			keyStart, keyEnd := int32(quote+1), int32(end-1)
			var fl uint8
			if escaped {
				fl = flagKeyDecoded
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

// memberKey pairs a member's decoded name with its node while an object's
// members are sorted, so comparisons do not chase node indices.
type memberKey struct {
	name []byte
	node int32
}

// sortMembers records the object's members in canonical order and rejects
// duplicate names, which sorting brings next to each other.
func (p *jsonParser) sortMembers(idx int, count int32) error {
	keys := p.keys[:0]
	child := int32(idx + 1)
	for k := int32(0); k < count; k++ {
		keys = append(keys, memberKey{p.key(child), child})
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
			slices.SortFunc(keys, func(a, b memberKey) int { return compareUTF16(a.name, b.name) })
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

func (p *jsonParser) checkDuplicates(keys []memberKey) error {
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
func (p *jsonParser) key(i int32) []byte {
	n := &p.nodes[i]
	if n.flags&flagKeyDecoded != 0 {
		return p.names[n.keyStart:n.keyEnd]
	}
	return p.data[n.keyStart:n.keyEnd]
}
