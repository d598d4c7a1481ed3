package audit_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/audittest"
)

func TestPlantedPatterns(t *testing.T) {
	p := audittest.Plant("claims", 3)
	r, err := audit.Run(context.Background(), audit.Records(p.Records), audit.Options{Policy: audittest.Policy(t)})
	if err != nil {
		t.Fatal(err)
	}
	audittest.Check(t, p, r)
	if r.Passes != 2 || r.Partitions != 3 || r.Topic != "claims" {
		t.Errorf("passes %d, partitions %d, topic %q", r.Passes, r.Partitions, r.Topic)
	}
	if t.Failed() {
		var b strings.Builder
		_ = r.WriteText(&b, nil)
		t.Log(b.String())
	}
}

// A list reordered by the client whose items also carry a timestamp of
// their own: the timestamp is the volatile field, the list unordered, and
// the items' other fields are not reported.
func TestReorderedItemsWithVolatileInside(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	var recs []dedupe.Record
	add := func(key int, at time.Time, body string) {
		recs = append(recs, dedupe.Record{Topic: "t", Offset: int64(len(recs)), Time: at, Value: []byte(body),
			Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(fmt.Sprintf("00000000-0000-4000-8000-%012d", key))}}})
	}
	for k := range 10 {
		at := t0.Add(time.Duration(k) * time.Second)
		add(k, at, fmt.Sprintf(`{"order":%d,"client_time":"%s","items":[{"sku":"A","qty":1,"client_ts":1},{"sku":"B","qty":2,"client_ts":2},{"sku":"C","qty":3,"client_ts":3}]}`, k, at))
		at = at.Add(3 * time.Second)
		qty := 3
		if k == 9 {
			qty = 4 // and a real change, in one key
		}
		add(k, at, fmt.Sprintf(`{"order":%d,"client_time":"%s","items":[{"sku":"C","qty":%d,"client_ts":7},{"sku":"A","qty":1,"client_ts":8},{"sku":"B","qty":2,"client_ts":9}]}`, k, at, qty))
	}
	r, err := audit.Run(context.Background(), audit.Records(recs), audit.Options{Policy: audittest.Policy(t)})
	if err != nil {
		t.Fatal(err)
	}
	got := func(cs []audit.Candidate) string {
		var out []string
		for _, c := range cs {
			out = append(out, fmt.Sprintf("%s:%d", c.Pointer, c.Keys))
		}
		return strings.Join(out, " ")
	}
	if g := got(r.VolatileCandidates); g != "/client_time:10 /items/*/client_ts:10" {
		t.Errorf("volatile candidates %s", g)
	}
	if g := got(r.UnorderedCandidates); g != "/items:10" {
		t.Errorf("unordered candidates %s", g)
	}
	if g := got(r.Conflicts.Pointers); g != "/items/*/qty:1" || r.Conflicts.Keys != 1 {
		t.Errorf("conflicts %d at %s, want 1 at /items/*/qty", r.Conflicts.Keys, g)
	}
	if d := r.Decisions.Idemstream; d != (audit.Counts{First: 10, Replay: 9, Conflict: 1}) {
		t.Errorf("decisions under %v %v: %+v", r.Suggested.Volatile, r.Suggested.Unordered, d)
	}
}
