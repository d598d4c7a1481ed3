package dedupe

import (
	"bytes"
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
