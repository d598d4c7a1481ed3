package decode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/idemstream/idemstream/dedupe"
)

// avroReader walks one record's Avro binary under a compiled program and
// appends its JSON text. The limit bounds the output, and the items
// skipped, so that a record whose blocks claim billions of zero-size items
// ends in an error, not in a loop without end.
type avroReader struct {
	data    []byte
	pos     int
	limit   int
	depth   int
	skipped int
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", dedupe.ErrMalformedPayload, fmt.Sprintf(format, args...))
}

// appendAvroJSON decodes data, one value of the writer schema prog was
// compiled from, and appends it as JSON.
func appendAvroJSON(dst []byte, prog *avroProg, data []byte) ([]byte, error) {
	r := avroReader{data: data, limit: len(dst) + outputLimit(len(data))}
	out, err := r.value(dst, prog)
	if err != nil {
		return dst, err
	}
	if r.pos != len(data) {
		return dst, malformed("%d bytes after the avro value", len(data)-r.pos)
	}
	return out, nil
}

// outputLimit is the most JSON a value of n bytes may decode to: generous
// for real records (base64 and member names grow a record by a few
// times; a reader's defaults, the fields a writer did not send, grow each
// of its items by as much as the reader names), small enough to stop a
// record of empty items claimed by the billion. It holds for Avro and
// Protobuf alike.
func outputLimit(n int) int { return 64*n + 1<<20 }

func (r *avroReader) long() (int64, error) {
	// Most numbers of a record are counts, lengths and small values of a
	// byte; this much inlines into the callers.
	if pos := r.pos; uint(pos) < uint(len(r.data)) && r.data[pos] < 0x80 {
		c := r.data[pos]
		r.pos = pos + 1
		return int64(c>>1) ^ -int64(c&1), nil
	}
	return r.longSlow()
}

func (r *avroReader) longSlow() (int64, error) {
	var u uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if r.pos >= len(r.data) {
			return 0, malformed("avro value ends inside a number at byte %d", r.pos)
		}
		c := r.data[r.pos]
		r.pos++
		u |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return int64(u>>1) ^ -int64(u&1), nil
		}
	}
	return 0, malformed("avro number longer than 10 bytes at byte %d", r.pos)
}

func (r *avroReader) int() (int64, error) {
	v, err := r.long()
	if err == nil && int64(int32(v)) != v {
		return 0, malformed("avro int %d out of range", v)
	}
	return v, err
}

// integer reads an int or a long as p's writer wrote it: an int beyond 32
// bits is no value of its type.
func (r *avroReader) integer(p *avroProg) (int64, error) {
	if p.int32 {
		return r.int()
	}
	return r.long()
}

func (r *avroReader) next(n int) ([]byte, error) {
	if n < 0 || n > len(r.data)-r.pos {
		return nil, malformed("avro value claims %d bytes, %d left at byte %d", n, len(r.data)-r.pos, r.pos)
	}
	b := r.data[r.pos : r.pos+n]
	r.pos += n
	return b, nil
}

func (r *avroReader) bytes() ([]byte, error) {
	// Strings and bytes shorter than 64 have a length of one byte.
	if pos := r.pos; uint(pos) < uint(len(r.data)) && r.data[pos] < 0x80 {
		c := r.data[pos]
		if n := int(c >> 1); c&1 == 0 && n < len(r.data)-pos {
			r.pos = pos + 1 + n
			return r.data[pos+1 : pos+1+n], nil
		}
	}
	return r.bytesSlow()
}

func (r *avroReader) bytesSlow() ([]byte, error) {
	n, err := r.long()
	if err != nil {
		return nil, err
	}
	if n < 0 || n > int64(len(r.data)) {
		return nil, malformed("avro bytes of length %d at byte %d", n, r.pos)
	}
	return r.next(int(n))
}

// value decodes one value. Its switch is the whole format: keeping it in
// one place is what lets a reader check it against Avro's specification.
func (r *avroReader) value(dst []byte, p *avroProg) ([]byte, error) {
	switch p.op {
	case opNull:
		return append(dst, "null"...), nil
	case opBoolean:
		b, err := r.next(1)
		if err != nil {
			return dst, err
		}
		if b[0] > 1 {
			return dst, malformed("avro boolean byte 0x%02x", b[0])
		}
		return appendBool(dst, b[0] == 1), nil
	case opInt:
		v, err := r.integer(p)
		return appendInt(dst, v), err
	case opIntFloat, opIntDouble:
		// Promoted to the reader's float, but written exact: a double
		// would merge 2^53 + 1 with 2^53, and a float far smaller
		// integers. An integral float prints the same digits, so a
		// copy written as a float still compares equal.
		v, err := r.integer(p)
		return appendInt(dst, v), err
	case opFloat, opFloatDouble:
		b, err := r.next(4)
		if err != nil {
			return dst, err
		}
		f := math.Float32frombits(binary.LittleEndian.Uint32(b))
		if p.op == opFloat {
			return appendFloat(dst, float64(f), 32)
		}
		return appendFloat(dst, float64(f), 64)
	case opDouble:
		b, err := r.next(8)
		if err != nil {
			return dst, err
		}
		return appendFloat(dst, math.Float64frombits(binary.LittleEndian.Uint64(b)), 64)
	case opBytes, opStringBytes, opDecimalBytes:
		b, err := r.bytes()
		if err != nil {
			return dst, err
		}
		if p.op == opDecimalBytes {
			return r.decimal(dst, b, p.scale)
		}
		return appendBase64(dst, b), nil
	case opString, opBytesString:
		b, err := r.bytes()
		if err != nil {
			return dst, err
		}
		return appendJSONString(dst, b)
	case opFixed, opDecimalFixed:
		b, err := r.next(p.size)
		if err != nil {
			return dst, err
		}
		if p.op == opDecimalFixed {
			return r.decimal(dst, b, p.scale)
		}
		return appendBase64(dst, b), nil
	}
	return r.complex(dst, p)
}

func (r *avroReader) complex(dst []byte, p *avroProg) ([]byte, error) {
	switch p.op {
	case opRecord:
		return r.record(dst, p)
	case opEnum:
		i, err := r.int()
		if err != nil {
			return dst, err
		}
		if i < 0 || i >= int64(len(p.symbols)) {
			return dst, malformed("avro enum index %d of %d symbols", i, len(p.symbols))
		}
		if p.symbols[i] == nil {
			return dst, fmt.Errorf("%w: the writer's enum symbol %d is not a symbol of the reader's enum", dedupe.ErrIncompatibleSchema, i)
		}
		return append(dst, p.symbols[i]...), nil
	case opArray, opMap:
		return r.blocks(dst, p)
	case opWriterUnion:
		i, err := r.long()
		if err != nil {
			return dst, err
		}
		if i < 0 || i >= int64(len(p.cases)) {
			return dst, malformed("avro union branch %d of %d", i, len(p.cases))
		}
		return r.value(dst, p.cases[i])
	case opReaderUnion:
		if p.open == nil {
			return r.value(dst, p.elem)
		}
		// The tag's object is a level of nesting, as the canonicalizer
		// counts them.
		if err := r.enter(); err != nil {
			return dst, err
		}
		out, err := r.value(append(dst, p.open...), p.elem)
		if err != nil {
			return out, err
		}
		r.depth--
		return append(out, '}'), nil
	case opFail:
		return dst, fmt.Errorf("%w: %s", dedupe.ErrIncompatibleSchema, p.err)
	}
	return dst, fmt.Errorf("avro program has no step %d", p.op)
}

// decimal writes a decimal of the given scale: a scale the schema sets in
// the millions would make every value megabytes of zeros.
func (r *avroReader) decimal(dst, b []byte, scale int) ([]byte, error) {
	if scale > r.limit-len(dst) {
		return dst, malformed("avro decimal of scale %d decodes to more than %d bytes", scale, r.limit)
	}
	return appendDecimal(dst, b, scale), nil
}

func (r *avroReader) enter() error {
	r.depth++
	if r.depth > dedupe.MaxNestingDepth {
		return malformed("avro value nested deeper than %d levels", dedupe.MaxNestingDepth)
	}
	return nil
}

func (r *avroReader) record(dst []byte, p *avroProg) ([]byte, error) {
	if err := r.enter(); err != nil {
		return dst, err
	}
	dst = append(dst, '{')
	first := true
	for i := range p.fields {
		f := &p.fields[i]
		if f.prog == nil {
			if err := r.skip(f.skip); err != nil {
				return dst, err
			}
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		var err error
		if dst, err = r.value(append(dst, f.name...), f.prog); err != nil {
			return dst, err
		}
	}
	if r.depth+p.defDepth > dedupe.MaxNestingDepth {
		return dst, malformed("avro value with its defaults nested deeper than %d levels", dedupe.MaxNestingDepth)
	}
	for _, d := range p.defaults {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, d...)
	}
	r.depth--
	return append(dst, '}'), nil
}

// blocks reads an array or a map: blocks of items, each block a count
// (negative: followed by the block's size in bytes), ended by a count of 0.
func (r *avroReader) blocks(dst []byte, p *avroProg) ([]byte, error) {
	if err := r.enter(); err != nil {
		return dst, err
	}
	open, closing := byte('['), byte(']')
	if p.op == opMap {
		open, closing = '{', '}'
	}
	dst = append(dst, open)
	first := true
	var small [linearKeys][]byte
	keys := small[:0]
	for {
		n, err := r.blockCount()
		if err != nil {
			return dst, err
		}
		if n == 0 {
			break
		}
		for ; n > 0; n-- {
			if len(dst) > r.limit {
				return dst, malformed("avro value decodes to more than %d bytes", r.limit)
			}
			if !first {
				dst = append(dst, ',')
			}
			first = false
			if p.op == opMap {
				if keys, err = r.mapKey(keys); err != nil {
					return dst, err
				}
				if dst, err = appendJSONString(dst, keys[len(keys)-1]); err != nil {
					return dst, err
				}
				dst = append(dst, ':')
			}
			if dst, err = r.value(dst, p.elem); err != nil {
				return dst, err
			}
		}
	}
	if err := uniqueKeys(keys); err != nil {
		return dst, err
	}
	r.depth--
	return append(dst, closing), nil
}

// blockCount reads the count that starts a block, and past the byte size
// that follows a negative one.
func (r *avroReader) blockCount() (int64, error) {
	n, err := r.long()
	if err != nil || n >= 0 {
		return n, err
	}
	if n == math.MinInt64 {
		return 0, malformed("avro block count out of range")
	}
	if _, err := r.long(); err != nil {
		return 0, err
	}
	return -n, nil
}

// linearKeys is how many keys of a map are compared with each other as
// they are read; the keys of a larger map are sorted once it ends.
const linearKeys = 8

// mapKey reads a map's next key and appends it to keys. A key written
// twice is refused: JSON would carry both members, and no fingerprint
// can say which one the producer meant.
func (r *avroReader) mapKey(keys [][]byte) ([][]byte, error) {
	k, err := r.bytes()
	if err != nil {
		return keys, err
	}
	if len(keys) < linearKeys {
		for _, o := range keys {
			if string(o) == string(k) {
				return keys, malformed("avro map repeats the key %q", k)
			}
		}
	}
	return append(keys, k), nil
}

func uniqueKeys(keys [][]byte) error {
	if len(keys) <= linearKeys {
		return nil
	}
	slices.SortFunc(keys, bytes.Compare)
	for i := 1; i < len(keys); i++ {
		if bytes.Equal(keys[i-1], keys[i]) {
			return malformed("avro map repeats the key %q", keys[i])
		}
	}
	return nil
}

// skip reads past a value of a writer field the reader does not have.
func (r *avroReader) skip(s *avroSchema) error {
	switch s.kind {
	case avroNull:
		return nil
	case avroBoolean:
		_, err := r.next(1)
		return err
	case avroInt, avroLong, avroEnum:
		_, err := r.long()
		return err
	case avroFloat:
		_, err := r.next(4)
		return err
	case avroDouble:
		_, err := r.next(8)
		return err
	case avroBytes, avroString:
		_, err := r.bytes()
		return err
	case avroFixed:
		_, err := r.next(s.size)
		return err
	case avroUnion:
		i, err := r.long()
		if err != nil {
			return err
		}
		if i < 0 || i >= int64(len(s.branches)) {
			return malformed("avro union branch %d of %d", i, len(s.branches))
		}
		return r.skip(s.branches[i])
	}
	return r.skipComplex(s)
}

func (r *avroReader) skipComplex(s *avroSchema) error {
	if err := r.enter(); err != nil {
		return err
	}
	defer func() { r.depth-- }()
	if s.kind == avroRecord {
		for _, f := range s.fields {
			if err := r.skip(f.typ); err != nil {
				return err
			}
		}
		return nil
	}
	for {
		n, err := r.long()
		if err != nil || n == 0 {
			return err
		}
		if n < 0 {
			size, err := r.long()
			if err != nil {
				return err
			}
			if size < 0 {
				return malformed("avro block size %d", size)
			}
			_, err = r.next(int(min(size, int64(len(r.data)+1))))
			if err != nil {
				return err
			}
			continue
		}
		for ; n > 0; n-- {
			// Counted across the whole record: nested blocks multiply.
			if r.skipped++; r.skipped > r.limit {
				return malformed("avro value has more than %d items", r.limit)
			}
			if s.kind == avroMap {
				if _, err := r.bytes(); err != nil {
					return err
				}
				err = r.skip(s.values)
			} else {
				err = r.skip(s.items)
			}
			if err != nil {
				return err
			}
		}
	}
}
