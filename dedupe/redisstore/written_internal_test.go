package redisstore

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
)

// A name is taken once, repeats within one call get the same value, and
// the oldest generation is forgotten once a second one fills.
func TestWrittenTakesEachEntryOnce(t *testing.T) {
	var w written
	var e dedupe.Entry
	w.put("a", []byte("1"), &e)
	w.put("b", []byte("2"), &e)
	w.put("a", []byte("3"), &e)
	vals := make([]any, 4)
	if missing := w.take([]string{"a", "x", "a", "b"}, vals); !slices.Equal(missing, []int{1}) {
		t.Errorf("missing %v, want [1]", missing)
	}
	var raws []string
	for _, v := range vals {
		if entry, ok := v.(*writtenEntry); ok {
			raws = append(raws, entry.raw)
		} else {
			raws = append(raws, "-")
		}
	}
	if !slices.Equal(raws, []string{"3", "-", "3", "2"}) {
		t.Errorf("values %v", raws)
	}
	if missing := w.take([]string{"a", "b"}, make([]any, 2)); len(missing) != 2 {
		t.Errorf("taken twice: missing %v", missing)
	}
	// Three generations begun: the first is forgotten.
	for i := range 2*writtenGeneration + 1 {
		w.put(fmt.Sprint(i), []byte("v"), &e)
	}
	got := make([]any, 3)
	missing := w.take([]string{"0", fmt.Sprint(writtenGeneration), fmt.Sprint(2 * writtenGeneration)}, got)
	if !slices.Equal(missing, []int{0}) {
		t.Errorf("after three generations begun, missing %v; want the first name only", missing)
	}
	if n := len(w.cur) + len(w.prev); n > 2*writtenGeneration {
		t.Errorf("%d entries remembered, bound %d", n, 2*writtenGeneration)
	}
}

// The bytes of a generation are bounded as well as its entries, and an
// entry too long to be worth its memory is not remembered (and what was
// remembered under its name is forgotten).
func TestWrittenIsBoundedInBytes(t *testing.T) {
	var w written
	var e dedupe.Entry
	raw := []byte(strings.Repeat("x", writtenLongest))
	per := (&writtenEntry{raw: string(raw)}).cost("0000")
	for i := range 3 * writtenBytes / per {
		w.put(fmt.Sprintf("%04d", i), raw, &e)
		if w.curBytes > writtenBytes {
			t.Fatalf("after %d entries: %d bytes in a generation, bound %d", i+1, w.curBytes, writtenBytes)
		}
	}
	if n := len(w.cur) + len(w.prev); n > 2*writtenBytes/per {
		t.Errorf("%d entries of %d bytes remembered, bound %d", n, per, 2*writtenBytes/per)
	}
	w.put("long", []byte("short"), &e)
	w.put("long", append(raw, 'x'), &e)
	if missing := w.take([]string{"long"}, make([]any, 1)); len(missing) != 1 {
		t.Error("an entry longer than writtenLongest was remembered")
	}
}
