package dedupe

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
)

// canonMember is a member of an object being canonicalized.
type canonMember struct {
	prefix        uint64 // namePrefix of the decoded name
	start, end    int    // the member's canonical text in the output, without a separating comma
	name, nameEnd int32  // the decoded name: in the payload, or in canonScratch.names if decoded
	quote         int32  // offset of the name's opening quote in the payload
	decoded       bool
	omitted       bool // volatile, so not in the output
}

// canonFrame is an object or array whose closing bracket has not been read.
type canonFrame struct {
	start      int   // output offset just past the opening bracket
	mark       int   // output offset of the current child's text, separating comma included
	child      int   // output offset of the current child's text
	members    int32 // objects: first member in canonScratch.members
	spans      int32 // unordered arrays: first element span in canonScratch.spans
	stLo, stHi int32 // the container's path-matcher states in canonScratch.states
	count      int32 // members or elements so far
	written    int32 // of them in the output
	object     bool
	unordered  bool // an array whose elements are sorted
	volatile   bool // the current child is left out
	childUnord bool // the current child is an unordered array, if an array
}

// copySlack is how far past the end of its content the output buffer is
// kept writable, so that appendSpan can copy short spans as whole words.
const copySlack = 16

// appendSpan appends d[a:b] to out. Most spans are a token or a name, a
// few bytes long: when both buffers have sixteen bytes from where the span
// goes and comes from, it moves them as two words instead of calling
// memmove. The bytes written past the span's end lie in out's spare
// capacity, where the next append overwrites them.
func appendSpan(out, d []byte, a, b int) []byte {
	if n := len(out); b-a <= 16 && uint(a)+16 <= uint(len(d)) && uint(n)+16 <= uint(cap(out)) {
		w, r := out[n:n+16], d[a:a+16]
		binary.LittleEndian.PutUint64(w, binary.LittleEndian.Uint64(r))
		binary.LittleEndian.PutUint64(w[8:], binary.LittleEndian.Uint64(r[8:]))
		return out[:n+b-a]
	}
	return append(out, d[a:b]...)
}

// appendCanonical appends the canonical form of payload to dst. It may
// write into dst's spare capacity beyond what it appends, so dst must be a
// buffer of the canonicalizer's own.
func (c *Canonicalizer) appendCanonical(s *canonScratch, dst, payload []byte) ([]byte, error) {
	if len(payload) > math.MaxInt32 {
		return dst, malformedAt(math.MaxInt32, "payload larger than 2 GiB")
	}
	// Without whitespace and escapes the canonical form is as long as the
	// payload; growing once spares the appends most growths.
	out, err := s.canonicalize(c.match, slices.Grow(dst, len(payload)+copySlack), payload)
	if err != nil {
		return dst, err
	}
	return out, nil
}

// canonicalize appends the canonical form of d to out.
//
// It reads the payload once, left to right, and writes each token's
// canonical form to the output as soon as it has validated it. An object's
// members are written in payload order and moved into canonical order when
// its closing brace is read, as are the elements of an unordered array; a
// volatile member or element is written and then cut off again. The path
// rules are matched on the way down. So the output is complete when the
// top-level value ends, and no payload byte is looked at twice.
//
// The loop is a state machine over the points of the grammar where a value
// starts (value), a value has ended (next), and a member or an element of
// the innermost container starts (member, element), joined by goto. The
// stack of open containers is an array, so nesting costs no calls, and
// short tokens are copied without calling memmove either: in Go every call
// spills the loop's state to the stack. The errors, their offsets and their
// precedence are those of jsonParser's recursive descent.
func (s *canonScratch) canonicalize(m *canonMatcher, out, d []byte) ([]byte, error) {
	s.data = d
	s.members = s.members[:0]
	s.spans = s.spans[:0]
	s.names = s.names[:0]
	s.states = s.states[:0]
	if m != nil {
		s.states = append(s.states, 0)
	}
	depth := 0
	var f *canonFrame // the innermost open container
	i := skipSpace(d, 0)

value:
	if i >= len(d) {
		return nil, eofError(d)
	}
	switch ch := d[i]; ch {
	case '"':
		if j := plainEnd(d, i+1); j < len(d) && d[j] == '"' {
			out = appendSpan(out, d, i, j+1)
			i = j + 1
			break
		}
		end, escaped, err := scanString(d, i)
		if err != nil {
			return nil, err
		}
		if escaped {
			out = appendEscapedString(out, d[i+1:end-1])
		} else {
			out = append(out, d[i:end]...)
		}
		i = end
	case '{', '[':
		if depth == MaxNestingDepth {
			return nil, malformedAt(i, "nesting deeper than "+strconv.Itoa(MaxNestingDepth)+" levels")
		}
		// The container's own path-matcher states are those its parent's
		// step pushed, or the root's.
		stLo, unordered := int32(0), false
		if depth > 0 {
			stLo, unordered = s.frames[depth-1].stHi, s.frames[depth-1].childUnord
		}
		out = append(out, ch)
		// The frame is filled in field by field: a composite literal is
		// built on the stack and copied, and reading back the narrow
		// stores as wide words stalls store forwarding.
		f = &s.frames[depth]
		depth++
		f.start, f.members, f.spans = len(out), int32(len(s.members)), int32(len(s.spans))
		f.stLo, f.stHi = stLo, int32(len(s.states))
		f.count, f.written = 0, 0
		f.object, f.unordered = ch == '{', ch == '[' && unordered
		i = skipSpace(d, i+1)
		if ch == '{' {
			if i >= len(d) || d[i] != '}' {
				goto member
			}
		} else if i >= len(d) || d[i] != ']' {
			goto element
		}
		// Empty: there is nothing to order.
		out = append(out, d[i])
		i++
		depth--
	case 't', 'f', 'n':
		word := "true"
		if ch == 'f' {
			word = "false"
		} else if ch == 'n' {
			word = "null"
		}
		if i+len(word) > len(d) || string(d[i:i+len(word)]) != word {
			return nil, literalError(d, i, word)
		}
		out = append(out, word...)
		i += len(word)
	default:
		if ch != '-' && (ch < '0' || ch > '9') {
			return nil, malformedAt(i, "invalid character "+describeByte(ch)+" looking for a value")
		}
		// An integer of at most 21 digits, other than minus zero, is
		// already canonical; scanNumber sees to everything else.
		j := i
		if ch == '-' {
			j++
		}
		k := j
		for uint(k) < uint(len(d)) && d[k]-'0' <= 9 {
			k++
		}
		if n := k - j; n > 0 && n <= 21 && (d[j] != '0' || (n == 1 && j == i)) && (k == len(d) || (d[k] != '.' && d[k]|0x20 != 'e')) {
			out = appendSpan(out, d, i, k)
			i = k
			break
		}
		end, canonEnd, err := scanNumber(d, i)
		if err != nil {
			return nil, err
		}
		if canonEnd >= 0 {
			out = append(out, d[i:canonEnd]...)
		} else {
			out, s.num = appendNumber(out, d[i:end], s.num)
		}
		i = end
	}

next:
	// A value ended at i. Finish it as the current child of the innermost
	// container and read on to the next value, closing the containers
	// that completes.
	if depth == 0 {
		if i = skipSpace(d, i); i < len(d) {
			return nil, malformedAt(i, "trailing data after the top-level value")
		}
		return out, nil
	}
	f = &s.frames[depth-1]
	if f.volatile {
		out = out[:f.mark]
	} else {
		f.written++
		if f.object {
			s.members[len(s.members)-1].end = len(out)
		} else if f.unordered {
			s.spans = append(s.spans, elemSpan{f.child, len(out)})
		}
	}
	if f.stLo < f.stHi {
		s.states = s.states[:f.stHi]
	}
	f.count++
	if i = skipSpace(d, i); i >= len(d) {
		return nil, eofError(d)
	}
	if ch := d[i]; ch == ',' {
		i = skipSpace(d, i+1)
		if f.object {
			goto member
		}
		goto element
	} else if f.object {
		if ch != '}' {
			return nil, malformedAt(i, "invalid character "+describeByte(ch)+" after object member")
		}
		var err error
		if out, err = s.closeObject(f, out); err != nil {
			return nil, err
		}
	} else {
		if ch != ']' {
			return nil, malformedAt(i, "invalid character "+describeByte(ch)+" after array element")
		}
		out = s.closeArray(f, out)
	}
	i++
	depth--
	goto next

element:
	// Element f.count of array f starts at i.
	f.mark = len(out)
	if f.written > 0 {
		out = append(out, ',')
	}
	f.child = len(out)
	f.volatile, f.childUnord = false, false
	if f.stLo < f.stHi {
		var fl matchFlags
		s.states, fl = m.stepIndex(s.states, f.stLo, f.stHi, int(f.count))
		f.childStep(s, fl)
	}
	goto value

member:
	// A member of object f starts at i.
	if i >= len(d) {
		return nil, eofError(d)
	}
	if ch := d[i]; ch != '"' {
		return nil, malformedAt(i, "invalid character "+describeByte(ch)+" looking for a member name")
	}
	{
		// Like the frames, the member is written in place.
		k := len(s.members)
		if k == cap(s.members) {
			s.members = slices.Grow(s.members, 1)
		}
		s.members = s.members[:k+1]
		mb := &s.members[k]
		mb.quote, mb.name, mb.decoded, mb.omitted = int32(i), int32(i+1), false, false
		end := plainEnd(d, i+1)
		if end < len(d) && d[end] == '"' {
			end++
		} else {
			var err error
			if end, mb.decoded, err = scanString(d, i); err != nil {
				return nil, err
			}
			if mb.decoded {
				mb.name = int32(len(s.names))
				s.names = appendDecoded(s.names, d[i+1:end-1])
			}
		}
		mb.nameEnd = int32(end - 1)
		var ok bool
		if mb.decoded {
			mb.nameEnd = int32(len(s.names))
		} else {
			mb.prefix, ok = prefixAt(d, i+1, end-1)
		}
		if !ok {
			mb.prefix = namePrefix(s.memberName(mb))
		}
		f.volatile, f.childUnord = false, false
		if f.stLo < f.stHi && (f.stHi-f.stLo > 1 || m.mayStep(s.states[f.stLo], mb.prefix)) {
			var fl matchFlags
			s.states, fl = m.stepName(s.states, f.stLo, f.stHi, mb.prefix, s.memberName(mb))
			f.childStep(s, fl)
		}
		f.mark = len(out)
		if f.volatile {
			mb.omitted = true
		} else {
			if f.written > 0 {
				out = append(out, ',')
			}
			mb.start = len(out)
			switch {
			case mb.decoded:
				out = appendQuotedUTF8(out, s.names[mb.name:mb.nameEnd])
				out = append(out, ':')
			case end < len(d) && d[end] == ':':
				out = appendSpan(out, d, i, end+1)
			default:
				out = appendSpan(out, d, i, end)
				out = append(out, ':')
			}
		}
		if i = end; i >= len(d) || d[i] != ':' {
			if i = skipSpace(d, i); i >= len(d) {
				return nil, eofError(d)
			}
			if ch := d[i]; ch != ':' {
				return nil, malformedAt(i, "invalid character "+describeByte(ch)+" after member name")
			}
		}
		i = skipSpace(d, i+1)
	}
	goto value
}

// childStep records what the path rules say about the current child of f,
// whose matcher states were just pushed with flags fl.
func (f *canonFrame) childStep(s *canonScratch, fl matchFlags) {
	if fl&matchVolatile != 0 {
		// Nothing inside a value that is left out needs matching.
		f.volatile = true
		s.states = s.states[:f.stHi]
		return
	}
	f.childUnord = fl&matchUnordered != 0
}

// closeObject puts the members of object f, whose text starts at f.start,
// in canonical order, rejecting duplicate names, and closes it.
func (s *canonScratch) closeObject(f *canonFrame, out []byte) ([]byte, error) {
	ms := s.members[f.members:]
	s.members = s.members[:f.members]
	if len(ms) > 1 {
		moved, err := s.sortMembers(ms)
		if err != nil {
			return out, err
		}
		if moved && f.written > 1 {
			out = s.reorderMembers(out, f.start, ms)
		}
	}
	return append(out, '}'), nil
}

// memberName returns the decoded name of mb.
func (s *canonScratch) memberName(mb *canonMember) []byte {
	if mb.decoded {
		return s.names[mb.name:mb.nameEnd]
	}
	return s.data[mb.name:mb.nameEnd]
}

// compareMembers orders two members as compareUTF16 orders their names.
func (s *canonScratch) compareMembers(a, b *canonMember) int {
	if a.prefix != b.prefix {
		if a.prefix < b.prefix {
			return -1
		}
		return 1
	}
	return compareUTF16(s.memberName(a), s.memberName(b))
}

// sortMembers sorts an object's members by name and rejects duplicate
// names, which sorting brings next to each other. moved reports whether
// the payload had them in another order.
func (s *canonScratch) sortMembers(ms []canonMember) (moved bool, err error) {
	tied := true
	// Most objects are small; insertion sort with the comparison inlined
	// beats the generic sort's overhead there. Comparing the prefixes
	// decides most comparisons. Insertion sort compares every two members
	// that end up next to each other, so a duplicate name shows as a tie.
	if len(ms) <= 12 {
		tied = false
		for i := 1; i < len(ms); i++ {
			k := ms[i]
			j := i
			for ; j > 0; j-- {
				prev := &ms[j-1]
				if k.prefix != prev.prefix {
					if k.prefix > prev.prefix {
						break
					}
				} else if cmp := compareUTF16(s.memberName(&k), s.memberName(prev)); cmp >= 0 {
					tied = tied || cmp == 0
					break
				}
				ms[j] = *prev
			}
			if j != i {
				ms[j] = k
				moved = true
			}
		}
	} else {
		moved = true
		slices.SortFunc(ms, func(a, b canonMember) int { return s.compareMembers(&a, &b) })
	}
	if tied {
		err = s.checkDuplicates(ms)
	}
	return moved, err
}

func (s *canonScratch) checkDuplicates(ms []canonMember) error {
	dup := -1
	var dupName []byte
	for k := 1; k < len(ms); k++ {
		name := s.memberName(&ms[k])
		if string(s.memberName(&ms[k-1])) != string(name) {
			continue
		}
		// Report the later of the two occurrences, and the earliest such
		// one, so the message points where a reader would first notice.
		off := int(max(ms[k-1].quote, ms[k].quote))
		if dup < 0 || off < dup {
			dup, dupName = off, name
		}
	}
	if dup >= 0 {
		return malformedAt(dup, "duplicate member name "+quoteName(dupName))
	}
	return nil
}

// reorderMembers rewrites the text of an object's members, written since
// start in payload order, in the order of ms.
func (s *canonScratch) reorderMembers(out []byte, start int, ms []canonMember) []byte {
	s.tmp = append(s.tmp[:0], out[start:]...)
	out = out[:start]
	for k := range ms {
		mb := &ms[k]
		if mb.omitted {
			continue
		}
		if len(out) > start {
			out = append(out, ',')
		}
		out = appendSpan(out, s.tmp, mb.start-start, mb.end-start)
	}
	return out
}

// closeArray sorts the elements of array f if it is unordered, and closes
// it.
func (s *canonScratch) closeArray(f *canonFrame, out []byte) []byte {
	if f.unordered {
		if f.written > 1 {
			out = s.reorderElements(out, f.start, s.spans[f.spans:])
		}
		s.spans = s.spans[:f.spans]
	}
	return append(out, ']')
}

// reorderElements rewrites the elements written since start, whose spans
// are spans, in bytewise order of their canonical encodings. Sorting the
// already canonical bytes makes the order independent of how the elements
// were spelled and of the members removed from inside them.
func (s *canonScratch) reorderElements(out []byte, start int, spans []elemSpan) []byte {
	slices.SortFunc(spans, func(a, b elemSpan) int {
		return bytes.Compare(out[a.start:a.end], out[b.start:b.end])
	})
	s.tmp = append(s.tmp[:0], out[start:]...)
	out = out[:start]
	for j, sp := range spans {
		if j > 0 {
			out = append(out, ',')
		}
		out = appendSpan(out, s.tmp, sp.start-start, sp.end-start)
	}
	return out
}
