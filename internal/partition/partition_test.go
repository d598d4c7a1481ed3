package partition_test

import (
	"strconv"
	"testing"

	"github.com/segmentio/kafka-go"

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

// The shared list of partition numbers (up to 1,024) and the list made
// for larger topics must place every key where kafka-go's Murmur2Balancer
// places it given a fresh list.
func TestForMatchesTheBalancer(t *testing.T) {
	var b kafka.Murmur2Balancer
	for _, n := range []int{1, 6, 1024, 1025, 3000} {
		parts := make([]int, n)
		for i := range parts {
			parts[i] = i
		}
		for i := range 500 {
			k := []byte("key-" + strconv.Itoa(i))
			if got, want := partition.For(k, n), b.Balance(kafka.Message{Key: k}, parts...); got != want {
				t.Fatalf("For(%q, %d) = %d, the balancer says %d", k, n, got, want)
			}
		}
	}
}
