package load

import (
	"bytes"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
)

// The workload is what the run claims: every retry is a replay under the
// pipeline's rules but has other bytes, keys are UUIDs, records are about
// 1 KB, and a bounded run holds every retry it promised.
func TestWorkloadShape(t *testing.T) {
	c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{Volatile: volatilePaths, Unordered: unorderedPaths})
	if err != nil {
		t.Fatal(err)
	}
	format, err := dedupe.ParseKeyFormat("uuid")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8000
	w := newWorkload(1, "shape")
	firsts := map[string][]byte{}
	retries, bytesTotal := 0, 0
	for i := range n {
		m := w.next(n - 1 - i)
		bytesTotal += len(m.Value)
		key := string(m.Key)
		if _, err := format.Normalize(key); err != nil {
			t.Fatalf("record %d: key %q is not a UUID: %v", i, key, err)
		}
		fp, err := c.Fingerprint(m.Value)
		if err != nil {
			t.Fatalf("record %d: %v\n%s", i, err, m.Value)
		}
		switch header(m.Headers, copyHeader) {
		case "1":
			if _, dup := firsts[key]; dup {
				t.Fatalf("record %d: key %s started twice", i, key)
			}
			firsts[key] = m.Value
		case "2":
			first, ok := firsts[key]
			if !ok {
				t.Fatalf("record %d: retry of %s before its first copy", i, key)
			}
			if bytes.Equal(first, m.Value) {
				t.Fatalf("record %d: retry has the same bytes as its first copy", i)
			}
			if want, _ := c.Fingerprint(first); fp != want {
				t.Fatalf("record %d: retry fingerprint %s, first copy %s\n%s\n%s", i, fp, want, first, m.Value)
			}
			retries++
		default:
			t.Fatalf("record %d: no %s header", i, copyHeader)
		}
	}
	if w.keys != len(firsts) || w.retries != retries || len(w.pending) != 0 {
		t.Fatalf("workload counts %d keys %d retries (%d pending), records %d keys %d retries", w.keys, w.retries, len(w.pending), len(firsts), retries)
	}
	if share := float64(retries) / float64(len(firsts)); share < 0.27 || share > 0.33 {
		t.Errorf("%.3f of the keys retried, want about %.2f", share, retryShare)
	}
	if avg := bytesTotal / n; avg < 950 || avg > 1150 {
		t.Errorf("average record %d bytes, want about 1 KB", avg)
	}
}
