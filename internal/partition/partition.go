// Package partition picks the partition of a result record: murmur2 of the
// key, as Java producers and kafka-go's Murmur2Balancer pick it, so that
// the results of one key stay in one partition whoever writes them. The
// consumer records the partition in a key's intent before it writes, and
// the writer places a record without one the same way, so both use this.
package partition

import "github.com/segmentio/kafka-go"

var balancer = &kafka.Murmur2Balancer{}

// For is the partition of key among n.
func For(key []byte, n int) int {
	if n > len(identity) {
		parts := make([]int, n)
		for i := range parts {
			parts[i] = i
		}
		return balancer.Balance(kafka.Message{Key: key}, parts...)
	}
	// The balancer only reads the list: one shared list of every
	// partition number spares an allocation per result.
	return balancer.Balance(kafka.Message{Key: key}, identity[:n]...)
}

var identity = func() []int {
	ids := make([]int, 1024)
	for i := range ids {
		ids[i] = i
	}
	return ids
}()
