package dedupe

import "encoding/binary"

// A decoder that knows its payload's structure can write the canonical form
// itself: it sorts members by what it compiled from the schema, writes
// numbers and strings canonically as it decodes them, and leaves out and
// sorts what the rules say as it goes. No JSON text is written and read
// back, which is most of what fingerprinting such a payload costs.

// CanonicalAppender is implemented by a Decoder that can write the
// canonical form of a payload itself.
//
// AppendCanonical appends to dst exactly the bytes that canonicalizing
// AppendJSON's text for value under rules would append, and reports ok.
// When it cannot (this payload needs the JSON text, or it does not
// decode), it reports !ok and the canonicalizer decodes and canonicalizes
// as it would without it; so its own errors never reach a caller, and a
// payload that fails is decoded again for the authoritative error. rules
// is nil when the canonicalizer has no path rules. It may write into
// dst's spare capacity beyond what it appends.
type CanonicalAppender interface {
	AppendCanonical(dst, value []byte, rules *PathRules) (out []byte, ok bool)
}

// PathRules are a canonicalizer's volatile and unordered paths, for a
// CanonicalAppender to apply while it writes. They are matched as the
// canonicalizer matches them: a set of states per open container, the
// states of a member or element pushed onto those of its container.
type PathRules struct{ m *canonMatcher }

// PathStep says what the rules make of one member or element.
type PathStep uint8

const (
	// PathVolatile: the member or element is left out.
	PathVolatile PathStep = 1 << iota
	// PathUnordered: the value, if an array, has its elements sorted.
	PathUnordered
)

// Root appends the states of the top-level value to states.
func (r *PathRules) Root(states []int32) []int32 { return append(states, 0) }

// StepName appends to states the states that member name leads to from
// states[lo:hi], those of its object, and returns them with what the rules
// make of the member.
func (r *PathRules) StepName(states []int32, lo, hi int, name []byte) ([]int32, PathStep) {
	// namePrefix, with the eight bytes loaded at once where there are.
	var x uint64
	if len(name) >= 8 {
		x = binary.BigEndian.Uint64(name)
	} else {
		for i, c := range name {
			x |= uint64(c) << (56 - 8*i)
		}
	}
	prefix := utf16Order(x)
	if hi-lo == 1 && !r.m.mayStep(states[lo], prefix) {
		return states, 0
	}
	states, fl := r.m.stepName(states, int32(lo), int32(hi), prefix, name)
	return states, pathStep(fl)
}

// StepIndex is StepName for element index of an array.
func (r *PathRules) StepIndex(states []int32, lo, hi, index int) ([]int32, PathStep) {
	states, fl := r.m.stepIndex(states, int32(lo), int32(hi), index)
	return states, pathStep(fl)
}

// pathStep keeps volatile's precedence over unordered, as childStep does.
func pathStep(fl matchFlags) PathStep {
	if fl&matchVolatile != 0 {
		return PathVolatile
	}
	if fl&matchUnordered != 0 {
		return PathUnordered
	}
	return 0
}

// CompareNames orders two valid UTF-8 member names as RFC 8785 sorts
// them: by their UTF-16 code units.
func CompareNames(a, b []byte) int { return compareUTF16(a, b) }

// AppendCanonicalNumber appends the canonical form of the valid JSON
// number literal lit.
func AppendCanonicalNumber(dst, lit []byte) []byte {
	if _, canonEnd, err := scanNumber(lit, 0); err == nil && canonEnd >= 0 {
		return append(dst, lit[:canonEnd]...)
	}
	var digits [32]byte
	dst, _ = appendNumber(dst, lit, digits[:0])
	return dst
}

// direct asks the decoder for the canonical form of payload; ok is false
// when it does not write one, and the payload goes the way of JSON text.
// The reader schema is read before and after, as decodeWithDigest does.
func (c *Canonicalizer) direct(s *canonScratch, payload []byte) (out []byte, digest string, ok bool) {
	if c.appender == nil {
		return nil, "", false
	}
	for {
		before := c.dec.Digest()
		out, ok = c.appender.AppendCanonical(s.out[:0], payload, c.paths)
		if !ok {
			return nil, "", false
		}
		s.out = out
		if after := c.dec.Digest(); after == before {
			return out, c.digestFor(before), ok
		}
	}
}
