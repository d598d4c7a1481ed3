package dedupe

import (
	"math/big"
	"strconv"
)

// Number canonicalization.
//
// RFC 8785 writes a number as ECMAScript's Number.prototype.toString writes
// the IEEE-754 double nearest to it: the shortest digit string d1..dk that
// reads back as that double, laid out by the exponent n (value = 0.d1..dk ×
// 10^n) in plain or exponential notation. Used as is, that would give
// 12345678901234567891 and 12345678901234567000 one fingerprint, although
// they are different requests. So a number whose decimal value does not
// survive the round trip through a double keeps its exact decimal value.
//
// Both cases come down to one function, and that is why they cannot collide.
// Let D(x) be the exact decimal value of the literal x, normalized to its
// significant digits (no leading zeros, no trailing zeros) and exponent n,
// and let L be the ECMAScript layout of a digit string and exponent.
//
//   - If x survives the round trip, the shortest digits of its double are,
//     by the definition of surviving, exactly D(x); RFC 8785 writes L(D(x)).
//   - If it does not survive, the contract keeps its exact value: L(D(x)).
//
// So every number is written as L(D(x)), and this code never needs to
// compute the double at all. L is injective: plain notation shows every
// significant digit and the position of the decimal point (trailing integer
// zeros fill up to n, and a fraction never ends in 0), exponential notation
// shows the digits and n-1 explicitly, and the two notations are told apart
// by the presence of "e". D is injective on decimal values by construction.
// Hence two literals get the same canonical text if and only if they denote
// the same decimal value: 50, 50.0 and 5e1 share one, while a kept-exact
// value, which by definition differs from the shortest form of its double,
// never shares one with that double's RFC 8785 text.
//
// Zero has no significant digits and is written "0", whatever its sign or
// exponent. Values beyond the double range (1e400, 1e-400) are just longer
// exponents in the same layout. The tests check L(D(x)) against the
// ECMAScript formatting of strconv's shortest digits for doubles, and
// against exact rational arithmetic for numbers that do not round-trip.

// appendNumber appends the canonical form of the validated JSON number
// literal lit. digits is a reusable buffer, returned for the next call.
func appendNumber(dst, lit, digits []byte) ([]byte, []byte) {
	i := 0
	neg := lit[0] == '-'
	if neg {
		i++
	}
	intStart := i
	for i < len(lit) && lit[i] >= '0' && lit[i] <= '9' {
		i++
	}
	digits = append(digits[:0], lit[intStart:i]...)
	// point is the position of the decimal point in digits, counted from
	// the left: the value is 0.digits × 10^point until the exponent is added.
	point := int64(i - intStart)
	if i < len(lit) && lit[i] == '.' {
		i++
		j := i
		for i < len(lit) && lit[i] >= '0' && lit[i] <= '9' {
			i++
		}
		digits = append(digits, lit[j:i]...)
	}
	var expNeg bool
	var exp []byte
	if i < len(lit) {
		i++ // 'e' or 'E'
		if lit[i] == '+' || lit[i] == '-' {
			expNeg = lit[i] == '-'
			i++
		}
		exp = lit[i:]
		for len(exp) > 1 && exp[0] == '0' {
			exp = exp[1:]
		}
	}

	lead := 0
	for lead < len(digits) && digits[lead] == '0' {
		lead++
	}
	if lead == len(digits) {
		return append(dst, '0'), digits
	}
	sig := digits[lead:]
	point -= int64(lead)
	for sig[len(sig)-1] == '0' {
		sig = sig[:len(sig)-1]
	}
	if neg {
		dst = append(dst, '-')
	}

	// An exponent of up to 18 digits plus a point offset bounded by the
	// payload size (under 2^31) cannot overflow int64.
	if len(exp) <= 18 {
		var e int64
		for _, c := range exp {
			e = e*10 + int64(c-'0')
		}
		if expNeg {
			e = -e
		}
		return appendLayout(dst, sig, point+e), digits
	}
	return appendHugeExponent(dst, sig, point, exp, expNeg), digits
}

// appendLayout writes 0.sig × 10^n in ECMAScript Number::toString layout
// (ECMA-262, Number::toString, steps for k, n and s).
func appendLayout(dst, sig []byte, n int64) []byte {
	k := int64(len(sig))
	switch {
	case k <= n && n <= 21:
		dst = append(dst, sig...)
		for ; n > k; n-- {
			dst = append(dst, '0')
		}
		return dst
	case 0 < n && n <= 21:
		dst = append(dst, sig[:n]...)
		dst = append(dst, '.')
		return append(dst, sig[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for ; n < 0; n++ {
			dst = append(dst, '0')
		}
		return append(dst, sig...)
	}
	dst = appendMantissa(dst, sig)
	e := n - 1
	if e < 0 {
		dst = append(dst, '-')
		// |e| < 10^18 + 2^31 here, so negating it cannot overflow.
		return strconv.AppendInt(dst, -e, 10)
	}
	dst = append(dst, '+')
	return strconv.AppendInt(dst, e, 10)
}

func appendMantissa(dst, sig []byte) []byte {
	dst = append(dst, sig[0])
	if len(sig) > 1 {
		dst = append(dst, '.')
		dst = append(dst, sig[1:]...)
	}
	return append(dst, 'e')
}

// appendHugeExponent handles exponents of 19 or more digits. They put the
// value far outside the plain-notation range, so only the exponent needs
// arbitrary precision; such payloads are rare enough that its allocations
// do not matter.
func appendHugeExponent(dst, sig []byte, point int64, exp []byte, expNeg bool) []byte {
	e, _ := new(big.Int).SetString(string(exp), 10)
	if expNeg {
		e.Neg(e)
	}
	e.Add(e, big.NewInt(point-1))
	dst = appendMantissa(dst, sig)
	if e.Sign() < 0 {
		dst = append(dst, '-')
		e.Neg(e)
	} else {
		dst = append(dst, '+')
	}
	return e.Append(dst, 10)
}
