package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

var update = flag.Bool("update", false, "rewrite testdata/canonical/spec-*.out.json from the current implementation (never the rfc8785-* files)")

// specRules are the rules of the product spec's example pipeline; the
// spec-* golden files are canonicalized under them.
var specRules = CanonicalRules{
	Volatile:  []string{"/client_time", "/retry_count", "/trace_id", "/items/*/client_ts"},
	Unordered: []string{"/items", "/tags"},
}

func newCanon(t testing.TB, r CanonicalRules) *Canonicalizer {
	t.Helper()
	c, err := NewCanonicalizer(r)
	if err != nil {
		t.Fatalf("NewCanonicalizer(%+v): %v", r, err)
	}
	return c
}

func canonString(t testing.TB, c *Canonicalizer, in string) string {
	t.Helper()
	out, err := c.AppendCanonical(nil, []byte(in))
	if err != nil {
		t.Fatalf("AppendCanonical(%q): %v", in, err)
	}
	return string(out)
}

func fingerprint(t testing.TB, c *Canonicalizer, in string) string {
	t.Helper()
	fp, err := c.Fingerprint([]byte(in))
	if err != nil {
		t.Fatalf("Fingerprint(%q): %v", in, err)
	}
	return fp
}

var fingerprintRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func TestCanonicalGolden(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "canonical", "*.in.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) < 7 {
		t.Fatalf("found %d golden inputs, want at least 7: testdata missing?", len(inputs))
	}
	for _, inPath := range inputs {
		name := strings.TrimSuffix(filepath.Base(inPath), ".in.json")
		if name == "rfc8785-example" {
			continue // TestCanonicalRFC8785Example: the contract deliberately deviates from it
		}
		t.Run(name, func(t *testing.T) {
			fromRFC := strings.HasPrefix(name, "rfc8785-")
			rules := specRules
			if fromRFC {
				rules = CanonicalRules{}
			}
			c := newCanon(t, rules)
			in, err := os.ReadFile(inPath)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.AppendCanonical(nil, in)
			if err != nil {
				t.Fatalf("canonicalizing: %v", err)
			}
			outPath := strings.TrimSuffix(inPath, ".in.json") + ".out.json"
			if *update && !fromRFC {
				if err := os.WriteFile(outPath, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(outPath)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("canonical form differs from %s\n got: %s\nwant: %s", outPath, got, want)
			}
			again, err := c.AppendCanonical(nil, got)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("canonical form is not a fixed point: %s -> %s (%v)", got, again, err)
			}
			if !json.Valid(got) {
				t.Errorf("canonical form is not valid JSON: %s", got)
			}
		})
	}
}

// TestCanonicalRFC8785Example runs the example of RFC 8785 section 3.2.3. Its first
// number, 333333333.33333329, is not the shortest form of its double
// (333333333.3333333); RFC 8785 rounds it, and the contract keeps it exact
// so that two different decimal values never share a fingerprint. That is
// the only byte allowed to differ from the RFC's output.
func TestCanonicalRFC8785Example(t *testing.T) {
	in, err := os.ReadFile("testdata/canonical/rfc8785-example.in.json")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/canonical/rfc8785-example.out.json")
	if err != nil {
		t.Fatal(err)
	}
	c := newCanon(t, CanonicalRules{})

	// The golden files are the RFC's, as a pure RFC 8785 implementation
	// confirms.
	if got, err := jcs.Transform(in); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("jcs.Transform of the RFC example = %s, %v; golden file says %s", got, err, want)
	}

	got := canonString(t, c, string(in))
	wantExact := strings.Replace(string(want), "[333333333.3333333,", "[333333333.33333329,", 1)
	if got != wantExact {
		t.Errorf("RFC example:\n got: %s\nwant: %s", got, wantExact)
	}

	rounded := strings.Replace(string(in), "333333333.33333329", "333333333.3333333", 1)
	if got := canonString(t, c, rounded); got != string(want) {
		t.Errorf("RFC example with the number spelled as its double:\n got: %s\nwant: %s", got, want)
	}
}

// rfc8785NumberTable is RFC 8785 Appendix B: IEEE-754 bit patterns and their
// serialization. testdata/canonical/rfc8785-numbers.{in,out}.json hold the
// same rows as JSON arrays: the shortest round-trip decimal of each double
// as strconv prints it, and the RFC's expected text.
var rfc8785NumberTable = []struct {
	bits uint64
	want string
}{
	{0x0000000000000000, "0"},
	{0x8000000000000000, "0"},
	{0x0000000000000001, "5e-324"},
	{0x8000000000000001, "-5e-324"},
	{0x7fefffffffffffff, "1.7976931348623157e+308"},
	{0xffefffffffffffff, "-1.7976931348623157e+308"},
	{0x4340000000000000, "9007199254740992"},
	{0xc340000000000000, "-9007199254740992"},
	{0x4430000000000000, "295147905179352830000"},
	{0x44b52d02c7e14af5, "9.999999999999997e+22"},
	{0x44b52d02c7e14af6, "1e+23"},
	{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
	{0x444b1ae4d6e2ef4e, "999999999999999700000"},
	{0x444b1ae4d6e2ef4f, "999999999999999900000"},
	{0x444b1ae4d6e2ef50, "1e+21"},
	{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
	{0x3eb0c6f7a0b5ed8d, "0.000001"},
	{0x41b3de4355555553, "333333333.3333332"},
	{0x41b3de4355555554, "333333333.33333325"},
	{0x41b3de4355555555, "333333333.3333333"},
	{0x41b3de4355555556, "333333333.3333334"},
	{0x41b3de4355555557, "333333333.33333343"},
	{0xbecbf647612f3696, "-0.0000033333333333333333"},
	{0x43143ff3c1cb0959, "1424953923781206.2"},
}

func readNumberArray(t *testing.T, path string) []json.Number {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var ns []json.Number
	if err := dec.Decode(&ns); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return ns
}

func TestCanonicalRFC8785Numbers(t *testing.T) {
	in := readNumberArray(t, "testdata/canonical/rfc8785-numbers.in.json")
	out := readNumberArray(t, "testdata/canonical/rfc8785-numbers.out.json")
	if len(in) != len(rfc8785NumberTable) || len(out) != len(rfc8785NumberTable) {
		t.Fatalf("golden arrays have %d and %d numbers, the table %d", len(in), len(out), len(rfc8785NumberTable))
	}
	c := newCanon(t, CanonicalRules{})
	for i, row := range rfc8785NumberTable {
		f, err := strconv.ParseFloat(string(in[i]), 64)
		if err != nil || math.Float64bits(f) != row.bits {
			t.Errorf("row %d: input %s is not the double %016x", i, in[i], row.bits)
		}
		if strconv.FormatFloat(f, 'g', -1, 64) != string(in[i]) {
			t.Errorf("row %d: input %s is not the shortest form of its double", i, in[i])
		}
		if string(out[i]) != row.want {
			t.Errorf("row %d: golden output %s, RFC says %s", i, out[i], row.want)
		}
		if got := canonString(t, c, string(in[i])); got != row.want {
			t.Errorf("%016x: %s canonicalized to %s, want %s", row.bits, in[i], got, row.want)
		}
		if got := canonString(t, c, row.want); got != row.want {
			t.Errorf("%016x: RFC form %s is not a fixed point: %s", row.bits, row.want, got)
		}
	}
	// The RFC's rows for NaN and Infinity have no JSON spelling at all.
	for _, in := range []string{"NaN", "Infinity", "-Infinity", "[NaN]"} {
		if _, err := c.AppendCanonical(nil, []byte(in)); !errors.Is(err, ErrMalformedPayload) {
			t.Errorf("%s: err = %v, want malformed", in, err)
		}
	}
}

func TestCanonicalNumbers(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	for _, tc := range []struct{ in, want string }{
		{"0", "0"},
		{"-0", "0"},
		{"-0.0", "0"},
		{"-0.0e5", "0"},
		{"0e999999999999999999999999", "0"},
		{"1", "1"},
		{"-1", "-1"},
		{"1.0", "1"},
		{"1.50", "1.5"},
		{"1e2", "100"},
		{"1E+2", "100"},
		{"100e-2", "1"},
		{"50", "50"},
		{"50.0", "50"},
		{"5e1", "50"},
		{"0.5e2", "50"},
		{"500e-1", "50"},
		{"0.1", "0.1"},
		{"1e21", "1e+21"},
		{"1e20", "100000000000000000000"},
		{"100000000000000000000", "100000000000000000000"},
		{"1000000000000000000000", "1e+21"},
		{"123456789012345678901", "123456789012345678901"},
		{"1234567890123456789012", "1.234567890123456789012e+21"},
		{"1e-7", "1e-7"},
		{"1e-6", "0.000001"},
		{"0.000001", "0.000001"},
		{"0.0000001", "1e-7"},
		{"-0.00000123", "-0.00000123"},
		{"123e-20", "1.23e-18"},
		{"1.5e300", "1.5e+300"},
		// Exact decimals that a double would change.
		{"12345678901234567891", "12345678901234567891"},
		{"12345678901234567000", "12345678901234567000"},
		{"9007199254740993", "9007199254740993"},
		{"0.10000000000000001", "0.10000000000000001"},
		{"333333333.33333329", "333333333.33333329"},
		{"4.9406564584124654e-324", "4.9406564584124654e-324"},
		// Beyond the double range.
		{"1e400", "1e+400"},
		{"-1E+400", "-1e+400"},
		{"1e-400", "1e-400"},
		{"0.00012e-400", "1.2e-404"},
		{"1e999999999999999999999", "1e+999999999999999999999"},
		{"123.456e-999999999999999999999", "1.23456e-999999999999999999997"},
		{"-0.001e1000000000000000000", "-1e+999999999999999997"},
		{"1e000000000000000000000000002", "100"},
	} {
		if got := canonString(t, c, tc.in); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestCanonicalNumbersAgreeWithRFC8785 checks that every spelling of a
// double's exact value is written as RFC 8785 writes the double, with
// gowebpki/jcs's ECMAScript formatting as the oracle.
func TestCanonicalNumbersAgreeWithRFC8785(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	rng := rand.New(rand.NewPCG(8785, 1))
	n := 50000
	if testing.Short() {
		n = 2000
	}
	var buf []byte
	for i := 0; i < n; i++ {
		var f float64
		switch i % 3 {
		case 0:
			f = math.Float64frombits(rng.Uint64())
		case 1:
			f = float64(rng.Int64N(1<<60)) * math.Pow(10, float64(rng.IntN(50)-25))
		default:
			f = rng.NormFloat64() * math.Pow(10, float64(rng.IntN(40)-20))
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		want, err := jcs.NumberToJSON(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, spelling := range []string{
			strconv.FormatFloat(f, 'g', -1, 64),
			strconv.FormatFloat(f, 'e', -1, 64),
			strconv.FormatFloat(f, 'E', -1, 64),
			strconv.FormatFloat(f, 'f', -1, 64),
		} {
			var err error
			buf, err = c.AppendCanonical(buf[:0], []byte(spelling))
			if err != nil {
				t.Fatalf("%s: %v", spelling, err)
			}
			if string(buf) != want {
				t.Fatalf("%016x spelled %s: got %s, want %s", math.Float64bits(f), spelling, buf, want)
			}
		}
	}
}

// TestCanonicalNumbersKeepExactValue checks random literals, most of which
// do not survive a round trip through a double: the canonical text must have
// exactly the literal's value, be a fixed point, and equal RFC 8785's text
// whenever the literal does survive.
func TestCanonicalNumbersKeepExactValue(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	rng := rand.New(rand.NewPCG(1, 8785))
	n := 20000
	if testing.Short() {
		n = 1000
	}
	for i := 0; i < n; i++ {
		lit := randomNumberLiteral(rng)
		got := canonString(t, c, lit)
		checkExactNumber(t, c, lit, got)
	}
}

func randomNumberLiteral(rng *rand.Rand) string {
	var b strings.Builder
	if rng.IntN(2) == 0 {
		b.WriteByte('-')
	}
	digits := func(n int, leadNonZero bool) {
		for j := 0; j < n; j++ {
			d := byte('0' + rng.IntN(10))
			if j == 0 && leadNonZero && d == '0' {
				d = '1'
			}
			if rng.IntN(4) == 0 {
				d = '0'
				if j == 0 && leadNonZero {
					d = '9'
				}
			}
			b.WriteByte(d)
		}
	}
	if rng.IntN(3) == 0 {
		b.WriteByte('0')
	} else {
		digits(1+rng.IntN(25), true)
	}
	if rng.IntN(2) == 0 {
		b.WriteByte('.')
		digits(1+rng.IntN(25), false)
	}
	if rng.IntN(2) == 0 {
		b.WriteByte("eE"[rng.IntN(2)])
		if s := rng.IntN(3); s > 0 {
			b.WriteByte("+-"[s-1])
		}
		b.WriteString(strconv.Itoa(rng.IntN(700)))
	}
	return b.String()
}

// checkExactNumber asserts that canonical text got of literal lit has lit's
// exact value, is canonical itself, and is RFC 8785's text when lit
// survives a round trip through a double.
func checkExactNumber(t testing.TB, c *Canonicalizer, lit, got string) {
	t.Helper()
	in, ok1 := new(big.Rat).SetString(lit)
	out, ok2 := new(big.Rat).SetString(got)
	if !ok1 || !ok2 || in.Cmp(out) != 0 {
		t.Fatalf("%s canonicalized to %s, a different value", lit, got)
	}
	if again := canonString(t, c, got); again != got {
		t.Fatalf("%s -> %s is not a fixed point: %s", lit, got, again)
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || f == 0 {
		return
	}
	shortest, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	if shortest.Cmp(in) == 0 {
		want, _ := jcs.NumberToJSON(f)
		if got != want {
			t.Fatalf("%s survives a round trip, so want RFC 8785's %s, got %s", lit, want, got)
		}
	}
}

func TestCanonicalStrings(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	for _, tc := range []struct{ in, want string }{
		{`"u"`, `"u"`},
		{`"\u0075"`, `"u"`},
		{`"\/"`, `"/"`},
		{`"\"\\"`, `"\"\\"`},
		{`"\u0022\u005c"`, `"\"\\"`},
		{`"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{`"\u0008\u000C\u000a\u000D\u0009"`, `"\b\f\n\r\t"`},
		{`"\u0000\u001F\u000b"`, `"\u0000\u001f\u000b"`},
		{`"\u007f\u0080"`, "\"\x7f\u0080\""},
		{`"\u00e9"`, `"é"`},
		{`"\u00C9"`, `"É"`},
		{`"\u2028\u2029"`, "\"\u2028\u2029\""},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\uD83D\uDE00"`, `"😀"`},
		{`"😀"`, `"😀"`},
		{`"\u003c/script\u003e"`, `"</script>"`},
		{`"a\u0041b\u0042"`, `"aAbB"`},
		{`""`, `""`},
		{`{"\u0061":"\u0062"}`, `{"a":"b"}`},
		{`{"\n":1}`, `{"\n":1}`},
		{`{"\u000a\u0001":1}`, `{"\n\u0001":1}`},
	} {
		if got := canonString(t, c, tc.in); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestCanonicalStructure(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	for _, tc := range []struct{ in, want string }{
		{" \t\r\n{ \"b\" : 1 , \"a\" : [ 1 , 2 , { } , [ ] ] } \n", `{"a":[1,2,{},[]],"b":1}`},
		{`true`, `true`},
		{` false `, `false`},
		{`null`, `null`},
		{`{"10":1,"9":2,"1":3}`, `{"1":3,"10":1,"9":2}`},
		{`{"b":{"d":1,"c":2},"a":[{"z":1,"y":2}]}`, `{"a":[{"y":2,"z":1}],"b":{"c":2,"d":1}}`},
		{`{"":1,"a":2," ":3}`, `{"":1," ":3,"a":2}`},
		// UTF-16 order puts a supplementary character (a surrogate pair)
		// before U+E000-U+FFFF, unlike UTF-8 byte order.
		{`{"\uffff":1,"\ud83d\ude00":2,"\ue000":3,"\ud7ff":4}`, "{\"\ud7ff\":4,\"😀\":2,\"\ue000\":3,\"\uffff\":1}"},
		{"{\"\uffff\":1,\"😀\":2}", "{\"😀\":2,\"\uffff\":1}"},
	} {
		if got := canonString(t, c, tc.in); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestCanonicalCompareUTF16 checks the UTF-8 comparison against transcoding to
// UTF-16 on strings built from the characters where the orders disagree.
func TestCanonicalCompareUTF16(t *testing.T) {
	alphabet := []rune{'a', 'b', 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfb33, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	rng := rand.New(rand.NewPCG(16, 16))
	sign := func(n int) int { return max(-1, min(1, n)) }
	for i := 0; i < 20000; i++ {
		a, b := randomRunes(rng, alphabet), randomRunes(rng, alphabet)
		want := sign(slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b))))
		if got := sign(compareUTF16([]byte(a), []byte(b))); got != want {
			t.Fatalf("compareUTF16(%+q, %+q) = %d, want %d", a, b, got, want)
		}
	}
}

// TestCanonicalNamePrefix checks that comparing the packed prefixes of two
// names orders them as compareUTF16 does whenever the prefixes differ, and
// that the single-load prefix agrees with the byte-wise one.
func TestCanonicalNamePrefix(t *testing.T) {
	alphabet := []rune{0, 'a', 'b', 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfb33, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	rng := rand.New(rand.NewPCG(17, 17))
	sign := func(n int) int { return max(-1, min(1, n)) }
	for i := 0; i < 50000; i++ {
		a, b := randomRunes(rng, alphabet)+randomRunes(rng, alphabet), randomRunes(rng, alphabet)+randomRunes(rng, alphabet)
		pa, pb := namePrefix([]byte(a)), namePrefix([]byte(b))
		if pa != pb {
			got := -1
			if pa > pb {
				got = 1
			}
			if want := sign(compareUTF16([]byte(a), []byte(b))); got != want {
				t.Fatalf("prefixes of %+q and %+q compare %d, names %d", a, b, got, want)
			}
		} else if a[:min(len(a), 8)] != b[:min(len(b), 8)] && len(a) >= 8 && len(b) >= 8 {
			t.Fatalf("%+q and %+q share a prefix but not their first eight bytes", a, b)
		}
		padded := []byte(`"` + a + `":0000000000`)
		if p, ok := prefixAt(padded, 1, 1+len(a)); ok && p != pa {
			t.Fatalf("prefixAt(%+q) = %x, namePrefix = %x", a, p, pa)
		}
	}
}

func randomRunes(rng *rand.Rand, alphabet []rune) string {
	rs := make([]rune, rng.IntN(4))
	for i := range rs {
		rs[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(rs)
}

func TestCanonicalFingerprintFormat(t *testing.T) {
	c := newCanon(t, specRules)
	in := `{"b":[1,2],"a":"x"}`
	fp := fingerprint(t, c, in)
	if !fingerprintRE.MatchString(fp) {
		t.Fatalf("fingerprint %q is not sha256:<64 hex>", fp)
	}
	sum := sha256.Sum256([]byte(`{"a":"x","b":[1,2]}`))
	if want := "sha256:" + hex.EncodeToString(sum[:]); fp != want {
		t.Fatalf("fingerprint = %s, want the SHA-256 of the canonical form, %s", fp, want)
	}
}

// TestCanonicalSameRequest lists payloads the spec says are one request.
func TestCanonicalSameRequest(t *testing.T) {
	c := newCanon(t, specRules)
	for _, group := range [][]string{
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`, " {\n  \"b\" : 2 ,\n\t\"a\":1 }\r\n"},
		{`{"amount":50}`, `{"amount":50.0}`, `{"amount":5e1}`, `{"amount":5.0E+1}`, `{"amount":500e-1}`, `{"amount":0.5e2}`},
		{`{"amount":0}`, `{"amount":-0}`, `{"amount":0.0e10}`},
		{`{"user":"u"}`, `{"user":"\u0075"}`, `{"\u0075ser":"\u0075"}`},
		{`{"path":"/a"}`, `{"path":"\/a"}`},
		{`{"name":"é😀"}`, `{"name":"\u00e9\ud83d\ude00"}`, `{"name":"\u00E9\uD83D\uDE00"}`},
		{
			`{"coupon":"X1","client_time":"2024-01-01T00:00:00Z","retry_count":0,"trace_id":"t1"}`,
			`{"trace_id":"t2","retry_count":3,"client_time":"2024-01-01T00:00:09Z","coupon":"X1"}`,
			`{"coupon":"X1"}`,
			`{"coupon":"X1","client_time":{"nested":[1,2,{"deep":true}]}}`,
		},
		{
			`{"items":[{"sku":"a","qty":1,"client_ts":1},{"sku":"b","qty":2,"client_ts":2}]}`,
			`{"items":[{"sku":"b","qty":2,"client_ts":7},{"sku":"a","qty":1}]}`,
		},
		{`{"tags":["x","y","z"]}`, `{"tags":["z","x","y"]}`, `{"tags":["y","z","x"]}`},
		{`{"tags":[1,1,2]}`, `{"tags":[2,1,1]}`, `{"tags":[1,2,1]}`},
		// Elements that differ only in volatile members sort as equals.
		{
			`{"items":[{"sku":"a","client_ts":2},{"sku":"a","client_ts":1},{"sku":"0"}]}`,
			`{"items":[{"sku":"0"},{"sku":"a","client_ts":9},{"sku":"a"}]}`,
		},
		// Unordered arrays sort by canonical bytes, not by spelling.
		{`{"tags":[10,9.0,{"b":1,"a":2}]}`, `{"tags":[{"a":2,"b":1.0},9,1e1]}`},
	} {
		want := fingerprint(t, c, group[0])
		for _, in := range group[1:] {
			if got := fingerprint(t, c, in); got != want {
				t.Errorf("%s and %s: fingerprints differ (%s vs %s)", group[0], in, canonString(t, c, group[0]), canonString(t, c, in))
			}
		}
	}
}

// TestCanonicalDifferentRequest lists pairs the spec says are different
// requests.
func TestCanonicalDifferentRequest(t *testing.T) {
	c := newCanon(t, specRules)
	for _, pair := range [][2]string{
		{`{"lines":[1,2]}`, `{"lines":[2,1]}`},
		{`{"amount":12345678901234567891}`, `{"amount":12345678901234567000}`},
		{`{"amount":9007199254740993}`, `{"amount":9007199254740992}`},
		{`{"amount":0.1}`, `{"amount":0.10000000000000001}`},
		{`{"amount":1e400}`, `{"amount":1e401}`},
		{`{"amount":1}`, `{"amount":"1"}`},
		{`{"a":null}`, `{}`},
		{`{"a":[]}`, `{"a":{}}`},
		{`{"a":true}`, `{"a":false}`},
		{`{"tags":[1,1,2]}`, `{"tags":[1,2,2]}`},
		{`{"tags":[1,2]}`, `{"tags":[1,2,2]}`},
		{`{"meta":{"client_time":1}}`, `{"meta":{"client_time":2}}`},
		{`{"items":{"client_ts":1}}`, `{"items":{"client_ts":2}}`},
		{`{"lines":[{"client_ts":1}]}`, `{"lines":[{"client_ts":2}]}`},
		{`"a"`, `"A"`},
		{`[1,[2]]`, `[[1],2]`},
	} {
		if a, b := fingerprint(t, c, pair[0]), fingerprint(t, c, pair[1]); a == b {
			t.Errorf("%s and %s share fingerprint %s", pair[0], pair[1], a)
		}
	}
}

func TestCanonicalVolatile(t *testing.T) {
	for _, tc := range []struct {
		volatile []string
		in, want string
	}{
		{[]string{"/client_time"}, `{"a":1,"client_time":2}`, `{"a":1}`},
		{[]string{"/client_time"}, `{"client_time":2}`, `{}`},
		{[]string{"/items/*/client_ts"}, `{"items":[{"sku":"a","client_ts":1},{"client_ts":2},3,[4]]}`, `{"items":[{"sku":"a"},{},3,[4]]}`},
		{[]string{"/items/*/client_ts"}, `{"items":{"x":{"client_ts":1,"k":2},"y":0}}`, `{"items":{"x":{"k":2},"y":0}}`},
		{[]string{"/list/1"}, `{"list":["a","b","c"]}`, `{"list":["a","c"]}`},
		{[]string{"/list/0", "/list/2"}, `{"list":["a","b","c"]}`, `{"list":["b"]}`},
		{[]string{"/list/*"}, `{"list":["a","b"]}`, `{"list":[]}`},
		{[]string{"/list/01"}, `{"list":["a","b"]}`, `{"list":["a","b"]}`},
		{[]string{"/list/01"}, `{"list":{"01":1,"1":2}}`, `{"list":{"1":2}}`},
		{[]string{"/list/1"}, `{"list":{"01":1,"1":2}}`, `{"list":{"01":1}}`},
		{[]string{"/meta/*"}, `{"meta":{"a":1,"b":2},"x":1}`, `{"meta":{},"x":1}`},
		{[]string{"/*/id"}, `{"a":{"id":1,"v":1},"b":[{"id":2}],"c":{"id":3}}`, `{"a":{"v":1},"b":[{"id":2}],"c":{}}`},
		{[]string{"/*/*"}, `{"a":{"id":1},"b":[1,2],"c":3}`, `{"a":{},"b":[],"c":3}`},
		{[]string{"/a~1b/c~0d"}, `{"a/b":{"c~d":1,"e":2}}`, `{"a/b":{"e":2}}`},
		{[]string{"/"}, `{"":1,"a":2}`, `{"a":2}`},
		{[]string{"/a/"}, `{"a":{"":1,"b":2}}`, `{"a":{"b":2}}`},
		{[]string{"/amount"}, `{"\u0061mount":1,"b":2}`, `{"b":2}`},
		{[]string{"/é"}, `{"\u00e9":1,"e":2}`, `{"e":2}`},
		{[]string{"/a", "/a/b"}, `{"a":{"b":1},"c":1}`, `{"c":1}`},
		{[]string{"/a/b", "/*/c"}, `{"a":{"b":1,"c":2,"d":3},"x":{"b":1,"c":2}}`, `{"a":{"d":3},"x":{"b":1}}`},
		{[]string{"/a/b"}, `[{"a":{"b":1}}]`, `[{"a":{"b":1}}]`},
		{[]string{"/0"}, `[1,2]`, `[2]`},
		{[]string{"/client_time"}, `"client_time"`, `"client_time"`},
	} {
		c := newCanon(t, CanonicalRules{Volatile: tc.volatile})
		if got := canonString(t, c, tc.in); got != tc.want {
			t.Errorf("volatile %q on %s: got %s, want %s", tc.volatile, tc.in, got, tc.want)
		}
	}
}

func TestCanonicalUnordered(t *testing.T) {
	for _, tc := range []struct {
		volatile, unordered []string
		in, want            string
	}{
		{nil, []string{"/tags"}, `{"tags":["b","a","c"]}`, `{"tags":["a","b","c"]}`},
		{nil, []string{"/tags"}, `{"tags":{"b":1,"a":2}}`, `{"tags":{"a":2,"b":1}}`},
		{nil, []string{"/tags"}, `{"tags":"ba"}`, `{"tags":"ba"}`},
		{nil, []string{"/tags"}, `{"tags":[]}`, `{"tags":[]}`},
		{nil, []string{"/tags"}, `{"tags":[3,1,2,1]}`, `{"tags":[1,1,2,3]}`},
		{nil, []string{"/tags"}, `{"tags":[[2,1],[1,2]],"other":[2,1]}`, `{"other":[2,1],"tags":[[1,2],[2,1]]}`},
		{nil, []string{"/tags", "/tags/*"}, `{"tags":[[2,1],[1,2]]}`, `{"tags":[[1,2],[1,2]]}`},
		{nil, []string{"/*"}, `{"a":[2,1],"b":{"c":[2,1]}}`, `{"a":[1,2],"b":{"c":[2,1]}}`},
		{nil, []string{"/a/*/b"}, `{"a":[{"b":[2,1]},{"b":[4,3]}]}`, `{"a":[{"b":[1,2]},{"b":[3,4]}]}`},
		{nil, []string{"/0"}, `[[3,2,1],[3,2,1]]`, `[[1,2,3],[3,2,1]]`},
		// Sorting is by canonical bytes: "10" < "9" < "[" < "{" < "\"".
		{nil, []string{"/t"}, `{"t":[{"a":1},[1],"s",9,10,true,null,false]}`, `{"t":["s",10,9,[1],false,null,true,{"a":1}]}`},
		{[]string{"/items/*/ts"}, []string{"/items"}, `{"items":[{"id":2,"ts":1},{"id":1,"ts":2}]}`, `{"items":[{"id":1},{"id":2}]}`},
		{[]string{"/items/0"}, []string{"/items"}, `{"items":[9,3,1]}`, `{"items":[1,3]}`},
		{[]string{"/items"}, []string{"/items"}, `{"items":[2,1],"x":1}`, `{"x":1}`},
	} {
		c := newCanon(t, CanonicalRules{Volatile: tc.volatile, Unordered: tc.unordered})
		if got := canonString(t, c, tc.in); got != tc.want {
			t.Errorf("volatile %q unordered %q on %s: got %s, want %s", tc.volatile, tc.unordered, tc.in, got, tc.want)
		}
	}
}

func nested(depth int, open, close, inner string) string {
	return strings.Repeat(open, depth) + inner + strings.Repeat(close, depth)
}

func TestCanonicalDepth(t *testing.T) {
	c := newCanon(t, specRules)
	for _, tc := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"64 arrays", nested(64, "[", "]", "1"), true},
		{"65 arrays", nested(65, "[", "]", "1"), false},
		{"64 objects", nested(64, `{"a":`, "}", "1"), true},
		{"65 objects", nested(65, `{"a":`, "}", "1"), false},
		{"64 mixed", nested(32, `{"a":[`, "]}", "1"), true},
		{"65 mixed", nested(32, `{"a":[`, "]}", "[]"), false},
		{"64 empty arrays", nested(64, "[", "]", ""), true},
		{"65 empty arrays", nested(65, "[", "]", ""), false},
		{"deep siblings", "[" + strings.Repeat(nested(63, "[", "]", "")+",", 100) + "1]", true},
		{"a million brackets", strings.Repeat("[", 1<<20), false},
	} {
		out, err := c.AppendCanonical(nil, []byte(tc.in))
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.ok && string(out) != strings.Join(strings.Fields(tc.in), ""):
			t.Errorf("%s: canonical form changed the document: %.80s", tc.name, out)
		case !tc.ok && !errors.Is(err, ErrMalformedPayload):
			t.Errorf("%s: err = %v, want malformed", tc.name, err)
		case !tc.ok && !strings.Contains(err.Error(), "nesting deeper than 64 levels at offset"):
			t.Errorf("%s: err = %v, want it to name the depth limit", tc.name, err)
		}
	}
}

func TestCanonicalMalformed(t *testing.T) {
	c := newCanon(t, specRules)
	for _, tc := range []struct{ in, msg string }{
		{``, "unexpected end of input at offset 0"},
		{" \n", "unexpected end of input at offset 2"},
		{`{"amount":1,"amount":2}`, `duplicate member name "amount" at offset 12`},
		{`{"a":1,"\u0061":2}`, `duplicate member name "a" at offset 7`},
		{`{"b":{"x":1,"y":2,"x":3}}`, `duplicate member name "x" at offset 18`},
		{`{"client_time":1,"client_time":2}`, `duplicate member name "client_time"`},
		{`{"items":[{"client_ts":1,"client_ts":2}]}`, `duplicate member name "client_ts"`},
		{"\"\xff\"", "invalid utf-8 at offset 1"},
		{"{\"a\xc3\":1}", "invalid utf-8 at offset 3"},
		{"\"\xc0\xaf\"", "invalid utf-8 at offset 1"},
		{"\"\xed\xa0\x80\"", "invalid utf-8 at offset 1"},
		{"\"\xf4\x90\x80\x80\"", "invalid utf-8 at offset 1"},
		{`"\ud800"`, `lone surrogate \ud800 at offset 1`},
		{`"\udc00"`, `lone surrogate \udc00 at offset 1`},
		{`"x\ud83d\u0041"`, `lone surrogate \ud83d at offset 2`},
		{`"\ud83dx"`, `lone surrogate \ud83d at offset 1`},
		{`"\ud83d\ud83d"`, `lone surrogate \ud83d at offset 1`},
		{`{"\udfff":1}`, `lone surrogate \udfff at offset 2`},
		{`{} x`, "trailing data after the top-level value at offset 3"},
		{`{}{}`, "trailing data after the top-level value at offset 2"},
		{`1 2`, "trailing data after the top-level value at offset 2"},
		{"{}\x00", "trailing data after the top-level value at offset 2"},
		{`[1,]`, "invalid character ']' looking for a value at offset 3"},
		{`{"a":1,}`, "invalid character '}' looking for a member name at offset 7"},
		{`{a:1}`, "invalid character 'a' looking for a member name at offset 1"},
		{`{"a" 1}`, "invalid character '1' after member name at offset 5"},
		{`{"a":1 "b":2}`, `invalid character '"' after object member at offset 7`},
		{`[1 2]`, "invalid character '2' after array element at offset 3"},
		{`[1}`, "invalid character '}' after array element at offset 2"},
		{`[01]`, "invalid character '1' after array element at offset 2"},
		{`[1.]`, "invalid character ']' after decimal point at offset 3"},
		{`[.5]`, "invalid character '.' looking for a value at offset 1"},
		{`[1e]`, "invalid character ']' in exponent at offset 3"},
		{`[1e+]`, "invalid character ']' in exponent at offset 4"},
		{`[+1]`, "invalid character '+' looking for a value at offset 1"},
		{`[-]`, "invalid character ']' in number at offset 2"},
		{`-`, "unexpected end of input at offset 1"},
		{`1.`, "unexpected end of input at offset 2"},
		{`1e`, "unexpected end of input at offset 2"},
		{`tru`, "unexpected end of input at offset 3"},
		{`trUe`, "invalid character 'U' in literal true at offset 2"},
		{`nul`, "unexpected end of input at offset 3"},
		{`NaN`, "invalid character 'N' looking for a value at offset 0"},
		{`'a'`, `invalid character '\'' looking for a value at offset 0`},
		{"\xef\xbb\xbf{}", "invalid character byte 0xef looking for a value at offset 0"},
		{"\"a\x01\"", "control character 0x1 in string at offset 2"},
		{"\"a\nb\"", "control character 0xa in string at offset 2"},
		{`"abc`, "unterminated string at offset 0"},
		{`{"abc`, "unterminated string at offset 1"},
		{`"\x"`, `invalid escape \x at offset 1`},
		{`"\u12"`, `invalid \u escape at offset 1`},
		{`"\u12G4"`, `invalid \u escape at offset 1`},
		{`"\`, "unexpected end of input at offset 2"},
		{`{"a":1`, "unexpected end of input at offset 6"},
		{`[`, "unexpected end of input at offset 1"},
		{`{"a"`, "unexpected end of input at offset 4"},
		{`]`, "invalid character ']' looking for a value at offset 0"},
	} {
		out, err := c.AppendCanonical([]byte("prefix"), []byte(tc.in))
		if !errors.Is(err, ErrMalformedPayload) {
			t.Errorf("%q: err = %v, want malformed", tc.in, err)
			continue
		}
		if want := "malformed payload: " + tc.msg; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: err = %q, want %q", tc.in, err, want)
		}
		if string(out) != "prefix" {
			t.Errorf("%q: dst changed to %q on error", tc.in, out)
		}
		if _, err := c.Fingerprint([]byte(tc.in)); !errors.Is(err, ErrMalformedPayload) {
			t.Errorf("%q: Fingerprint err = %v, want malformed", tc.in, err)
		}
	}
}

// Every byte that is not plain in a string (escape, quote, control
// character, invalid UTF-8) must be found wherever it falls, and a string
// cut off at any length must be unterminated, never read past its end.
func TestCanonicalStringScanBoundaries(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	for n := 0; n <= 24; n++ {
		in := `"` + strings.Repeat("a", n)
		if _, err := c.Fingerprint([]byte(in)); err == nil || err.Error() != "malformed payload: unterminated string at offset 0" {
			t.Errorf("%q: err = %v, want unterminated string", in, err)
		}
	}
	for _, tc := range []struct{ ins, canon, msg string }{
		{`\n`, `\n`, ""},
		{`\\`, `\\`, ""},
		{`\u0041`, "A", ""},
		{"é", "é", ""},
		{" ", " ", ""},
		{"\x7f", "\x7f", ""},
		{`"`, "", "after array element"},
		{"\x01", "", "control character 0x1 in string"},
		{"\x1f", "", "control character 0x1f in string"},
		{"\xff", "", "invalid utf-8"},
	} {
		for at := 0; at <= 20; at++ {
			body := strings.Repeat("a", at) + tc.ins + strings.Repeat("b", 20-at)
			in := `["` + body + `"]`
			out, err := c.AppendCanonical(nil, []byte(in))
			if tc.msg != "" {
				if err == nil || !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("%q: err = %v, want %q", in, err, tc.msg)
				}
				continue
			}
			want := `["` + strings.Repeat("a", at) + tc.canon + strings.Repeat("b", 20-at) + `"]`
			if err != nil || string(out) != want {
				t.Errorf("%q: %q, %v; want %q", in, out, err, want)
			}
		}
	}
}

// Small objects are sorted by insertion, which notices a duplicate name as
// a tie between two members it compares; larger ones are checked after the
// sort. Either way an object is rejected exactly when a name repeats.
func TestCanonicalDuplicatesInAnyOrder(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	rng := rand.New(rand.NewPCG(7, 11))
	// Names as written in the payload; the escaped ones equal others.
	names := []string{"a", "b", "c", "ab", "ba", `\u0061`, "é", "😀", `\ud83d\ude00`, "\uffff", `\uffff`, "z"}
	decoded := map[string]string{`\u0061`: "a", `\ud83d\ude00`: "😀", `\uffff`: "\uffff"}
	for range 5000 {
		n := 1 + rng.IntN(16)
		seen := map[string]bool{}
		dup := false
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			name := names[rng.IntN(len(names))]
			key := name
			if d, ok := decoded[name]; ok {
				key = d
			}
			dup = dup || seen[key]
			seen[key] = true
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"%s":%d`, name, i)
		}
		b.WriteString("}")
		in := b.String()
		_, err := c.Fingerprint([]byte(in))
		switch {
		case dup && (err == nil || !strings.Contains(err.Error(), "duplicate member name")):
			t.Fatalf("%s: err = %v, want a duplicate", in, err)
		case !dup && err != nil:
			t.Fatalf("%s: %v", in, err)
		}
	}
}

func TestCanonicalDuplicateMessage(t *testing.T) {
	c := newCanon(t, CanonicalRules{})
	in := `{"coupon": "SPRING", "user": 7, "amount": 100, "amount": 100}`
	_, err := c.Fingerprint([]byte(in))
	want := fmt.Sprintf(`malformed payload: duplicate member name "amount" at offset %d`, strings.LastIndex(in, `"amount"`))
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
	long := strings.Repeat("n", 200)
	_, err = c.Fingerprint([]byte(`{"` + long + `":1,"` + long + `":2}`))
	if err == nil || len(err.Error()) > 150 || !strings.Contains(err.Error(), `nnnn"... at offset 206`) {
		t.Fatalf("a long duplicate name must be truncated in the message: %v", err)
	}
}

func TestCanonicalRawPayload(t *testing.T) {
	c := newCanon(t, CanonicalRules{Payload: PayloadRaw})
	for _, in := range []string{`{"a":1}`, `{"a": 1}`, `{"b":1,"a":1}`, "not json \xff", ""} {
		fp := fingerprint(t, c, in)
		sum := sha256.Sum256([]byte(in))
		if want := "sha256:" + hex.EncodeToString(sum[:]); fp != want {
			t.Errorf("raw %q: fingerprint %s, want %s", in, fp, want)
		}
		out, err := c.AppendCanonical([]byte("x"), []byte(in))
		if err != nil || string(out) != "x"+in {
			t.Errorf("raw %q: AppendCanonical = %q, %v", in, out, err)
		}
	}
	if fingerprint(t, c, `{"a":1}`) == fingerprint(t, c, `{"a": 1}`) {
		t.Error("raw payloads that differ in whitespace share a fingerprint")
	}
	if got := c.Rules().Payload; got != PayloadRaw {
		t.Errorf("Rules().Payload = %q", got)
	}
}

func TestCanonicalRulesDigest(t *testing.T) {
	digest := func(r CanonicalRules) string {
		t.Helper()
		d := newCanon(t, r).RulesDigest()
		if !fingerprintRE.MatchString(d) {
			t.Fatalf("digest %q is not sha256:<64 hex>", d)
		}
		return d
	}
	base := digest(specRules)
	for _, same := range []CanonicalRules{
		{Payload: PayloadJSON, Volatile: specRules.Volatile, Unordered: specRules.Unordered},
		{Volatile: []string{"/items/*/client_ts", "/trace_id", "/retry_count", "/client_time"}, Unordered: []string{"/tags", "/items"}},
		{Volatile: []string{"/trace_id", "/client_time", "/retry_count", "/items/*/client_ts", "/trace_id"}, Unordered: []string{"/items", "/tags", "/items"}},
	} {
		if got := digest(same); got != base {
			t.Errorf("rules %+v: digest %s, want %s", same, got, base)
		}
	}
	seen := map[string]CanonicalRules{base: specRules}
	for _, other := range []CanonicalRules{
		{},
		{Payload: PayloadRaw},
		{Volatile: specRules.Volatile},
		{Volatile: append(slices.Clone(specRules.Volatile), "/x"), Unordered: specRules.Unordered},
		{Volatile: specRules.Unordered, Unordered: specRules.Volatile},
		{Volatile: []string{"/a", "/b"}},
		{Volatile: []string{"/a"}, Unordered: []string{"/b"}},
		{Volatile: []string{"/a/b"}},
		{Volatile: []string{"/a~1b"}},
		{Volatile: []string{`/a","/b`}},
	} {
		d := digest(other)
		if prev, dup := seen[d]; dup {
			t.Errorf("rules %+v and %+v share digest %s", other, prev, d)
		}
		seen[d] = other
	}
	// Stored fingerprints are only comparable under an unchanged digest, so
	// the digest of a fixed rule set must never change by accident.
	const pinned = "sha256:0a73256841b66cfb4847194787c338afc97f8a2934d26d6a499875a753f6da4d"
	if base != pinned {
		t.Errorf("digest of the spec rules changed: %s, pinned %s", base, pinned)
	}
}

func TestCanonicalRulesCopy(t *testing.T) {
	in := CanonicalRules{Volatile: []string{"/a"}, Unordered: []string{"/b"}}
	c := newCanon(t, in)
	in.Volatile[0] = "/changed"
	r := c.Rules()
	if r.Payload != PayloadJSON || !slices.Equal(r.Volatile, []string{"/a"}) || !slices.Equal(r.Unordered, []string{"/b"}) {
		t.Fatalf("Rules() = %+v", r)
	}
	r.Unordered[0] = "/changed"
	if c.Rules().Unordered[0] != "/b" {
		t.Fatal("Rules() shares its slices with the canonicalizer")
	}
	if got := canonString(t, c, `{"a":1,"changed":2}`); got != `{"changed":2}` {
		t.Fatalf("canonicalizer follows a caller's slice after construction: %s", got)
	}
}

func TestAppendCanonicalAppends(t *testing.T) {
	c := newCanon(t, specRules)
	dst := []byte("prefix:")
	out, err := c.AppendCanonical(dst, []byte(`{"b":1,"a":2,"client_time":3}`))
	if err != nil || string(out) != `prefix:{"a":2,"b":1}` {
		t.Fatalf("AppendCanonical = %q, %v", out, err)
	}
}

// TestCanonicalConcurrent shares one canonicalizer, and the scratch pool,
// between goroutines; run it with -race.
func TestCanonicalConcurrent(t *testing.T) {
	c := newCanon(t, specRules)
	payloads := [][]byte{benchPayload(1 << 10), benchPayload(16 << 10), []byte(`{"tags":[3,2,1]}`), []byte(`{"a":`)}
	want := make([]string, len(payloads))
	for i, p := range payloads {
		want[i], _ = c.Fingerprint(p)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for i := 0; i < 50; i++ {
				k := (g + i) % len(payloads)
				got, _ := c.Fingerprint(payloads[k])
				if got != want[k] {
					t.Errorf("goroutine %d: fingerprint of payload %d changed: %s vs %s", g, k, got, want[k])
					return
				}
			}
		})
	}
	wg.Wait()
}

// raceEnabled reports whether the test binary was built with -race, which
// makes sync.Pool drop items at random and so defeats allocation counts.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

func TestCanonicalAllocations(t *testing.T) {
	c := newCanon(t, specRules)
	for _, size := range []int{1 << 10, 64 << 10} {
		payload := benchPayload(size)
		// With its own scratch, canonicalizing allocates nothing once the
		// buffers have grown, whatever the payload size.
		s := new(canonScratch)
		run := func() {
			out, err := c.appendCanonical(s, s.out[:0], payload)
			if err != nil {
				t.Fatal(err)
			}
			s.out = out
		}
		run()
		if n := testing.AllocsPerRun(20, run); n != 0 {
			t.Errorf("%d-byte payload: %v allocations per canonicalization with warm scratch, want 0", size, n)
		}
		if raceEnabled() {
			continue
		}
		// Fingerprint allocates only its result string.
		if n := testing.AllocsPerRun(50, func() { _, _ = c.Fingerprint(payload) }); n > 1 {
			t.Errorf("%d-byte payload: Fingerprint made %v allocations, want at most 1", size, n)
		}
	}
}

func TestCanonicalBenchPayloadShape(t *testing.T) {
	c := newCanon(t, specRules)
	for _, size := range []int{1 << 10, 64 << 10} {
		p := benchPayload(size)
		if len(p) != size {
			t.Errorf("benchPayload(%d) is %d bytes", size, len(p))
		}
		if !json.Valid(p) {
			t.Fatalf("benchPayload(%d) is not JSON", size)
		}
		out := canonString(t, c, string(p))
		if strings.Contains(out, "client_ts") || strings.Contains(out, "trace_id") || !utf8.ValidString(out) {
			t.Errorf("benchPayload(%d): volatile fields survived canonicalization", size)
		}
	}
}
