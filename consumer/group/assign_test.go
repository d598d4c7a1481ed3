package group_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/idemstream/idemstream/consumer/group"
)

func TestRangeSplitsInRuns(t *testing.T) {
	got := group.AssignRange([]group.Subscriber{{MemberID: "b"}, {MemberID: "a"}, {MemberID: "c", InstanceID: "z"}}, 7)
	// Static members sort first, by instance id; then the others by member id.
	want := map[string][]int{"c": {0, 1, 2}, "a": {3, 4}, "b": {5, 6}}
	for id, parts := range want {
		if !slices.Equal(got[id], parts) {
			t.Fatalf("range of 7 over c (static), a, b: %v, want %v", got, want)
		}
	}
}

// Rounds of the cooperative assignor, each member owning what the last
// round gave it, over random groups and random histories (partitions
// claimed by two members among them): no round gives a partition to two
// members, none moves a partition whose owner has not let it go, none
// gives one that two members claim to anybody, and by
// the second round every partition is assigned and the counts differ by
// at most one.
func TestCooperativeStickyConverges(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		partitions := 1 + rng.IntN(24)
		members := make([]group.Subscriber, 1+rng.IntN(6))
		for i := range members {
			members[i].MemberID = fmt.Sprintf("m%d", i)
			if rng.IntN(2) == 0 {
				members[i].InstanceID = fmt.Sprintf("pod-%d", rng.IntN(10)+10*i)
			}
			for p := range partitions {
				if rng.IntN(len(members)+1) == 0 {
					members[i].Owned = append(members[i].Owned, p)
				}
			}
		}
		for round := 1; round <= 2; round++ {
			plan := group.AssignCooperativeSticky(members, partitions)
			owner := map[int]string{}
			for id, parts := range plan {
				for _, p := range parts {
					if prev, ok := owner[p]; ok {
						t.Fatalf("trial %d round %d: partition %d to %s and %s", trial, round, p, prev, id)
					}
					owner[p] = id
				}
			}
			claims := map[int][]string{}
			for _, m := range members {
				for _, p := range m.Owned {
					claims[p] = append(claims[p], m.MemberID)
				}
			}
			for p, to := range owner {
				if c := claims[p]; len(c) == 1 && c[0] != to || len(c) > 1 {
					t.Fatalf("trial %d round %d: partition %d given to %s while %v still own it", trial, round, p, to, c)
				}
			}
			// The members revoke what they were not given, and own the rest.
			for i := range members {
				members[i].Owned = plan[members[i].MemberID]
			}
			if round == 2 {
				counts := []int{}
				for _, m := range members {
					counts = append(counts, len(m.Owned))
				}
				if len(owner) != partitions || slices.Max(counts)-slices.Min(counts) > 1 {
					t.Fatalf("trial %d: after two rounds %d of %d partitions assigned, counts %v", trial, len(owner), partitions, counts)
				}
			}
		}
	}
}

// A member joining a balanced group takes its share from the others, and
// nothing else moves.
func TestCooperativeStickyMovesOnlyTheShare(t *testing.T) {
	members := []group.Subscriber{{MemberID: "a", Owned: []int{0, 1, 2}}, {MemberID: "b", Owned: []int{3, 4, 5}}, {MemberID: "c"}}
	plan := group.AssignCooperativeSticky(members, 6)
	if len(plan["a"]) != 2 || len(plan["b"]) != 2 || len(plan["c"]) != 0 {
		t.Fatalf("first round: %v, want a and b to keep two each and c to wait", plan)
	}
	members[0].Owned, members[1].Owned = plan["a"], plan["b"]
	plan = group.AssignCooperativeSticky(members, 6)
	moved := 0
	for _, p := range plan["c"] {
		if !slices.Contains([]int{0, 1, 2, 3, 4, 5}, p) {
			t.Fatalf("c got %d", p)
		}
		moved++
	}
	if moved != 2 || !slices.Equal(plan["a"], members[0].Owned) || !slices.Equal(plan["b"], members[1].Owned) {
		t.Fatalf("second round: %v; a and b must keep what they kept", plan)
	}
}
