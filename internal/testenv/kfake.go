package testenv

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// FakeKafka starts an in-process Kafka-protocol broker (franz-go's kfake)
// that holds topics, each of partitions partitions, and stops it when the
// test ends. It returns a client of it, with a transport of its own whose
// idle connections close with the test, and the broker's addresses. It is
// for fast unit tests; the proofs run on a real broker (KafkaBrokers).
func FakeKafka(t testing.TB, partitions int32, topics ...string) (*kafka.Client, []string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	transport := &kafka.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	addrs := c.ListenAddrs()
	return &kafka.Client{Addr: kafka.TCP(addrs...), Timeout: 10 * time.Second, Transport: transport}, addrs
}
