package dedupe

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// wildcard is the reference token that matches any single array index or
// member name. A member literally named "*" therefore cannot be addressed on
// its own; rules are about shapes of requests, where that trade is cheap.
const wildcard = "*"

// Pointer is a parsed JSON Pointer (RFC 6901) whose reference tokens may be
// the wildcard. The zero Pointer has no tokens and is not produced by
// ParsePointer.
type Pointer struct {
	raw    string
	tokens []string
}

// ParsePointer validates an RFC 6901 pointer in which a token that is exactly
// "*" is a wildcard. The pointer must start with "/", and "~" may appear only
// as "~0" or "~1". The empty pointer, which would select the whole document,
// is rejected: no rule can meaningfully remove or reorder the whole payload.
func ParsePointer(p string) (Pointer, error) {
	if p == "" {
		return Pointer{}, fmt.Errorf(`"": the empty pointer selects the whole document`)
	}
	if p[0] != '/' {
		return Pointer{}, fmt.Errorf(`%q: must start with "/"`, p)
	}
	if !utf8.ValidString(p) {
		return Pointer{}, fmt.Errorf("%q: invalid utf-8", p)
	}
	parts := strings.Split(p[1:], "/")
	tokens := make([]string, len(parts))
	for i, part := range parts {
		if !strings.Contains(part, "~") {
			tokens[i] = part
			continue
		}
		var b strings.Builder
		for j := 0; j < len(part); j++ {
			if part[j] != '~' {
				b.WriteByte(part[j])
				continue
			}
			if j+1 == len(part) {
				return Pointer{}, fmt.Errorf("%q: invalid escape ~ at end of token", p)
			}
			switch part[j+1] {
			case '0':
				b.WriteByte('~')
			case '1':
				b.WriteByte('/')
			default:
				r, _ := utf8.DecodeRuneInString(part[j+1:])
				return Pointer{}, fmt.Errorf("%q: invalid escape ~%c", p, r)
			}
			j++
		}
		tokens[i] = b.String()
	}
	return Pointer{raw: p, tokens: tokens}, nil
}

// String returns the pointer as it was written.
func (p Pointer) String() string { return p.raw }

// Tokens returns the unescaped reference tokens; a wildcard token is "*".
func (p Pointer) Tokens() []string { return slices.Clone(p.tokens) }

// Match reports whether the pointer selects the location whose unescaped
// reference tokens are path. Array indices are given in decimal.
func (p Pointer) Match(path []string) bool {
	if len(path) != len(p.tokens) {
		return false
	}
	for i, t := range p.tokens {
		if t != wildcard && t != path[i] {
			return false
		}
	}
	return true
}

// isArrayIndex reports whether token is an RFC 6901 array index: "0" or a
// decimal number without leading zeros that fits an int.
func isArrayIndex(token string) (int, bool) {
	if token == "" || (len(token) > 1 && token[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(token); i++ {
		if token[i] < '0' || token[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(token)
	return n, err == nil
}

type matchFlags uint8

const (
	matchVolatile matchFlags = 1 << iota
	matchUnordered
)

// pathMatcher is a trie of all rule pointers. Walking a document, the
// canonicalizer keeps the set of trie states its current path reaches; a
// wildcard makes that a set rather than a single state. Most of a document
// reaches no state at all, and then no matching work is done below it.
type pathMatcher struct {
	nodes []matcherNode
}

type matcherNode struct {
	lits    []matcherEdge    // literal tokens while there are few: a scan beats hashing
	names   map[string]int32 // literal tokens otherwise
	indices map[int]int32    // literal tokens that are array indices
	wild    int32            // state after a wildcard token, or -1
	flags   matchFlags
}

type matcherEdge struct {
	token string
	next  int32
}

// maxScannedEdges is how many literal tokens a node keeps in a slice.
const maxScannedEdges = 8

func newPathMatcher(volatile, unordered []Pointer) *pathMatcher {
	m := &pathMatcher{nodes: []matcherNode{{wild: -1}}}
	add := func(p Pointer, f matchFlags) {
		cur := int32(0)
		for _, t := range p.tokens {
			cur = m.child(cur, t)
		}
		m.nodes[cur].flags |= f
	}
	for _, p := range volatile {
		add(p, matchVolatile)
	}
	for _, p := range unordered {
		add(p, matchUnordered)
	}
	for i := range m.nodes {
		n := &m.nodes[i]
		if len(n.names) > 0 && len(n.names) <= maxScannedEdges {
			for tok, next := range n.names {
				n.lits = append(n.lits, matcherEdge{tok, next})
			}
			n.names = nil
		}
	}
	return m
}

func (m *pathMatcher) child(cur int32, token string) int32 {
	if token == wildcard {
		if w := m.nodes[cur].wild; w >= 0 {
			return w
		}
		next := m.newNode()
		m.nodes[cur].wild = next
		return next
	}
	if next, ok := m.nodes[cur].names[token]; ok {
		return next
	}
	next := m.newNode()
	n := &m.nodes[cur]
	if n.names == nil {
		n.names = make(map[string]int32)
	}
	n.names[token] = next
	if idx, ok := isArrayIndex(token); ok {
		if n.indices == nil {
			n.indices = make(map[int]int32)
		}
		n.indices[idx] = next
	}
	return next
}

func (m *pathMatcher) newNode() int32 {
	m.nodes = append(m.nodes, matcherNode{wild: -1})
	return int32(len(m.nodes) - 1)
}
