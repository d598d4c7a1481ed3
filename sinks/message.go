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

// Own returns m with its key, value and headers copied into memory of
// their own. A fetched record shares blocks with the rest of its fetch;
// one kept longer than its fetch (a stored result for a reply, a dead
// letter to send back) would keep them all.
func (m Message) Own() Message {
	if m.Key != nil {
		m.Key = append([]byte{}, m.Key...)
	}
	if m.Value != nil {
		m.Value = append([]byte{}, m.Value...)
	}
	if m.Headers != nil {
		hs := make([]dedupe.Header, len(m.Headers))
		for i, h := range m.Headers {
			hs[i].Key = h.Key
			if h.Value != nil {
				hs[i].Value = append([]byte{}, h.Value...)
			}
		}
		m.Headers = hs
	}
	return m
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
