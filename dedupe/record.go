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
	return r.Topic + "/" + strconv.Itoa(r.Partition) + "/" + strconv.FormatInt(r.Offset, 10)
}
