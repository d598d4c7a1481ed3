package group

import (
	"slices"
	"testing"
)

func TestConsumerProtocolRoundTrips(t *testing.T) {
	for _, v := range []int16{0, 1} {
		s, err := decodeSubscription(encodeSubscription(v, "orders", []int{2, 5}))
		if err != nil || !slices.Equal(s.topics, []string{"orders"}) {
			t.Fatalf("version %d: %+v %v", v, s, err)
		}
		if want := map[int16][]int{0: nil, 1: {2, 5}}[v]; !slices.Equal(s.owned["orders"], want) {
			t.Fatalf("version %d owned %v, want %v", v, s.owned, want)
		}
	}
	a, err := decodeAssignment(encodeAssignment("orders", []int{1, 3}))
	if err != nil || !slices.Equal(a["orders"], []int{1, 3}) {
		t.Fatalf("assignment: %v %v", a, err)
	}
	// Version 3 (Java's: generation and rack after the owned partitions)
	// reads as far as version 1 goes.
	b := encodeSubscription(1, "orders", []int{4})
	b[1] = 3
	b = append(b, 0, 0, 0, 7, 0xff, 0xff)
	if s, err := decodeSubscription(b); err != nil || !slices.Equal(s.owned["orders"], []int{4}) {
		t.Fatalf("version 3: %+v %v", s, err)
	}
}

// The consumer protocol's bytes come from other members: whatever they
// hold is read or refused, never a panic, and a length is never trusted
// past the bytes there are.
func FuzzDecodeConsumerProtocol(f *testing.F) {
	f.Add(encodeSubscription(0, "t", nil))
	f.Add(encodeSubscription(1, "topic", []int{0, 1, 2}))
	f.Add(encodeAssignment("topic", []int{7}))
	f.Add([]byte{0, 1, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if s, err := decodeSubscription(b); err == nil {
			for _, parts := range s.owned {
				if len(parts) > len(b) {
					t.Fatalf("%d partitions from %d bytes", len(parts), len(b))
				}
			}
		}
		if a, err := decodeAssignment(b); err == nil {
			for _, parts := range a {
				if len(parts) > len(b) {
					t.Fatalf("%d partitions from %d bytes", len(parts), len(b))
				}
			}
		}
	})
}
