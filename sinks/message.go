package sinks

import (
	"github.com/idemstream/idemstream/dedupe"
)

// Message is one record to write. Partition is chosen by the writer from
// the key (the same murmur2 hash Java clients use) unless Partition >= 0.
type Message struct {
	Topic     string
	Partition int
	Key       []byte
	Value     []byte
	Headers   []dedupe.Header
}

// Written is where a message landed.
type Written struct {
	Partition int
	Offset    int64
	// Err is why the message was not acknowledged (Offset is then
	// dedupe.NoPosition); nil once it was.
	Err error
}

// HeaderValue returns the value of the last header named key.
func HeaderValue(hs []dedupe.Header, key string) (string, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return string(hs[i].Value), true
		}
	}
	return "", false
}
