package decode

import (
	"encoding/base64"
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"

	"github.com/idemstream/idemstream/dedupe"
)

// These write the JSON text the canonicalizer then reads. They need not be
// canonical themselves (the canonicalizer sorts members and rewrites
// numbers); they must be valid JSON and injective: two different values
// never come out as the same text.

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, "true"...)
	}
	return append(dst, "false"...)
}

// appendInt is strconv.AppendInt(dst, v, 10), written in place: records
// are mostly numbers, and strconv formats into a buffer of its own and
// copies.
func appendInt(dst []byte, v int64) []byte {
	u := uint64(v)
	if v < 0 {
		dst = append(dst, '-')
		u = -u
	}
	return appendUint(dst, u)
}

// digitPairs holds 00 to 99, two digits for each division by 100.
const digitPairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

var powersOf10 = [...]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19}

// appendUint is strconv.AppendUint(dst, u, 10), written in place.
func appendUint(dst []byte, u uint64) []byte {
	// The number of digits, from the number of bits (1233/4096 is a
	// little under log10(2)).
	n := bits.Len64(u|1) * 1233 >> 12
	if n < len(powersOf10) && u >= powersOf10[n] {
		n++
	}
	n = max(n, 1)
	l := len(dst)
	dst = slices.Grow(dst, n)[:l+n]
	d := dst[l:]
	i := n
	for u >= 100 {
		q := u / 100
		r := 2 * (u - q*100)
		i -= 2
		d[i], d[i+1] = digitPairs[r], digitPairs[r+1]
		u = q
	}
	if u >= 10 {
		d[i-2], d[i-1] = digitPairs[2*u], digitPairs[2*u+1]
	} else {
		d[i-1] = byte('0' + u)
	}
	return dst
}

// appendFloat writes the shortest decimal that reads back as the same
// float of that size. A NaN or an infinity has no JSON form and no
// canonical one: the record is refused.
func appendFloat(dst []byte, f float64, bits int) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, fmt.Errorf("%w: %v has no canonical form", dedupe.ErrNonFiniteNumber, f)
	}
	return strconv.AppendFloat(dst, f, 'g', -1, bits), nil
}

func appendBase64(dst []byte, b []byte) []byte {
	dst = append(dst, '"')
	dst = base64.StdEncoding.AppendEncode(dst, b)
	return append(dst, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s, which must be UTF-8: Avro and Protobuf
// strings are, and one that is not is a malformed record. Control
// characters are written \u00XX (the canonical writer's short escapes are
// appendCanonicalString's).
func appendJSONString(dst []byte, s []byte) ([]byte, error) {
	out, _, err := appendQuoted(dst, s, false)
	return out, err
}

// needsAttention says whether any of the eight bytes in x is a control
// character, a quote, a backslash or part of a multi-byte character
// (the bit tricks of "Bit Twiddling Hacks": a byte below n, a zero byte).
func needsAttention(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	control := x - ones*0x20
	quote := x ^ (ones * '"')
	backslash := x ^ (ones * '\\')
	return (control|(quote-ones)&^quote|(backslash-ones)&^backslash|x)&highs != 0
}

// appendDecimal writes a decimal's exact value: b is the unscaled value,
// two's complement big-endian, and scale the digits after the point.
func appendDecimal(dst []byte, b []byte, scale int) []byte {
	var buf [20]byte // a uint64's digits: no allocation for the usual amounts
	neg, digits := decimalDigits(buf[:0], b)
	if neg {
		dst = append(dst, '-')
	}
	if scale == 0 {
		return append(dst, digits...)
	}
	if zeros := scale - len(digits); zeros >= 0 {
		dst = append(dst, '0', '.')
		for range zeros {
			dst = append(dst, '0')
		}
		return append(dst, digits...)
	}
	dst = append(dst, digits[:len(digits)-scale]...)
	dst = append(dst, '.')
	return append(dst, digits[len(digits)-scale:]...)
}

// decimalDigits appends to buf the digits of the absolute value of b, an
// unscaled decimal in two's complement big-endian, and says whether it is
// negative.
func decimalDigits(buf, b []byte) (neg bool, digits []byte) {
	neg = len(b) > 0 && b[0]&0x80 != 0
	if len(b) <= 8 {
		var v int64
		if neg {
			v = -1
		}
		for _, c := range b {
			v = v<<8 | int64(c)
		}
		if v < 0 {
			return neg, appendUint(buf, uint64(-(v+1))+1)
		}
		return neg, appendUint(buf, uint64(v))
	}
	n := new(big.Int).SetBytes(b)
	if neg {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
		n.Neg(n)
	}
	return neg, n.Append(buf, 10)
}
