// Package jsonpointer holds the JSON Pointer (RFC 6901) escape that the
// canonicalizer's diff and the audit's walk both write.
package jsonpointer

// AppendToken appends token escaped for use inside a JSON Pointer: ~ as
// ~0, / as ~1.
func AppendToken(b []byte, token []byte) []byte {
	for _, c := range token {
		switch c {
		case '~':
			b = append(b, '~', '0')
		case '/':
			b = append(b, '~', '1')
		default:
			b = append(b, c)
		}
	}
	return b
}
