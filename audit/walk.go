package audit

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/idemstream/idemstream/internal/jsonpointer"
)

// Value kinds, kept in the two low bits of an entry's hash so that a
// value that changes type is a difference even when the hashes collide.
const (
	kindScalar uint32 = iota
	kindObject
	kindArray
	kindMask uint32 = 3
)

// maxArrayDetail is the longest array whose elements are tracked one by
// one. A longer array is one value (with its order-free hash), so that a
// payload with a list of thousands of items costs a few entries per key,
// not thousands.
const maxArrayDetail = 32

// maxEntries bounds the entries of one summary. Values past it are not
// compared (they count in Report.Truncated).
const maxEntries = 512

// maxPaths bounds the table of distinct locations. Locations past it (a
// payload that uses ids as member names, say) are not compared.
const maxPaths = 1 << 16

// noPath marks a location that did not fit in the table.
const noPath = ^uint32(0)

// pathInfo is one distinct location ever seen, e.g. /items/0/sku.
type pathInfo struct {
	ptr    string // the concrete JSON Pointer
	parent uint32 // noPath for the root
	gen    uint32 // the generalized pointer (indexes as *), an index in paths.gens
	// order marks the entry that holds the element order of a long
	// array. An array has index children only, so its orderToken child
	// cannot be a value of the same payload.
	order bool
}

// orderToken names the order entry of a long array.
const orderToken = "/#order"

// paths interns locations and their generalized pointers, so that a
// summary stores a 4-byte id per value instead of a pointer string.
type paths struct {
	ids    map[string]uint32
	info   []pathInfo
	genIDs map[string]uint32
	gens   []string
	full   bool
}

func newPaths() *paths {
	p := &paths{ids: map[string]uint32{}, genIDs: map[string]uint32{}}
	p.intern("", "", noPath)
	return p
}

// intern returns the id of the concrete pointer ptr whose generalized form
// is gen, adding it when there is room.
func (p *paths) intern(ptr, gen string, parent uint32) uint32 {
	if id, ok := p.ids[ptr]; ok {
		return id
	}
	if len(p.info) >= maxPaths {
		p.full = true
		return noPath
	}
	g, ok := p.genIDs[gen]
	if !ok {
		g = uint32(len(p.gens))
		p.gens = append(p.gens, gen)
		p.genIDs[gen] = g
	}
	id := uint32(len(p.info))
	p.info = append(p.info, pathInfo{ptr: ptr, parent: parent, gen: g})
	p.ids[ptr] = id
	return id
}

// node is one value of the payload being looked at.
type node struct {
	id         uint32
	parent     int32
	start, end int32 // the value's canonical bytes
	hash       uint32
}

func (n node) kind() uint32 { return n.hash & kindMask }

// walker turns the canonical form of a payload into nodes: one per value,
// with the location, the bytes and a hash. A canonical form is valid,
// compact JSON with sorted members and minimal escapes, so a scanner this
// small is enough; anything else is a bug, reported as an error.
type walker struct {
	seed  maphash.Seed
	paths *paths
	data  []byte
	nodes []node
	ptr   []byte // concrete pointer of the value being walked
	gen   []byte // its generalized pointer
	names []byte // scratch for unescaped member names
}

func newWalker(p *paths) *walker {
	return &walker{seed: maphash.MakeSeed(), paths: p}
}

// walk fills w.nodes from canonical JSON. Nodes past maxEntries are
// dropped; truncated says so.
func (w *walker) walk(canonical []byte) (truncated bool, err error) {
	w.data = canonical
	w.nodes = w.nodes[:0]
	w.ptr, w.gen = w.ptr[:0], w.gen[:0]
	end, err := w.value(0, -1, 0, true)
	if err != nil {
		return false, err
	}
	if end != len(canonical) {
		return false, fmt.Errorf("canonical form: trailing bytes at %d", end)
	}
	return len(w.nodes) >= maxEntries, nil
}

// value walks the value at pos, whose location is w.ptr / w.gen with id,
// and returns the position after it. detail is false inside an array too
// long to track element by element.
func (w *walker) value(pos int, parent int32, id uint32, detail bool) (int, error) {
	if pos >= len(w.data) {
		return 0, fmt.Errorf("canonical form: unexpected end")
	}
	self := int32(-1)
	if detail && len(w.nodes) < maxEntries {
		self = int32(len(w.nodes))
		w.nodes = append(w.nodes, node{id: id, parent: parent, start: int32(pos)})
	}
	var end int
	var hash uint32
	var err error
	switch c := w.data[pos]; {
	case c == '{':
		end, err = w.object(pos, self, id, detail && self >= 0)
		hash = w.hashBytes(pos, end)&^kindMask | kindObject
	case c == '[':
		var multiset uint64
		end, multiset, err = w.array(pos, self, id, detail && self >= 0)
		hash = uint32(multiset)&^kindMask | kindArray
	case c == '"':
		end, err = w.skipString(pos)
		hash = w.hashBytes(pos, end)&^kindMask | kindScalar
	default:
		end = pos
		for end < len(w.data) && w.data[end] != ',' && w.data[end] != ']' && w.data[end] != '}' {
			end++
		}
		hash = w.hashBytes(pos, end)&^kindMask | kindScalar
	}
	if err != nil {
		return 0, err
	}
	if self >= 0 {
		w.nodes[self].end, w.nodes[self].hash = int32(end), hash
	}
	return end, nil
}

func (w *walker) hashBytes(start, end int) uint32 {
	h := maphash.Bytes(w.seed, w.data[start:end])
	return uint32(h ^ h>>32)
}

func (w *walker) object(pos int, self int32, id uint32, detail bool) (int, error) {
	pos++ // {
	if pos < len(w.data) && w.data[pos] == '}' {
		return pos + 1, nil
	}
	for {
		nameEnd, err := w.skipString(pos)
		if err != nil {
			return 0, err
		}
		if nameEnd >= len(w.data) || w.data[nameEnd] != ':' {
			return 0, fmt.Errorf("canonical form: no ':' at %d", nameEnd)
		}
		child := noPath
		ptrLen, genLen := len(w.ptr), len(w.gen)
		if detail {
			name, err := w.unquote(pos, nameEnd)
			if err != nil {
				return 0, err
			}
			w.ptr = jsonpointer.AppendToken(append(w.ptr, '/'), name)
			w.gen = jsonpointer.AppendToken(append(w.gen, '/'), name)
			child = w.child(id)
		}
		pos, err = w.value(nameEnd+1, self, child, detail && child != noPath)
		w.ptr, w.gen = w.ptr[:ptrLen], w.gen[:genLen]
		if err != nil {
			return 0, err
		}
		if pos >= len(w.data) {
			return 0, fmt.Errorf("canonical form: unterminated object")
		}
		switch w.data[pos] {
		case ',':
			pos++
		case '}':
			return pos + 1, nil
		default:
			return 0, fmt.Errorf("canonical form: unexpected %q at %d", w.data[pos], pos)
		}
	}
}

// array walks an array and returns, besides its end, a hash of its
// elements that does not depend on their order: equal for two arrays that
// hold the same elements in another order.
func (w *walker) array(pos int, self int32, id uint32, detail bool) (int, uint64, error) {
	start := pos
	pos++ // [
	if pos < len(w.data) && w.data[pos] == ']' {
		return pos + 1, 0x9e3779b97f4a7c15, nil
	}
	// Count first: a long array is not tracked element by element.
	long := false
	if detail {
		if n, err := w.countElements(start); err != nil {
			return 0, 0, err
		} else if n > maxArrayDetail {
			detail, long = false, true
		}
	}
	var multiset uint64
	count := uint64(0)
	for i := 0; ; i++ {
		child := noPath
		ptrLen, genLen := len(w.ptr), len(w.gen)
		if detail {
			w.ptr = strconv.AppendInt(append(w.ptr, '/'), int64(i), 10)
			w.gen = append(w.gen, '/', '*')
			child = w.child(id)
		}
		elemStart := pos
		end, err := w.value(pos, self, child, detail && child != noPath)
		w.ptr, w.gen = w.ptr[:ptrLen], w.gen[:genLen]
		if err != nil {
			return 0, 0, err
		}
		h := maphash.Bytes(w.seed, w.data[elemStart:end])
		// Mixing before the sum keeps [a, a] and [b, c] apart when
		// h(a)+h(a) happens to equal h(b)+h(c) for simple hashes.
		multiset += mix64(h)
		count++
		pos = end
		if pos >= len(w.data) {
			return 0, 0, fmt.Errorf("canonical form: unterminated array")
		}
		switch w.data[pos] {
		case ',':
			pos++
		case ']':
			if long && len(w.nodes) < maxEntries {
				// One more entry carries the order of a long array, so
				// that reordering it is still seen, as a reorder.
				ptrLen, genLen := len(w.ptr), len(w.gen)
				w.ptr = append(w.ptr, orderToken...)
				w.gen = append(w.gen, orderToken...)
				if oid := w.child(id); oid != noPath {
					w.paths.info[oid].order = true
					w.nodes = append(w.nodes, node{id: oid, parent: self, start: int32(start), end: int32(pos + 1),
						hash: w.hashBytes(start, pos+1)&^kindMask | kindScalar})
				}
				w.ptr, w.gen = w.ptr[:ptrLen], w.gen[:genLen]
			}
			return pos + 1, multiset ^ mix64(count), nil
		default:
			return 0, 0, fmt.Errorf("canonical form: unexpected %q at %d", w.data[pos], pos)
		}
	}
}

func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// countElements counts the elements of the array at pos by skipping over
// them, strings included.
func (w *walker) countElements(pos int) (int, error) {
	depth, n := 0, 0
	for i := pos; i < len(w.data); i++ {
		c := w.data[i]
		if depth == 1 && n == 0 && c != ']' {
			n = 1
		}
		switch c {
		case '"':
			end, err := w.skipString(i)
			if err != nil {
				return 0, err
			}
			i = end - 1
		case '[', '{':
			depth++
		case ']', '}':
			depth--
			if depth == 0 {
				return n, nil
			}
		case ',':
			if depth == 1 {
				n++
			}
		}
	}
	return 0, fmt.Errorf("canonical form: unterminated array")
}

func (w *walker) child(parent uint32) uint32 {
	if id, ok := w.paths.ids[string(w.ptr)]; ok {
		return id
	}
	return w.paths.intern(string(w.ptr), string(w.gen), parent)
}

// skipString returns the position after the string that starts at pos.
func (w *walker) skipString(pos int) (int, error) {
	if pos >= len(w.data) || w.data[pos] != '"' {
		return 0, fmt.Errorf("canonical form: no string at %d", pos)
	}
	for i := pos + 1; i < len(w.data); i++ {
		switch w.data[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		}
	}
	return 0, fmt.Errorf("canonical form: unterminated string")
}

// unquote returns the member name of the string at data[start:end],
// unescaped. Names without escapes are returned in place.
func (w *walker) unquote(start, end int) ([]byte, error) {
	raw := w.data[start+1 : end-1]
	if !slices.Contains(raw, '\\') {
		return raw, nil
	}
	s, err := strconv.Unquote(string(w.data[start:end]))
	if err != nil || !utf8.ValidString(s) {
		return nil, fmt.Errorf("canonical form: member name %s: %v", w.data[start:end], err)
	}
	w.names = append(w.names[:0], s...)
	return w.names, nil
}

// summary is what the audit keeps of a payload: one entry per value,
// location id in the high half and hash in the low half, sorted.
type summary []uint64

func entry(id, hash uint32) uint64 { return uint64(id)<<32 | uint64(hash) }

// summarize packs the nodes of the last walk into a sorted summary,
// reusing dst.
func (w *walker) summarize(dst summary) summary {
	dst = dst[:0]
	for _, n := range w.nodes {
		if n.id != noPath {
			dst = append(dst, entry(n.id, n.hash))
		}
	}
	slices.Sort(dst)
	return dst
}

// find returns the hash stored for location id.
func (s summary) find(id uint32) (uint32, bool) {
	i, ok := slices.BinarySearchFunc(s, id, func(e uint64, id uint32) int {
		return cmpUint32(uint32(e>>32), id)
	})
	if !ok {
		return 0, false
	}
	return uint32(s[i]), true
}

func cmpUint32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
