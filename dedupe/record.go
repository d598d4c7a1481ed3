package dedupe

import (
	"strconv"
	"time"
)

// Header is one record header. Values are bytes: Kafka does not promise
// text.
type Header struct {
	Key   string
	Value []byte
}

// Record is an input command as the decider sees it, independent of the
// Kafka client that fetched it.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Time      time.Time
}

// Source is the record's position as the idemstream-source header spells
// it: topic/partition/offset.
func (r Record) Source() string {
	// Built in one buffer: every record needs it, and concatenating the
	// formatted numbers allocates once per number as well.
	var buf [80]byte
	return string(r.AppendSource(buf[:0]))
}

// AppendSource appends the record's Source to b: comparing with a source
// in hand then allocates nothing.
func (r Record) AppendSource(b []byte) []byte {
	b = append(b, r.Topic...)
	b = strconv.AppendInt(append(b, '/'), int64(r.Partition), 10)
	return strconv.AppendInt(append(b, '/'), r.Offset, 10)
}
