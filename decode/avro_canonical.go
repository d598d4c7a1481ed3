package decode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/idemstream/idemstream/dedupe"
)

// Writing the canonical form directly.
//
// Fingerprinting an Avro record used to write it as JSON text and hand
// that to the JSON canonicalizer, which spent three times as long reading
// the text back as the decoder spent writing it. canonReader writes the
// canonical form (RFC 8785 under the canonicalizer's volatile and
// unordered paths) in the same walk over the record's bytes:
//   - a record's members are written as AppendJSON writes them, and put in
//     the order compiled from the reader's field names when it ends; a
//     map's by its keys, an unordered array's by their bytes;
//   - numbers and strings are written canonically as they are decoded;
//   - the path rules are matched as the canonicalizer matches them, and a
//     volatile member or element is decoded (so that it fails where it
//     would) and cut off again.
//
// The result must be the canonicalizer's, byte for byte: fingerprints are
// stored. FuzzAvroCanonicalSame checks it against canonicalizing
// AppendJSON's text. Whatever this walk does not reproduce exactly, it
// declines, and the record goes the old way: every error (the old way
// then finds the same error and reports it), a record with a member named
// twice, and a default that a path rule reaches into.
//
// AppendJSON's output limit is part of what decides whether a record
// decodes at all, so canonReader counts the JSON text's length as it goes
// (adj: how much longer the text would be than what it wrote), and checks
// the limit where appendAvroJSON does.

// errDecline is canonReader's error for a record it leaves to AppendJSON.
var errDecline = errors.New("left to the JSON text")

// canonEntry is one member of a record in canonical order: writer field
// field, or default def.
type canonEntry struct{ field, def int32 }

// planCanonical orders the record's members, those read and the defaults,
// by name. Avro names are ASCII, where UTF-16 order is byte order, but
// CompareNames makes that no assumption of this code's.
func (p *avroProg) planCanonical() error {
	p.canon, p.canonDefs = nil, nil
	name := func(e canonEntry) []byte {
		if e.field >= 0 {
			return p.fields[e.field].raw
		}
		return p.canonDefs[e.def].name
	}
	for i := range p.fields {
		f := &p.fields[i]
		if f.prog != nil {
			f.raw = f.name[1 : len(f.name)-2]
			p.canon = append(p.canon, canonEntry{field: int32(i), def: -1})
		}
	}
	for d, text := range p.defaults {
		n := text[1 : 1+bytes.IndexByte(text[1:], '"')]
		value := text[len(n)+3:]
		canon, err := canonicalJSON(value)
		if err != nil {
			return err
		}
		p.canon = append(p.canon, canonEntry{field: -1, def: int32(d)})
		p.canonDefs = append(p.canonDefs, canonDefault{
			name:      n,
			member:    append(append([]byte(nil), text[:len(n)+3]...), canon...),
			container: canon[0] == '{' || canon[0] == '[',
		})
	}
	slices.SortStableFunc(p.canon, func(a, b canonEntry) int { return dedupe.CompareNames(name(a), name(b)) })
	for i := 1; i < len(p.canon); i++ {
		if bytes.Equal(name(p.canon[i-1]), name(p.canon[i])) {
			p.noCanon = true
		}
	}
	return nil
}

// canonDefault is a default in canonical form: member is `"name":value`.
type canonDefault struct {
	name, member []byte
	container    bool // the value is an object or an array
}

// plainCanonicalizer canonicalizes defaults: JSON text without path rules.
var plainCanonicalizer, _ = dedupe.NewCanonicalizer(dedupe.CanonicalRules{})

func canonicalJSON(text []byte) ([]byte, error) { return plainCanonicalizer.AppendCanonical(nil, text) }

// canonReader is an avroReader that writes the canonical form.
type canonReader struct {
	avroReader
	rules  *dedupe.PathRules
	states []int32 // the path-matcher states of the open containers, innermost last
	adj    int     // AppendJSON's text so far is len(out)+adj bytes long
	spans  []canonSpan
	tmp    []byte
}

// canonSpan is a member or element written since its container opened:
// out[start:end], without a separating comma; start is -1 for one cut
// out or skipped. A map entry's key is data[key:keyEnd]. Offsets are
// 32 bits, as in the canonicalizer, to keep the spans small.
type canonSpan struct{ start, end, key, keyEnd int32 }

var canonReaders = sync.Pool{New: func() any { return new(canonReader) }}

// appendAvroCanonical appends the canonical form of data, one value of the
// writer schema prog was compiled from; ok is false when it leaves the
// record to appendAvroJSON and the canonicalizer.
func appendAvroCanonical(dst []byte, prog *avroProg, data []byte, rules *dedupe.PathRules) (out []byte, ok bool) {
	limit := len(dst) + outputLimit(len(data))
	if limit > math.MaxInt32 {
		return dst, false
	}
	// Room for the output, and for appendShort's slack past it.
	dst = slices.Grow(dst, 2*len(data)+64)
	r := canonReaders.Get().(*canonReader)
	r.avroReader = avroReader{data: data, limit: limit}
	r.rules, r.adj = rules, 0
	r.states, r.spans = r.states[:0], r.spans[:0]
	hi := 0
	if rules != nil {
		r.states = rules.Root(r.states)
		hi = 1
	}
	out, err := r.value(dst, prog, 0, hi, false)
	ok = err == nil && r.pos == len(data)
	r.rules, r.data = nil, nil
	if cap(r.tmp) > 1<<20 {
		r.tmp = nil
	}
	if cap(r.spans) > 1<<16 {
		r.spans = nil
	}
	canonReaders.Put(r)
	return out, ok
}

// value is avroReader.value writing canonically. The value's own
// path-matcher states are states[lo:hi]; unordered says the rules sort
// it, if it is an array.
func (r *canonReader) value(dst []byte, p *avroProg, lo, hi int, unordered bool) ([]byte, error) {
	switch p.op {
	case opInt:
		v, err := r.integer(p)
		return appendInt(dst, v), err
	case opDecimalBytes, opDecimalFixed:
		return r.decimal(dst, p)
	case opFloat, opFloatDouble, opDouble:
		return r.float(dst, p)
	case opString, opBytesString:
		b, err := r.bytes()
		if err != nil {
			return dst, err
		}
		dst, extra, err := appendCanonicalString(dst, b)
		r.adj += extra
		return dst, err
	case opRecord:
		return r.record(dst, p, lo, hi)
	case opArray, opMap:
		return r.blocks(dst, p, lo, hi, unordered)
	case opWriterUnion:
		i, err := r.long()
		if err != nil {
			return dst, err
		}
		if i < 0 || i >= int64(len(p.cases)) {
			return dst, malformed("avro union branch %d of %d", i, len(p.cases))
		}
		return r.value(dst, p.cases[i], lo, hi, unordered)
	case opReaderUnion:
		if p.open == nil {
			return r.value(dst, p.elem, lo, hi, unordered)
		}
		return r.tagged(dst, p, lo, hi)
	}
	// The rest (null, booleans, integers, base64, enum symbols, which are
	// Avro names) are written canonically already; none is a container.
	return r.avroReader.value(dst, p)
}

// float writes a float as AppendJSON does, and then in canonical form in
// its place.
func (r *canonReader) float(dst []byte, p *avroProg) ([]byte, error) {
	start := len(dst)
	dst, err := r.avroReader.value(dst, p)
	if err != nil {
		return dst, err
	}
	var buf [32]byte
	lit := append(buf[:0], dst[start:]...)
	dst = dedupe.AppendCanonicalNumber(dst[:start], lit)
	r.adj += len(lit) - (len(dst) - start)
	return dst, nil
}

// decimal writes a decimal in canonical form, from its digits: most
// amounts need no more than their trailing zeros cut.
func (r *canonReader) decimal(dst []byte, p *avroProg) ([]byte, error) {
	var b []byte
	var err error
	if p.op == opDecimalBytes {
		b, err = r.bytes()
	} else {
		b, err = r.next(p.size)
	}
	if err != nil {
		return dst, err
	}
	if p.scale > r.limit-(len(dst)+r.adj) {
		return dst, malformed("avro decimal of scale %d decodes to more than %d bytes", p.scale, r.limit)
	}
	var buf [20]byte
	neg, digits := decimalDigits(buf[:0], b)
	start := len(dst)
	if neg {
		dst = append(dst, '-')
	}
	// AppendJSON's text: the digits, with a point and zeros as the scale
	// asks.
	text := len(dst) - start + len(digits)
	if zeros := p.scale - len(digits); p.scale > 0 && zeros >= 0 {
		text += 2 + zeros
	} else if p.scale > 0 {
		text++
	}
	sig := bytes.TrimRight(digits, "0")
	switch n := len(digits) - p.scale; {
	case len(sig) == 0:
		dst = append(dst[:start], '0')
	case len(sig) <= n && n <= 21:
		dst = append(dst, digits[:n]...)
	case 0 < n && n <= 21:
		dst = append(append(append(dst, sig[:n]...), '.'), sig[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for ; n < 0; n++ {
			dst = append(dst, '0')
		}
		dst = append(dst, sig...)
	default:
		// Exponents: the canonicalizer's own rules on the text
		// AppendJSON writes.
		var lb [48]byte
		lit := appendDecimal(lb[:0], b, p.scale)
		dst = dedupe.AppendCanonicalNumber(dst[:start], lit)
	}
	r.adj += text - (len(dst) - start)
	return dst, nil
}

// step pushes the states that member name leads to from states[lo:hi],
// those of its container (lo < hi), and returns them. A volatile
// member's value needs no states: it is cut.
func (r *canonReader) step(lo, hi int, name []byte) (clo, chi int, st dedupe.PathStep) {
	r.states, st = r.rules.StepName(r.states, lo, hi, name)
	if st == dedupe.PathVolatile {
		r.states = r.states[:hi]
	}
	return hi, len(r.states), st
}

func (r *canonReader) stepIndex(lo, hi, index int) (clo, chi int, st dedupe.PathStep) {
	r.states, st = r.rules.StepIndex(r.states, lo, hi, index)
	if st == dedupe.PathVolatile {
		r.states = r.states[:hi]
	}
	return hi, len(r.states), st
}

// comma separates a member or element from the one before it, if one was
// kept; first says whether AppendJSON's text has one before it, so that a
// comma it has and the output has not is counted.
func (r *canonReader) comma(dst []byte, kept, first bool) []byte {
	if kept {
		return append(dst, ',')
	}
	if !first {
		r.adj++
	}
	return dst
}

// cut removes what was written since at, a volatile member or element,
// counting it as the JSON text still has it.
func (r *canonReader) cut(dst []byte, at int) []byte {
	r.adj += len(dst) - at
	return dst[:at]
}

// tagged writes a value of a tagged union branch: an object of one member.
func (r *canonReader) tagged(dst []byte, p *avroProg, lo, hi int) ([]byte, error) {
	if err := r.enter(); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, p.canonOpen...)
	r.adj += len(p.open) - len(p.canonOpen)
	clo, chi, st := hi, hi, dedupe.PathStep(0)
	if lo < hi {
		clo, chi, st = r.step(lo, hi, p.tag)
	}
	dst, err := r.value(dst, p.elem, clo, chi, st == dedupe.PathUnordered)
	r.states = r.states[:hi]
	if err != nil {
		return dst, err
	}
	if st == dedupe.PathVolatile {
		dst = r.cut(dst, start+1)
	}
	r.depth--
	return append(dst, '}'), nil
}

// record writes the writer's fields as AppendJSON does, in its order, and
// then puts them and the defaults in canonical order.
func (r *canonReader) record(dst []byte, p *avroProg, lo, hi int) ([]byte, error) {
	if p.noCanon {
		return dst, errDecline
	}
	if err := r.enter(); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, '{')
	// The record's spans are reserved here and filled in through spans:
	// the containers inside it add theirs after them, and may move
	// r.spans, but not the array spans points into.
	sp := len(r.spans)
	r.spans = slices.Grow(r.spans, len(p.fields))[:sp+len(p.fields)]
	spans := r.spans[sp:]
	first := true
	for i := range p.fields {
		f := &p.fields[i]
		if f.prog == nil {
			spans[i].start = -1
			if err := r.skip(f.skip); err != nil {
				return dst, err
			}
			continue
		}
		at := len(dst)
		dst = r.comma(dst, at > start+1, first)
		first = false
		m := len(dst)
		clo, chi, st := hi, hi, dedupe.PathStep(0)
		if lo < hi {
			clo, chi, st = r.step(lo, hi, f.raw)
		}
		var err error
		dst, err = r.value(appendShort(dst, f.name, 0, len(f.name)), f.prog, clo, chi, st == dedupe.PathUnordered)
		if err != nil {
			return dst, err
		}
		if lo < hi {
			r.states = r.states[:hi]
			if st == dedupe.PathVolatile {
				dst = r.cut(dst, at)
				m = -1
			}
		}
		spans[i] = canonSpan{start: int32(m), end: int32(len(dst))}
	}
	if r.depth+p.defDepth > dedupe.MaxNestingDepth {
		return dst, malformed("avro value with its defaults nested deeper than %d levels", dedupe.MaxNestingDepth)
	}
	// What AppendJSON writes from here: the defaults and the brace.
	text := len(dst) + r.adj + 1
	for _, d := range p.defaults {
		if !first {
			text++
		}
		first = false
		text += len(d)
	}
	dst, err := r.closeRecord(dst, p, start, spans, lo, hi)
	r.spans = r.spans[:sp]
	if err != nil {
		return dst, err
	}
	r.adj = text - len(dst)
	r.depth--
	return dst, nil
}

// closeRecord rewrites the members written since start+1 in canonical
// order, with the defaults, and closes the record.
func (r *canonReader) closeRecord(dst []byte, p *avroProg, start int, spans []canonSpan, lo, hi int) ([]byte, error) {
	base := start + 1
	r.tmp = append(r.tmp[:0], dst[base:]...)
	tmp := r.tmp
	dst = dst[:base]
	for _, e := range p.canon {
		if e.field >= 0 {
			sp := spans[e.field]
			if sp.start < 0 {
				continue
			}
			if len(dst) > base {
				dst = append(dst, ',')
			}
			dst = appendShort(dst, tmp, int(sp.start)-base, int(sp.end)-base)
			continue
		}
		def := &p.canonDefs[e.def]
		if lo < hi {
			_, chi, st := r.step(lo, hi, def.name)
			r.states = r.states[:hi]
			if st == dedupe.PathVolatile {
				continue
			}
			if (chi > hi || st != 0) && def.container {
				// A rule reaches into the default: the canonicalizer would
				// apply it to the default's text.
				return dst, errDecline
			}
		}
		if len(dst) > base {
			dst = append(dst, ',')
		}
		dst = append(dst, def.member...)
	}
	return append(dst, '}'), nil
}

// blocks is avroReader.blocks writing canonically: a map's entries sorted
// by key, an unordered array's elements by their canonical bytes.
func (r *canonReader) blocks(dst []byte, p *avroProg, lo, hi int, unordered bool) ([]byte, error) {
	if err := r.enter(); err != nil {
		return dst, err
	}
	isMap := p.op == opMap
	open, closing := byte('['), byte(']')
	if isMap {
		open, closing = '{', '}'
	}
	start := len(dst)
	dst = append(dst, open)
	sp := len(r.spans)
	var small [linearKeys][]byte
	keys := small[:0]
	first, index := true, 0
	for {
		n, err := r.blockCount()
		if err != nil {
			return dst, err
		}
		if n == 0 {
			break
		}
		for ; n > 0; n-- {
			if len(dst)+r.adj > r.limit {
				return dst, malformed("avro value decodes to more than %d bytes", r.limit)
			}
			at := len(dst)
			dst = r.comma(dst, at > start+1, first)
			first = false
			if isMap {
				// The keys stay here: passed on, their array would
				// escape to the heap.
				if keys, err = r.mapKey(keys); err != nil {
					return dst, err
				}
				dst, err = r.entry(dst, keys[len(keys)-1], p, lo, hi, at)
			} else {
				dst, err = r.element(dst, p, lo, hi, at, index, unordered)
			}
			if err != nil {
				return dst, err
			}
			index++
		}
	}
	if err := uniqueKeys(keys); err != nil {
		return dst, err
	}
	if spans := r.spans[sp:]; len(spans) > 1 && r.sortSpans(dst, spans, isMap) {
		dst = r.reorder(dst, start+1, spans)
	}
	r.spans = r.spans[:sp]
	r.depth--
	return append(dst, closing), nil
}

// element writes an array's element index, whose comma (if any) starts
// at at.
func (r *canonReader) element(dst []byte, p *avroProg, lo, hi, at, index int, unordered bool) ([]byte, error) {
	m := len(dst)
	clo, chi, st := hi, hi, dedupe.PathStep(0)
	if lo < hi {
		clo, chi, st = r.stepIndex(lo, hi, index)
	}
	dst, err := r.value(dst, p.elem, clo, chi, st == dedupe.PathUnordered)
	r.states = r.states[:hi]
	switch {
	case err != nil:
	case st == dedupe.PathVolatile:
		dst = r.cut(dst, at)
	case unordered:
		r.spans = append(r.spans, canonSpan{start: int32(m), end: int32(len(dst))})
	}
	return dst, err
}

// entry writes a map's entry of the key just read, whose comma (if any)
// starts at at.
func (r *canonReader) entry(dst, key []byte, p *avroProg, lo, hi, at int) ([]byte, error) {
	m := len(dst)
	k := int32(r.pos - len(key)) // the key's offset in data, for sorting
	dst, extra, err := appendCanonicalString(dst, key)
	if err != nil {
		return dst, err
	}
	r.adj += extra
	dst = append(dst, ':')
	clo, chi, st := hi, hi, dedupe.PathStep(0)
	if lo < hi {
		clo, chi, st = r.step(lo, hi, key)
	}
	dst, err = r.value(dst, p.elem, clo, chi, st == dedupe.PathUnordered)
	r.states = r.states[:hi]
	switch {
	case err != nil:
	case st == dedupe.PathVolatile:
		dst = r.cut(dst, at)
	default:
		r.spans = append(r.spans, canonSpan{start: int32(m), end: int32(len(dst)), key: k, keyEnd: k + int32(len(key))})
	}
	return dst, err
}

// sortSpans sorts the entries of a map by key, as RFC 8785 sorts member
// names, and the elements of an array by their bytes. It reports whether
// that moved any: many arrive in order already.
func (r *canonReader) sortSpans(dst []byte, spans []canonSpan, isMap bool) (moved bool) {
	if isMap {
		d := r.data
		slices.SortFunc(spans, func(a, b canonSpan) int {
			return dedupe.CompareNames(d[a.key:a.keyEnd], d[b.key:b.keyEnd])
		})
	} else {
		slices.SortFunc(spans, func(a, b canonSpan) int {
			return bytes.Compare(dst[a.start:a.end], dst[b.start:b.end])
		})
	}
	for i := 1; i < len(spans); i++ {
		if spans[i].start < spans[i-1].start {
			return true
		}
	}
	return false
}

// reorder rewrites the entries written since base in the order of spans.
func (r *canonReader) reorder(dst []byte, base int, spans []canonSpan) []byte {
	r.tmp = append(r.tmp[:0], dst[base:]...)
	dst = dst[:base]
	for i, sp := range spans {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendShort(dst, r.tmp, int(sp.start)-base, int(sp.end)-base)
	}
	return dst
}

// appendShort appends src[a:b] to dst. Most members are a few bytes
// long: when both buffers have sixteen bytes from there (in their
// capacity), it moves them as two words instead of calling memmove. The
// bytes past b land in dst's spare capacity, where the next append
// overwrites them.
func appendShort(dst, src []byte, a, b int) []byte {
	if n := len(dst); b-a <= 16 && uint(a)+16 <= uint(cap(src)) && uint(n)+16 <= uint(cap(dst)) {
		w, r := dst[n:n+16], src[a:a+16]
		binary.LittleEndian.PutUint64(w, binary.LittleEndian.Uint64(r))
		binary.LittleEndian.PutUint64(w[8:], binary.LittleEndian.Uint64(r[8:]))
		return dst[:n+b-a]
	}
	return append(dst, src[a:b]...)
}

// appendCanonicalString is appendJSONString writing RFC 8785's escapes:
// \b, \f, \n, \r and \t where AppendJSON writes \u00XX. extra is how much
// longer AppendJSON's text of s is.
func appendCanonicalString(dst []byte, s []byte) (out []byte, extra int, err error) {
	return appendQuoted(dst, s, true)
}

// appendQuoted is the one string writer of both: with short, the control
// characters JSON can write in two characters are, and extra counts the
// bytes the \u00XX spelling would have taken more.
func appendQuoted(dst []byte, s []byte, short bool) (out []byte, extra int, err error) {
	if plainString(s) {
		dst = append(dst, '"')
		dst = append(dst, s...)
		return append(dst, '"'), 0, nil
	}
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		// Most strings are printable ASCII without quotes: eight bytes a
		// step until one is not.
		for i+8 <= len(s) && !needsAttention(binary.LittleEndian.Uint64(s[i:])) {
			i += 8
		}
		if i == len(s) {
			break
		}
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && n == 1 {
				return dst, 0, fmt.Errorf("%w: string is not valid UTF-8 at byte %d", dedupe.ErrMalformedPayload, i)
			}
			i += n
			continue
		}
		dst = append(dst, s[start:i]...)
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case short && shortEscapes[c] != 0:
			dst = append(dst, '\\', shortEscapes[c])
			extra += 4
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"'), extra, nil
}

// shortEscapes are the letters of the control characters JSON escapes
// with two characters.
var shortEscapes = [0x20]byte{'\b': 'b', '\f': 'f', '\n': 'n', '\r': 'r', '\t': 't'}

// plainString says whether s is printable ASCII without quotes or
// backslashes, as most strings are, eight bytes at a time: a tail
// shorter than eight is tested as the last eight bytes, or padded.
func plainString(s []byte) bool {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		if needsAttention(binary.LittleEndian.Uint64(s[i:])) {
			return false
		}
	}
	switch {
	case i == len(s):
		return true
	case len(s) >= 8:
		return !needsAttention(binary.LittleEndian.Uint64(s[len(s)-8:]))
	}
	b := [8]byte{'a', 'a', 'a', 'a', 'a', 'a', 'a', 'a'}
	copy(b[:], s[i:])
	return !needsAttention(binary.LittleEndian.Uint64(b[:]))
}
