package sinks

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"unsafe"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
)

// Every input record passes through drain and every result through
// kafkaRecords: one allocation per record per step was a tenth of the
// consumer's CPU in the load run's profile. The records of one fetch are
// kept and dropped together (by their batch), so they share blocks.

// copyBlock is the size of a block of copied bytes. A record whose bytes
// take more than a quarter of it gets its own allocation, so that a
// block wastes at most a quarter.
const copyBlock = 64 << 10

// fetchCopies hands out the copies of one fetch's keys, values and
// headers from shared blocks. A block lives as long as any record cut
// from it.
type fetchCopies struct {
	bytes   []byte
	headers []dedupe.Header
}

// take returns n bytes of a block (a fresh slice, cap n), never nil: an
// empty key or value stays empty, not null.
func (c *fetchCopies) take(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	if n > copyBlock/4 {
		return make([]byte, n)
	}
	if cap(c.bytes)-len(c.bytes) < n {
		c.bytes = make([]byte, 0, copyBlock)
	}
	start := len(c.bytes)
	c.bytes = c.bytes[:start+n]
	return c.bytes[start : start+n : start+n]
}

// headerSlots returns n headers of a block of 256.
func (c *fetchCopies) headerSlots(n int) []dedupe.Header {
	const slots = 256
	if n > slots/4 {
		return make([]dedupe.Header, n)
	}
	if cap(c.headers)-len(c.headers) < n {
		c.headers = make([]dedupe.Header, 0, slots)
	}
	start := len(c.headers)
	c.headers = c.headers[:start+n]
	return c.headers[start : start+n : start+n]
}

// keyValue copies a record's key and value. A null key or value stays
// nil, an empty one stays empty.
func (c *fetchCopies) keyValue(k, v kafka.Bytes) (key, value []byte, err error) {
	kn, vn := 0, 0
	if k != nil {
		kn = k.Len()
	}
	if v != nil {
		vn = v.Len()
	}
	buf := c.take(kn + vn)
	if k != nil {
		key = buf[:kn:kn]
		if _, err = io.ReadFull(k, key); err != nil {
			return nil, nil, err
		}
	}
	if v != nil {
		value = buf[kn:]
		if _, err = io.ReadFull(v, value); err != nil {
			return nil, nil, err
		}
	}
	return key, value, nil
}

// fromKafka copies fetched headers, so that nothing a record keeps points
// into memory kafka-go owns. (kafka-go 0.4 decodes header values into
// slices of their own, but nothing in its API promises it; keys and
// values, read through its Bytes, live in pooled pages.)
func (c *fetchCopies) fromKafka(hs []kafka.Header) []dedupe.Header {
	if len(hs) == 0 {
		return nil
	}
	out := c.headerSlots(len(hs))
	n := 0
	for _, h := range hs {
		n += len(h.Value)
	}
	buf := c.take(n)[:0]
	for i, h := range hs {
		out[i].Key = h.Key
		if len(h.Value) > 0 {
			start := len(buf)
			buf = append(buf, h.Value...)
			out[i].Value = buf[start:len(buf):len(buf)]
		}
	}
	return out
}

// fetchedScratch holds the records of a fetch while drain reads them: the
// fetch's size is known only at its end, and growing the result as it
// reads copied every record about twice.
var fetchedScratch = sync.Pool{New: func() any { return new([]Fetched) }}

// maxPooledFetch bounds the scratch slices kept: a 4 MiB fetch of 1 KB
// records fits.
const maxPooledFetch = 8192

// drain reads a record set, skipping records before from (a fetch returns
// whole batches).
func drain(rr kafka.RecordReader, from int64) ([]Fetched, error) {
	if rr == nil {
		return nil, nil
	}
	sp := fetchedScratch.Get().(*[]Fetched)
	scratch := (*sp)[:0]
	defer func() {
		if cap(scratch) > maxPooledFetch {
			return // a fetch of many small records: not kept
		}
		clear(scratch) // the pool must not keep the records alive
		*sp = scratch[:0]
		fetchedScratch.Put(sp)
	}()
	var c fetchCopies
	for {
		r, err := rr.ReadRecord()
		if errors.Is(err, io.EOF) {
			if len(scratch) == 0 {
				return nil, nil
			}
			return append([]Fetched(nil), scratch...), nil
		}
		if err != nil {
			return nil, err
		}
		if r.Offset < from {
			release(r.Key, r.Value)
			continue
		}
		key, value, err := c.keyValue(r.Key, r.Value)
		release(r.Key, r.Value)
		if err != nil {
			return nil, err
		}
		scratch = append(scratch, Fetched{Offset: r.Offset, Time: r.Time, Message: Message{Key: key, Value: value, Headers: c.fromKafka(r.Headers)}})
	}
}

// payload is a record's key or value as kafka-go reads it: what
// kafka.NewBytes allocates one at a time, here in one slice per request.
type payload struct{ bytes.Reader }

func (*payload) Close() error { return nil }

// kafkaRecords is msgs[idx] as kafka-go's records, with their keys,
// values and headers in one allocation each.
func kafkaRecords(msgs []Message, idx []int) []kafka.Record {
	records := make([]kafka.Record, len(idx))
	payloads := make([]payload, 2*len(idx))
	for j, i := range idx {
		m := &msgs[i]
		r := &records[j]
		if m.Key != nil {
			payloads[2*j].Reset(m.Key)
			r.Key = &payloads[2*j]
		}
		if m.Value != nil {
			payloads[2*j+1].Reset(m.Value)
			r.Value = &payloads[2*j+1]
		}
		r.Headers = asKafkaHeaders(m.Headers)
	}
	return records
}

// asKafkaHeaders is hs as kafka-go's headers, without a copy: the two
// types are one struct (the conversion below compiles only while they
// are), and kafka-go only reads them.
func asKafkaHeaders(hs []dedupe.Header) []kafka.Header {
	if len(hs) == 0 {
		return nil
	}
	return unsafe.Slice((*kafka.Header)(unsafe.Pointer(&hs[0])), len(hs))
}

var _ = kafka.Header(dedupe.Header{})
