package partition_test

import (
	"testing"

	"github.com/idemstream/idemstream/internal/partition"
)

func TestForIsStableAndSpreads(t *testing.T) {
	seen := map[int]bool{}
	for i := range 200 {
		k := []byte{byte(i), 'k'}
		p := partition.For(k, 6)
		if p < 0 || p >= 6 || p != partition.For(k, 6) {
			t.Fatalf("For(%q, 6) = %d", k, p)
		}
		seen[p] = true
	}
	if len(seen) != 6 {
		t.Errorf("200 keys reached %d of 6 partitions", len(seen))
	}
}
