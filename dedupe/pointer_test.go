package dedupe

import (
	"slices"
	"testing"

	"github.com/idemstream/idemstream/internal/jsonpointer"
)

func TestParsePointer(t *testing.T) {
	for _, tc := range []struct {
		in     string
		tokens []string
	}{
		{"/a", []string{"a"}},
		{"/", []string{""}},
		{"//", []string{"", ""}},
		{"/a/", []string{"a", ""}},
		{"/a~1b", []string{"a/b"}},
		{"/~0", []string{"~"}},
		{"/~01", []string{"~1"}},
		{"/~10", []string{"/0"}},
		{"/~0~1~0", []string{"~/~"}},
		{"/*", []string{"*"}},
		{"/items/*/client_ts", []string{"items", "*", "client_ts"}},
		{"/0/-/é 😀", []string{"0", "-", "é 😀"}},
	} {
		p, err := ParsePointer(tc.in)
		if err != nil {
			t.Errorf("ParsePointer(%q): %v", tc.in, err)
			continue
		}
		if got := p.Tokens(); !slices.Equal(got, tc.tokens) {
			t.Errorf("ParsePointer(%q).Tokens() = %q, want %q", tc.in, got, tc.tokens)
		}
		if p.String() != tc.in {
			t.Errorf("ParsePointer(%q).String() = %q", tc.in, p.String())
		}
	}
}

func TestParsePointerErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `"": the empty pointer selects the whole document`},
		{"a", `"a": must start with "/"`},
		{"#/a", `"#/a": must start with "/"`},
		{"/a/~2", `"/a/~2": invalid escape ~2`},
		{"/~", `"/~": invalid escape ~ at end of token`},
		{"/a~/b", `"/a~/b": invalid escape ~ at end of token`},
		{"/~é", `"/~é": invalid escape ~é`},
		{"/\xff", `"/\xff": invalid utf-8`},
	} {
		_, err := ParsePointer(tc.in)
		if err == nil || err.Error() != tc.want {
			t.Errorf("ParsePointer(%q) err = %v, want %s", tc.in, err, tc.want)
		}
	}
}

func TestPointerMatch(t *testing.T) {
	p, err := ParsePointer("/items/*/client_ts")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path []string
		want bool
	}{
		{[]string{"items", "3", "client_ts"}, true},
		{[]string{"items", "sku", "client_ts"}, true},
		{[]string{"items", "client_ts"}, false},
		{[]string{"items", "3", "client_ts", "x"}, false},
		{[]string{"lines", "3", "client_ts"}, false},
		{[]string{"items", "3", "client_tz"}, false},
		{nil, false},
	} {
		if got := p.Match(tc.path); got != tc.want {
			t.Errorf("Match(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
	tokens := p.Tokens()
	tokens[0] = "changed"
	if p.Tokens()[0] != "items" {
		t.Error("Tokens() shares its slice with the pointer")
	}
}

func TestPointerTokenEscaping(t *testing.T) {
	for _, tok := range []string{"", "a", "~", "/", "~0", "~1", "a/b~c", "//~~", "é"} {
		raw := string(jsonpointer.AppendToken([]byte("/"), []byte(tok)))
		p, err := ParsePointer(raw)
		if err != nil {
			t.Errorf("escaped %q as %q: %v", tok, raw, err)
			continue
		}
		if got := p.Tokens(); len(got) != 1 || got[0] != tok {
			t.Errorf("escaped %q as %q, which parses to %q", tok, raw, got)
		}
	}
}

func TestPointerIsArrayIndex(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0", 0, true},
		{"7", 7, true},
		{"123", 123, true},
		{"01", 0, false},
		{"00", 0, false},
		{"-1", 0, false},
		{"-", 0, false},
		{"1a", 0, false},
		{"", 0, false},
		{"*", 0, false},
		{"99999999999999999999999", 0, false},
	} {
		got, ok := isArrayIndex(tc.in)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("isArrayIndex(%q) = %d, %v", tc.in, got, ok)
		}
	}
}

func TestNewCanonicalizerErrors(t *testing.T) {
	for _, tc := range []struct {
		rules CanonicalRules
		want  string
	}{
		{CanonicalRules{Volatile: []string{"/ok", "/a/~2"}}, `volatile[1]: "/a/~2": invalid escape ~2`},
		{CanonicalRules{Volatile: []string{""}}, `volatile[0]: "": the empty pointer selects the whole document`},
		{CanonicalRules{Unordered: []string{"items"}}, `unordered[0]: "items": must start with "/"`},
		{CanonicalRules{Payload: "xml"}, `unknown payload format "xml" (want json, raw, avro, protobuf or json_schema)`},
		{CanonicalRules{Payload: PayloadAvro}, `payload "avro" needs a schema (schema_registry or schema_file)`},
		{CanonicalRules{Payload: PayloadRaw, Volatile: []string{"/a"}}, `payload "raw" cannot have volatile or unordered paths`},
		{CanonicalRules{Payload: PayloadRaw, Unordered: []string{"/a"}}, `payload "raw" cannot have volatile or unordered paths`},
	} {
		_, err := NewCanonicalizer(tc.rules)
		if err == nil || err.Error() != tc.want {
			t.Errorf("NewCanonicalizer(%+v) err = %v, want %s", tc.rules, err, tc.want)
		}
	}
}
