package group

import (
	"cmp"
	"slices"
)

// The assignors' names, as the group protocol spells them: members
// advertise the ones they can run, and the broker picks one every member
// has, by the members' votes.
const (
	CooperativeSticky = "cooperative-sticky"
	Range             = "range"
)

// Subscriber is one member of a generation as the leader sees it: its
// identity and the partitions it says it owns (subscription v1).
type Subscriber struct {
	MemberID   string
	InstanceID string
	Owned      []int
}

// sortKey orders members for an assignment: by instance id where there is
// one, so that a static member restarted under a new member id keeps its
// place, as Kafka's own assignors order them.
func (s Subscriber) sortKey() string {
	if s.InstanceID != "" {
		return "0" + s.InstanceID
	}
	return "1" + s.MemberID
}

func sortedMembers(members []Subscriber) []Subscriber {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Subscriber) int { return cmp.Compare(a.sortKey(), b.sortKey()) })
	return ms
}

// AssignRange is the eager range assignor: partitions in contiguous runs,
// the first partitions%members members one more. It ignores what members
// own: under the eager protocol every member gave everything up before it
// joined.
func AssignRange(members []Subscriber, partitions int) map[string][]int {
	out := make(map[string][]int, len(members))
	ms := sortedMembers(members)
	if len(ms) == 0 {
		return out
	}
	per, extra := partitions/len(ms), partitions%len(ms)
	next := 0
	for i, m := range ms {
		n := per
		if i < extra {
			n++
		}
		out[m.MemberID] = make([]int, 0, n)
		for range n {
			out[m.MemberID] = append(out[m.MemberID], next)
			next++
		}
	}
	return out
}

// AssignCooperativeSticky balances the partitions over the members so that
// no two counts differ by more than one, keeping every member's owned
// partitions up to its share, and then holds back each partition that
// would move from a member that still owns it (KIP-429): the owner is not
// given it, so it revokes it and rejoins, and the next assignment, with
// the partition owned by nobody, hands it over. A partition two members
// claim (a member the group had given up on) is treated as owned by
// neither, and is held back from everyone until neither claims it.
func AssignCooperativeSticky(members []Subscriber, partitions int) map[string][]int {
	out := make(map[string][]int, len(members))
	ms := sortedMembers(members)
	if len(ms) == 0 {
		return out
	}
	claims := make([]int, partitions)
	for _, m := range ms {
		for _, p := range m.Owned {
			if p >= 0 && p < partitions {
				claims[p]++
			}
		}
	}
	owner := make([]int, partitions) // index into ms of the current owner, or -1
	for p := range owner {
		owner[p] = -1
	}
	for i, m := range ms {
		for _, p := range m.Owned {
			if p >= 0 && p < partitions && claims[p] == 1 {
				owner[p] = i
			}
		}
	}
	quota := quotas(ms, owner, partitions)
	assigned := make([]int, partitions) // the new owner
	counts := make([]int, len(ms))
	for p := range assigned {
		assigned[p] = -1
		if o := owner[p]; o >= 0 && counts[o] < quota[o] {
			assigned[p] = o
			counts[o]++
		}
	}
	// The rest, each to the member furthest below its share; a partition
	// claimed twice goes to nobody this round, so that every claimant
	// gives it up before anyone gets it.
	for p := range assigned {
		if assigned[p] >= 0 || claims[p] > 1 {
			continue
		}
		best := -1
		for i := range ms {
			if counts[i] < quota[i] && (best < 0 || quota[i]-counts[i] > quota[best]-counts[best]) {
				best = i
			}
		}
		assigned[p] = best
		counts[best]++
	}
	for _, m := range ms {
		out[m.MemberID] = []int{}
	}
	for p, to := range assigned {
		if o := owner[p]; to < 0 || o >= 0 && o != to {
			continue // held back: its owner (or owners) give it up first
		}
		out[ms[to].MemberID] = append(out[ms[to].MemberID], p)
	}
	return out
}

// quotas gives each member floor(partitions/members) partitions, and the
// partitions%members larger shares to the members that own the most, so
// that as little as possible moves.
func quotas(ms []Subscriber, owner []int, partitions int) []int {
	owned := make([]int, len(ms))
	for _, o := range owner {
		if o >= 0 {
			owned[o]++
		}
	}
	order := make([]int, len(ms))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(owned[b], owned[a]) })
	quota := make([]int, len(ms))
	per, extra := partitions/len(ms), partitions%len(ms)
	for rank, i := range order {
		quota[i] = per
		if rank < extra {
			quota[i]++
		}
	}
	return quota
}
