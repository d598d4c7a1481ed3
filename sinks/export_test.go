package sinks

import (
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
)

// FromKafka copies fetched headers as a fetch does, for the black-box
// tests.
func FromKafka(hs []kafka.Header) []dedupe.Header {
	var c fetchCopies
	return c.fromKafka(hs)
}
