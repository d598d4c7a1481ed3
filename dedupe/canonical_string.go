package dedupe

import (
	"bytes"
	"encoding/binary"
	"math"
	"unicode/utf8"
)

// compareUTF16 orders two valid UTF-8 strings by their UTF-16 code units, as
// RFC 8785 sorts member names, without transcoding them.
//
// UTF-8 byte order equals code point order, and code point order equals
// UTF-16 order except between a supplementary character (encoded in UTF-16
// as a surrogate, 0xD800-0xDBFF) and a BMP character from U+E000 to U+FFFF,
// which UTF-16 puts after it. In UTF-8 the first differing byte of two such
// characters is a lead byte 0xF0-0xF4 on one side and 0xEE-0xEF on the
// other; only that case needs its result inverted. A difference inside a
// character is always between continuation bytes, below 0xC0.
func compareUTF16(a, b []byte) int {
	if len(a) > 0 && len(b) > 0 && a[0] != b[0] && a[0] < 0xEE && b[0] < 0xEE {
		return int(a[0]) - int(b[0])
	}
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	ca, cb := a[i], b[i]
	if ca >= 0xEE && cb >= 0xEE && (ca >= 0xF0) != (cb >= 0xF0) {
		if ca >= 0xF0 {
			return -1
		}
		return 1
	}
	return int(ca) - int(cb)
}

// namePrefix packs the first eight bytes of a member name, big-endian and
// zero-padded, into an integer and maps them so that integer order is
// compareUTF16 order: whenever two names' prefixes differ, comparing the
// prefixes orders the names. (Padding cannot mislead: where a name ends,
// the other name's byte is at least the padding's 0, and if it is 0 the
// prefixes differ later or not at all.) Equal prefixes say nothing beyond
// the first eight bytes being equal, and those names need a full compare.
func namePrefix(name []byte) uint64 {
	var x uint64
	for i := range 8 {
		x <<= 8
		if i < len(name) {
			x |= uint64(name[i])
		}
	}
	return utf16Order(x)
}

// prefixAt is namePrefix(d[a:b]) for the common ASCII name that d holds
// eight bytes of from a; ok is false for any other.
func prefixAt(d []byte, a, b int) (prefix uint64, ok bool) {
	if a+8 > len(d) {
		return 0, false
	}
	x := binary.BigEndian.Uint64(d[a:])
	if n := b - a; n < 8 {
		x &^= math.MaxUint64 >> (8 * uint(n))
	}
	return x, x&msb == 0
}

// utf16Order rewrites the bytes 0xEE-0xF4 of a packed prefix so that the
// lead bytes of supplementary characters (0xF0-0xF4) sort before those of
// U+E000-U+FFFF (0xEE, 0xEF), the one place where UTF-16 order departs
// from UTF-8 byte order (see compareUTF16). Only lead bytes take these
// values in valid UTF-8, and the mapping permutes them, so equal bytes stay
// equal and all other orders are kept.
func utf16Order(x uint64) uint64 {
	if x&msb == 0 {
		return x
	}
	var y uint64
	for shift := 56; shift >= 0; shift -= 8 {
		c := byte(x >> shift)
		switch {
		case c >= 0xF0 && c <= 0xF4:
			c -= 2
		case c == 0xEE || c == 0xEF:
			c += 5
		}
		y |= uint64(c) << shift
	}
	return y
}

const lowerHexDigits = "0123456789abcdef"

// appendCanonicalRune appends r as RFC 8785 writes it inside a string: the
// two-character escapes where JSON has them, \u00xx for the other control
// characters, and the character itself otherwise.
func appendCanonicalRune(b []byte, r rune) []byte {
	switch r {
	case '"':
		return append(b, '\\', '"')
	case '\\':
		return append(b, '\\', '\\')
	case '\b':
		return append(b, '\\', 'b')
	case '\f':
		return append(b, '\\', 'f')
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	if r < 0x20 {
		return append(b, '\\', 'u', '0', '0', lowerHexDigits[r>>4], lowerHexDigits[r&0xF])
	}
	if r < utf8.RuneSelf {
		return append(b, byte(r))
	}
	return utf8.AppendRune(b, r)
}

// appendEscapedString appends, quoted, the canonical form of the validated
// string content s, which contains escapes. Bytes outside escapes are valid
// UTF-8 without control characters, quotes or backslashes, so they are
// copied as they are.
func appendEscapedString(b, s []byte) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		j := bytes.IndexByte(s[i:], '\\')
		if j < 0 {
			b = append(b, s[i:]...)
			break
		}
		b = append(b, s[i:i+j]...)
		r, n := decodeEscape(s, i+j)
		b = appendCanonicalRune(b, r)
		i += j + n
	}
	return append(b, '"')
}

// appendQuotedUTF8 appends the canonical JSON string for the valid UTF-8
// text s.
func appendQuotedUTF8(b, s []byte) []byte {
	b = append(b, '"')
	start := 0
	for i, c := range s {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		b = appendCanonicalRune(b, rune(c))
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
