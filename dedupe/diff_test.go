package dedupe

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	c := newCanon(t, specRules)
	for _, tc := range []struct {
		name string
		a, b string
		want []string
	}{
		{"equal", `{"a":1}`, `{"a":1}`, nil},
		{"canonically equal", `{"amount":50,"b":[1,2]}`, ` { "b" : [1, 2.0], "amount" : 5e1 } `, nil},
		{"volatile only", `{"a":1,"client_time":1,"trace_id":"x"}`, `{"a":1,"client_time":2}`, nil},
		{"unordered only", `{"tags":["a","b"]}`, `{"tags":["b","a"]}`, nil},
		{"amount", `{"coupon":"X","amount":50}`, `{"amount":60,"coupon":"X"}`, []string{"/amount"}},
		{"member on one side", `{"a":1,"b":2}`, `{"a":1,"c":3}`, []string{"/b", "/c"}},
		{"null versus missing", `{"a":null}`, `{}`, []string{"/a"}},
		{"nested", `{"user":{"id":1,"name":"a"}}`, `{"user":{"id":1,"name":"b"}}`, []string{"/user/name"}},
		{"type change", `{"user":{"id":1}}`, `{"user":[1]}`, []string{"/user"}},
		{"number versus string", `{"n":1}`, `{"n":"1"}`, []string{"/n"}},
		{"true versus false", `{"ok":true}`, `{"ok":false}`, []string{"/ok"}},
		{"element", `{"lines":[1,2,3]}`, `{"lines":[1,5,3]}`, []string{"/lines/1"}},
		{"longer array", `{"lines":[1,2]}`, `{"lines":[1,2,3,4]}`, []string{"/lines/2", "/lines/3"}},
		{"shorter array", `{"lines":[1,9,3]}`, `{"lines":[1]}`, []string{"/lines/1", "/lines/2"}},
		{"item field", `{"items":[{"sku":"a","qty":1},{"sku":"b","qty":1}]}`, `{"items":[{"sku":"a","qty":1},{"sku":"b","qty":2,"client_ts":5}]}`, []string{"/items/1/qty"}},
		{"escaped names", `{"a/b":1,"c~d":{"e":1}}`, `{"a/b":2,"c~d":{"e":2}}`, []string{"/a~1b", "/c~0d/e"}},
		{"top-level scalar", `1`, `2`, []string{""}},
		{"top-level kinds", `{}`, `[]`, []string{""}},
		{"sorted bytewise", `{"z":1,"a":[0,0,0,0,0,0,0,0,0,0,0,0]}`, `{"z":2,"a":[0,0,1,0,0,0,0,0,0,0,0,0,0]}`, []string{"/a/12", "/a/2", "/z"}},
		{"pointers sort bytewise", "{\"\uffff\":1,\"😀\":1}", "{\"\uffff\":2,\"😀\":2}", []string{"/\uffff", "/😀"}},
		{"big numbers", `{"n":12345678901234567891}`, `{"n":12345678901234567000}`, []string{"/n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Diff([]byte(tc.a), []byte(tc.b))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || (tc.want == nil) != (got == nil) {
				t.Errorf("Diff = %q, want %q", got, tc.want)
			}
			rev, err := c.Diff([]byte(tc.b), []byte(tc.a))
			if err != nil || !slices.Equal(rev, got) {
				t.Errorf("Diff is not symmetric: %q then %q (%v)", got, rev, err)
			}
			fa, _ := c.Fingerprint([]byte(tc.a))
			fb, _ := c.Fingerprint([]byte(tc.b))
			if (fa == fb) != (got == nil) {
				t.Errorf("Diff = %q but fingerprints equal = %v", got, fa == fb)
			}
		})
	}
}

func TestDiffRaw(t *testing.T) {
	c := newCanon(t, CanonicalRules{Payload: PayloadRaw})
	if got, err := c.Diff([]byte(`{"a":1}`), []byte(`{"a":1}`)); err != nil || got != nil {
		t.Errorf("equal raw payloads: %q, %v", got, err)
	}
	if got, err := c.Diff([]byte(`{"a":1}`), []byte(`{"a": 1}`)); err != nil || !slices.Equal(got, []string{""}) {
		t.Errorf("raw payloads differing in whitespace: %q, %v, want [\"\"]", got, err)
	}
}

func TestDiffMalformed(t *testing.T) {
	c := newCanon(t, specRules)
	_, err := c.Diff([]byte(`{"a":1}`), []byte(`{"a":1,"a":2}`))
	if !errors.Is(err, ErrMalformedPayload) || !strings.HasPrefix(err.Error(), "second payload: malformed payload: duplicate member name") {
		t.Errorf("err = %v", err)
	}
	_, err = c.Diff([]byte(`[`), []byte(`{}`))
	if !errors.Is(err, ErrMalformedPayload) || !strings.HasPrefix(err.Error(), "first payload: ") {
		t.Errorf("err = %v", err)
	}
}
