package dedupe

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// ErrMalformedPayload is wrapped by every error that rejects a payload as not
// canonicalizable JSON.
var ErrMalformedPayload = errors.New("malformed payload")

// PayloadFormat says how a payload is read before it is fingerprinted.
type PayloadFormat string

const (
	// PayloadJSON payloads are parsed and reduced to their canonical form.
	PayloadJSON PayloadFormat = "json"
	// PayloadRaw payloads are fingerprinted byte for byte.
	PayloadRaw PayloadFormat = "raw"
)

// CanonicalScheme names the canonicalization algorithm. It is part of every
// rules digest so that a change to the algorithm can never let fingerprints
// computed under the old one be compared with new ones.
const CanonicalScheme = "jcs-v1"

// MaxNestingDepth is the deepest nesting of objects and arrays a JSON payload
// may have. It bounds recursion in the canonicalizer and the size of the path
// state it tracks.
const MaxNestingDepth = 64

// CanonicalRules say what makes two payloads "the same request".
type CanonicalRules struct {
	Payload   PayloadFormat // "" means json
	Volatile  []string      // JSON Pointers, `*` wildcard segments
	Unordered []string
}

// Canonicalizer turns payloads into their canonical form and fingerprint
// under one set of rules. It is immutable after construction and safe for
// concurrent use.
type Canonicalizer struct {
	rules  CanonicalRules
	raw    bool
	match  *pathMatcher // nil when no path rule is configured
	digest string
}

// NewCanonicalizer validates the rules and compiles their pointers.
func NewCanonicalizer(r CanonicalRules) (*Canonicalizer, error) {
	c := &Canonicalizer{rules: CanonicalRules{
		Payload:   r.Payload,
		Volatile:  slices.Clone(r.Volatile),
		Unordered: slices.Clone(r.Unordered),
	}}
	switch r.Payload {
	case "", PayloadJSON:
		c.rules.Payload = PayloadJSON
	case PayloadRaw:
		c.raw = true
		// A raw payload has no structure to remove paths from; accepting
		// them would let an operator believe a field is ignored while
		// every retry still gets a new fingerprint.
		if len(r.Volatile) > 0 || len(r.Unordered) > 0 {
			return nil, fmt.Errorf("payload %q cannot have volatile or unordered paths", r.Payload)
		}
	default:
		return nil, fmt.Errorf("unknown payload format %q (want %q or %q)", r.Payload, PayloadJSON, PayloadRaw)
	}

	var vol, unord []Pointer
	for i, s := range r.Volatile {
		p, err := ParsePointer(s)
		if err != nil {
			return nil, fmt.Errorf("volatile[%d]: %w", i, err)
		}
		vol = append(vol, p)
	}
	for i, s := range r.Unordered {
		p, err := ParsePointer(s)
		if err != nil {
			return nil, fmt.Errorf("unordered[%d]: %w", i, err)
		}
		unord = append(unord, p)
	}
	if len(vol)+len(unord) > 0 {
		c.match = newPathMatcher(vol, unord)
	}
	c.digest = rulesDigest(c.rules.Payload, r.Volatile, r.Unordered)
	return c, nil
}

// Rules returns a copy of the rules the canonicalizer was built from, with
// an empty payload format spelled out as PayloadJSON.
func (c *Canonicalizer) Rules() CanonicalRules {
	return CanonicalRules{
		Payload:   c.rules.Payload,
		Volatile:  slices.Clone(c.rules.Volatile),
		Unordered: slices.Clone(c.rules.Unordered),
	}
}

// RulesDigest identifies the rules as "sha256:<hex>". Two canonicalizers
// whose rules list the same paths, in any order and with any repetition,
// share a digest; fingerprints are comparable only under equal digests.
func (c *Canonicalizer) RulesDigest() string { return c.digest }

// rulesDigest hashes a canonical JSON document describing the rules, so the
// encoding is unambiguous whatever bytes a pointer holds.
func rulesDigest(format PayloadFormat, volatile, unordered []string) string {
	norm := func(ps []string) []string {
		ps = slices.Clone(ps)
		slices.Sort(ps)
		return slices.Compact(ps)
	}
	list := func(b []byte, ps []string) []byte {
		b = append(b, '[')
		for i, p := range ps {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendQuotedUTF8(b, []byte(p))
		}
		return append(b, ']')
	}
	b := []byte(`{"payload":`)
	b = appendQuotedUTF8(b, []byte(format))
	b = append(b, `,"scheme":`...)
	b = appendQuotedUTF8(b, []byte(CanonicalScheme))
	b = append(b, `,"unordered":`...)
	b = list(b, norm(unordered))
	b = append(b, `,"volatile":`...)
	b = list(b, norm(volatile))
	b = append(b, '}')
	return formatSHA256(sha256.Sum256(b))
}

// AppendCanonical appends the canonical form of payload to dst and returns
// the extended buffer; on error it returns dst as it was. A raw payload is
// appended unchanged. Apart from growing dst it allocates nothing once the
// package's pooled scratch has warmed up.
func (c *Canonicalizer) AppendCanonical(dst, payload []byte) ([]byte, error) {
	if c.raw {
		return append(dst, payload...), nil
	}
	s := getScratch()
	defer putScratch(s)
	return c.appendCanonical(s, dst, payload)
}

// Fingerprint returns "sha256:<64 lowercase hex>" over the canonical form of
// payload.
func (c *Canonicalizer) Fingerprint(payload []byte) (string, error) {
	if c.raw {
		return formatSHA256(sha256.Sum256(payload)), nil
	}
	s := getScratch()
	defer putScratch(s)
	out, err := c.appendCanonical(s, s.out[:0], payload)
	s.out = out
	if err != nil {
		return "", err
	}
	return formatSHA256(sha256.Sum256(out)), nil
}

func (c *Canonicalizer) appendCanonical(s *canonScratch, dst, payload []byte) ([]byte, error) {
	if err := s.parse(payload); err != nil {
		return dst, err
	}
	e := canonEmitter{s: s, m: c.match}
	s.states = s.states[:0]
	if c.match != nil {
		s.states = append(s.states, 0)
	}
	return e.emit(dst, 0, 0, int32(len(s.states)), false), nil
}

func formatSHA256(sum [sha256.Size]byte) string {
	const prefix = "sha256:"
	var buf [len(prefix) + 2*sha256.Size]byte
	copy(buf[:], prefix)
	hex.Encode(buf[len(prefix):], sum[:])
	return string(buf[:])
}

// canonScratch holds everything one canonicalization needs besides its output.
// It is pooled so that a steady stream of payloads of similar size reaches a
// state where canonicalizing allocates nothing.
type canonScratch struct {
	jsonParser
	states []int32    // active path-matcher states, one run per open level
	spans  []elemSpan // element spans of unordered arrays being emitted
	tmp    []byte     // copy of an unordered array's elements while they are reordered
	out    []byte     // Fingerprint's canonical output
}

type elemSpan struct{ start, end int }

var scratchPool = sync.Pool{New: func() any { return new(canonScratch) }}

// Buffers above these sizes are dropped rather than pooled, so one huge
// payload does not pin its memory for the life of the process.
const (
	maxPooledBytes = 1 << 20
	maxPooledNodes = 1 << 16
)

func getScratch() *canonScratch { return scratchPool.Get().(*canonScratch) }

func putScratch(s *canonScratch) {
	s.data = nil
	if cap(s.out) > maxPooledBytes {
		s.out = nil
	}
	if cap(s.tmp) > maxPooledBytes {
		s.tmp = nil
	}
	if cap(s.names) > maxPooledBytes {
		s.names = nil
	}
	if cap(s.num) > maxPooledBytes {
		s.num = nil
	}
	if cap(s.nodes) > maxPooledNodes {
		s.nodes = nil
	}
	if cap(s.order) > maxPooledNodes {
		s.order = nil
	}
	if cap(s.keys) > maxPooledNodes {
		s.keys = nil
	}
	clear(s.keys[:cap(s.keys)]) // drop references into the payload
	if cap(s.spans) > maxPooledNodes {
		s.spans = nil
	}
	scratchPool.Put(s)
}

// canonEmitter writes the canonical form of a parsed payload.
type canonEmitter struct {
	s *canonScratch
	m *pathMatcher
}

// emit appends the canonical form of node i. The path-matcher states that
// the node's path reached are s.states[lo:hi]; unordered says whether one of
// them marks the node unordered.
func (e *canonEmitter) emit(dst []byte, i, lo, hi int32, unordered bool) []byte {
	s := e.s
	n := &s.nodes[i]
	switch n.kind {
	case vNull:
		return append(dst, "null"...)
	case vTrue:
		return append(dst, "true"...)
	case vFalse:
		return append(dst, "false"...)
	case vNumber:
		lit := s.data[n.start:n.end]
		if n.flags&flagPlainNumber != 0 {
			if len(lit) == 2 && lit[0] == '-' && lit[1] == '0' {
				return append(dst, '0')
			}
			return append(dst, lit...)
		}
		var out []byte
		out, s.num = appendNumber(dst, lit, s.num)
		return out
	case vString:
		if n.flags&flagEscaped == 0 {
			return append(dst, s.data[n.start:n.end]...)
		}
		return appendEscapedString(dst, s.data[n.start+1:n.end-1])
	case vObject:
		return e.emitObject(dst, n, lo, hi)
	default:
		return e.emitArray(dst, i, n, lo, hi, unordered)
	}
}

func (e *canonEmitter) emitObject(dst []byte, n *valueNode, lo, hi int32) []byte {
	s := e.s
	dst = append(dst, '{')
	members := s.order[n.order : n.order+n.count]
	first := true
	for _, m := range members {
		childLo := int32(len(s.states))
		var fl matchFlags
		if lo < hi {
			fl = e.m.stepName(&s.states, lo, hi, s.key(m))
			if fl&matchVolatile != 0 {
				s.states = s.states[:childLo]
				continue
			}
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		mn := &s.nodes[m]
		if mn.flags&flagKeyDecoded != 0 {
			dst = appendQuotedUTF8(dst, s.names[mn.keyStart:mn.keyEnd])
		} else {
			dst = append(dst, s.data[mn.keyStart-1:mn.keyEnd+1]...)
		}
		dst = append(dst, ':')
		dst = e.emit(dst, m, childLo, int32(len(s.states)), fl&matchUnordered != 0)
		s.states = s.states[:childLo]
	}
	return append(dst, '}')
}

func (e *canonEmitter) emitArray(dst []byte, i int32, n *valueNode, lo, hi int32, unordered bool) []byte {
	s := e.s
	dst = append(dst, '[')
	base := len(dst)
	spanLo := len(s.spans)
	written := 0
	child := i + 1
	for k := int32(0); k < n.count; k, child = k+1, s.nodes[child].next {
		childLo := int32(len(s.states))
		var fl matchFlags
		if lo < hi {
			fl = e.m.stepIndex(&s.states, lo, hi, int(k))
			if fl&matchVolatile != 0 {
				s.states = s.states[:childLo]
				continue
			}
		}
		if written > 0 {
			dst = append(dst, ',')
		}
		written++
		start := len(dst)
		dst = e.emit(dst, child, childLo, int32(len(s.states)), fl&matchUnordered != 0)
		s.states = s.states[:childLo]
		if unordered {
			s.spans = append(s.spans, elemSpan{start, len(dst)})
		}
	}
	if unordered && written > 1 {
		dst = e.reorder(dst, base, spanLo)
	}
	s.spans = s.spans[:spanLo]
	return append(dst, ']')
}

// reorder rewrites the elements written since base, whose spans are
// s.spans[spanLo:], in bytewise order of their canonical encodings. Sorting
// the already canonical bytes makes the order independent of how the
// elements were spelled and of the members removed from inside them.
func (e *canonEmitter) reorder(dst []byte, base, spanLo int) []byte {
	s := e.s
	spans := s.spans[spanLo:]
	slices.SortFunc(spans, func(a, b elemSpan) int {
		return bytes.Compare(dst[a.start:a.end], dst[b.start:b.end])
	})
	s.tmp = append(s.tmp[:0], dst[base:]...)
	dst = dst[:base]
	for j, sp := range spans {
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, s.tmp[sp.start-base:sp.end-base]...)
	}
	return dst
}
