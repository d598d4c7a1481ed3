package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

var fuzzSeeds = []string{
	`{"a":1,"b":[1,2,{"c":null}]}`,
	`{"client_time":1,"items":[{"sku":"a","client_ts":2},{"sku":"b"}],"tags":["z","a"]}`,
	`{"amount":50.0,"n":[5e1,-0,1e400,12345678901234567891,0.10000000000000001]}`,
	`{"\u0061":"\u00e9\ud83d\ude00","\uffff":"\u0000","😀":"\/"}`,
	`[[[[]]],{},"",0,true,false,null]`,
	`{"a":1,"a":2}`,
	`{"a":1,"\u0061":2}`,
	`"\ud800"`,
	"\"\xff\"",
	`{"a":[1,2,]}`,
	`{} x`,
	`-0.0e-5`,
	`1E+999999999999999999999`,
	nested(65, "[", "]", ""),
	nested(64, `{"a":`, "}", "1"),
}

// FuzzCanonical checks the canonicalizer's invariants on arbitrary input:
// it never panics, rejects exactly what is not acceptable JSON, produces
// valid JSON that is its own canonical form, and gives one fingerprint to
// every re-encoding of the same document and to every addition of volatile
// fields.
func FuzzCanonical(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Add(benchPayload(1 << 10))
	golden, _ := filepath.Glob(filepath.Join("testdata", "canonical", "*.json"))
	for _, path := range golden {
		if b, err := os.ReadFile(path); err == nil {
			f.Add(b)
		}
	}
	c := newCanon(f, specRules)
	plain := newCanon(f, CanonicalRules{})
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := c.AppendCanonical(nil, data)
		if err != nil {
			checkRejection(t, data, err)
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted what encoding/json rejects: %q -> %q", data, out)
		}
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("canonical form is not valid JSON: %q", out)
		}
		for _, cz := range []*Canonicalizer{c, plain} {
			again, err := cz.AppendCanonical(nil, out)
			if err != nil || !bytes.Equal(again, out) {
				t.Fatalf("canonical form is not a fixed point: %q -> %q, %v", out, again, err)
			}
		}
		fp, err := c.Fingerprint(data)
		sum := sha256.Sum256(out)
		if err != nil || fp != "sha256:"+hex.EncodeToString(sum[:]) {
			t.Fatalf("Fingerprint = %s, %v; want the hash of %q", fp, err, out)
		}

		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("encoding/json cannot decode accepted input %q: %v", data, err)
		}
		for _, style := range []encodeStyle{{}, {reverse: true, escapeAll: true, respell: true, indent: "\n\t "}, {reverse: true, indent: " "}} {
			re := encodeJSON(nil, v, style, 0)
			checkSameFingerprint(t, c, data, re, fp)
		}
		if addVolatile(v) {
			re := encodeJSON(nil, v, encodeStyle{reverse: true}, 0)
			checkSameFingerprint(t, c, data, re, fp)
		}
	})
}

func checkSameFingerprint(t *testing.T, c *Canonicalizer, data, re []byte, fp string) {
	t.Helper()
	got, err := c.Fingerprint(re)
	if err != nil || got != fp {
		a, _ := c.AppendCanonical(nil, data)
		b, errB := c.AppendCanonical(nil, re)
		t.Fatalf("re-encoding changed the fingerprint:\n  input %q\nre-encoded %q\n  canonical %q\nre-canonical %q (%v)", data, re, a, b, errB)
	}
	if d, err := c.Diff(data, re); err != nil || d != nil {
		t.Fatalf("Diff of a re-encoding = %q, %v", d, err)
	}
}

// checkRejection asserts err is a well-formed rejection, and that input
// encoding/json accepts is rejected only for reasons the contract adds.
func checkRejection(t *testing.T, data []byte, err error) {
	t.Helper()
	var me *malformedError
	if !errors.Is(err, ErrMalformedPayload) || !errors.As(err, &me) {
		t.Fatalf("rejection %v does not wrap ErrMalformedPayload", err)
	}
	if me.offset < 0 || me.offset > len(data) || !strings.HasPrefix(err.Error(), "malformed payload: ") || !strings.Contains(err.Error(), " at offset ") {
		t.Fatalf("badly formed rejection %q for %q", err, data)
	}
	if !json.Valid(data) {
		return
	}
	for _, reason := range []string{"duplicate member name", "nesting deeper than", "lone surrogate", "invalid utf-8"} {
		if strings.Contains(me.msg, reason) {
			return
		}
	}
	t.Fatalf("rejected JSON that encoding/json accepts: %q: %v", data, err)
}

// addVolatile adds the spec rules' volatile members to a decoded document,
// reporting whether it found anywhere to add them.
func addVolatile(v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	m["client_time"] = "2030-01-01T00:00:00Z"
	m["retry_count"] = json.Number("7")
	m["trace_id"] = map[string]any{"nested": []any{"x", nil}}
	if items, ok := m["items"].([]any); ok {
		for _, it := range items {
			if im, ok := it.(map[string]any); ok {
				im["client_ts"] = json.Number("1e3")
			}
		}
	}
	return true
}

type encodeStyle struct {
	reverse   bool   // members in reverse byte order
	escapeAll bool   // every non-ASCII character and some ASCII ones as \u escapes
	respell   bool   // numbers with extra zeros and exponents
	indent    string // whitespace between tokens
}

// encodeJSON writes v, as decoded by encoding/json with UseNumber, in a
// spelling different from the canonical one but of the same value.
func encodeJSON(b []byte, v any, s encodeStyle, depth int) []byte {
	sep := func(b []byte) []byte {
		if s.indent == "" {
			return b
		}
		return append(b, s.indent[:1+depth%len(s.indent)]...)
	}
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, v)
	case json.Number:
		lit := string(v)
		if s.respell && !strings.ContainsAny(lit, "eE") {
			if strings.Contains(lit, ".") {
				lit += "0E+0"
			} else {
				lit += ".0e-0"
			}
		}
		return append(b, lit...)
	case string:
		if !s.escapeAll {
			enc, _ := json.Marshal(v)
			return append(b, enc...)
		}
		b = append(b, '"')
		for _, r := range v {
			if r < 0x80 && r != '"' && r != '\\' && r >= 0x20 && r != 'u' {
				b = append(b, byte(r))
				continue
			}
			for _, u := range utf16.Encode([]rune{r}) {
				b = append(b, `\u`...)
				b = append(b, strings.ToUpper(strconv.FormatUint(uint64(u)|0x10000, 16)[1:])...)
			}
		}
		return append(b, '"')
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = sep(b)
			b = encodeJSON(b, e, s, depth+1)
		}
		return append(sep(b), ']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if s.reverse {
			slices.Reverse(keys)
		}
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = sep(b)
			b = encodeJSON(b, k, s, depth+1)
			b = append(sep(b), ':')
			b = encodeJSON(b, v[k], s, depth+1)
		}
		return append(sep(b), '}')
	}
	panic("unexpected decoded type")
}

// FuzzCanonicalNumber checks that a number keeps its exact value, is
// written canonically, and is written as RFC 8785 writes it whenever it
// survives a round trip through a double.
func FuzzCanonicalNumber(f *testing.F) {
	for _, s := range []string{"0", "-0.0", "50.0", "5e1", "1e21", "1e-7", "0.000001", "12345678901234567891",
		"333333333.33333329", "1e400", "-1e-400", "4.9406564584124654e-324", "1.7976931348623157e308", "123.456e-3"} {
		f.Add(s)
	}
	c := newCanon(f, CanonicalRules{})
	f.Fuzz(func(t *testing.T, lit string) {
		if lit == "" || !(lit[0] == '-' || (lit[0] >= '0' && lit[0] <= '9')) || strings.TrimSpace(lit) != lit {
			return
		}
		out, err := c.AppendCanonical(nil, []byte(lit))
		if err != nil {
			if json.Valid([]byte(lit)) {
				t.Fatalf("rejected the JSON number %q: %v", lit, err)
			}
			return
		}
		// Exact rational comparison of huge exponents would take too long;
		// their layout is covered by TestCanonicalNumbers.
		if i := strings.IndexAny(lit, "eE"); i >= 0 {
			if e, err := strconv.Atoi(lit[i+1:]); err != nil || e > 2000 || e < -2000 {
				return
			}
		}
		checkExactNumber(t, c, lit, string(out))
	})
}
