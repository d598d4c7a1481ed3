package dedupe

import "slices"

// canonMatcher is a pathMatcher laid out for the canonicalizer's inner loop.
// The parser has already packed every member name into the integer prefix
// it sorts by, so a literal edge stores its token packed the same way and
// most edges are ruled out by two integer comparisons, without touching the
// name's bytes.
type canonMatcher struct {
	nodes []canonMatchNode
}

type canonMatchNode struct {
	bloom   uint64           // bloomBit of every literal token
	edges   []canonEdge      // literal tokens while there are few
	names   map[string]int32 // literal tokens otherwise
	indices map[int]int32    // literal tokens that are array indices
	wild    int32            // state after a wildcard token, or -1
	flags   matchFlags
}

type canonEdge struct {
	prefix uint64 // namePrefix of the token
	size   int
	token  string
	next   int32
}

// bloomBit picks one of 64 bits for a name by its prefix. A node with few
// literal tokens has few of its bits set, and most names it does not have
// are turned away by one test.
func bloomBit(prefix uint64) uint64 { return 1 << (prefix * 0x9e3779b97f4a7c15 >> 58) }

// maxCanonEdges is how many literal tokens a node scans rather than looks
// up: a scan of this many costs less than hashing the name.
const maxCanonEdges = 32

func compileMatcher(m *pathMatcher) *canonMatcher {
	cm := &canonMatcher{nodes: make([]canonMatchNode, len(m.nodes))}
	for i := range m.nodes {
		n := &m.nodes[i]
		c := canonMatchNode{indices: n.indices, wild: n.wild, flags: n.flags}
		lits := slices.Clone(n.lits)
		if len(n.names) > maxCanonEdges {
			c.names = n.names
		} else {
			for tok, next := range n.names {
				lits = append(lits, matcherEdge{tok, next})
			}
		}
		for tok := range c.names {
			c.bloom |= bloomBit(namePrefix([]byte(tok)))
		}
		for _, e := range lits {
			c.bloom |= bloomBit(namePrefix([]byte(e.token)))
			c.edges = append(c.edges, canonEdge{prefix: namePrefix([]byte(e.token)), size: len(e.token), token: e.token, next: e.next})
		}
		cm.nodes[i] = c
	}
	return cm
}

// literal returns the state reached from n by the member name whose
// namePrefix is prefix.
func (n *canonMatchNode) literal(prefix uint64, name []byte) (int32, bool) {
	if n.bloom&bloomBit(prefix) == 0 {
		return 0, false
	}
	for i := range n.edges {
		e := &n.edges[i]
		if e.prefix == prefix && e.size == len(name) && (len(name) <= 8 || string(name[8:]) == e.token[8:]) {
			return e.next, true
		}
	}
	if n.names != nil {
		next, ok := n.names[string(name)]
		return next, ok
	}
	return 0, false
}

// mayStep reports whether a member name with this prefix can lead
// anywhere from state: most names are ruled out here, without a call.
func (m *canonMatcher) mayStep(state int32, prefix uint64) bool {
	n := &m.nodes[state]
	return n.wild >= 0 || n.bloom&bloomBit(prefix) != 0
}

// stepName appends to states the states reached from states[lo:hi] by the
// member name, and returns them with the union of their flags.
func (m *canonMatcher) stepName(states []int32, lo, hi int32, prefix uint64, name []byte) ([]int32, matchFlags) {
	var fl matchFlags
	for j := lo; j < hi; j++ {
		n := &m.nodes[states[j]]
		if n.wild >= 0 {
			states = append(states, n.wild)
			fl |= m.nodes[n.wild].flags
		}
		if next, ok := n.literal(prefix, name); ok {
			states = append(states, next)
			fl |= m.nodes[next].flags
		}
	}
	return states, fl
}

// stepIndex is stepName for an array element.
func (m *canonMatcher) stepIndex(states []int32, lo, hi int32, index int) ([]int32, matchFlags) {
	var fl matchFlags
	for j := lo; j < hi; j++ {
		n := &m.nodes[states[j]]
		if n.wild >= 0 {
			states = append(states, n.wild)
			fl |= m.nodes[n.wild].flags
		}
		if n.indices != nil {
			if next, ok := n.indices[index]; ok {
				states = append(states, next)
				fl |= m.nodes[next].flags
			}
		}
	}
	return states, fl
}
