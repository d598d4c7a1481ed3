package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestKafkaClusterReplication proves what the chaos test relies on: the
// cluster has three replicas of a topic, a write with acks=all survives
// the SIGKILL of the partition's leader (another node leads, the record is
// still there), is refused with NOT_ENOUGH_REPLICAS when only one node is
// left (min.insync.replicas=2), and the killed nodes come back in sync.
func TestKafkaClusterReplication(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three Kafka nodes: not with -short")
	}
	c := StartKafkaCluster(t)
	t.Logf("cluster %v up in %v", c.Brokers, c.StartedIn.Round(100*time.Millisecond))
	topic := UniqueName(t, "replicated")
	c.CreateTopics(t, 1, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(c.Brokers...), Timeout: 10 * time.Second}
	produce := func(value string) error {
		res, err := client.Produce(ctx, &kafka.ProduceRequest{
			Topic: topic, Partition: 0, RequiredAcks: kafka.RequireAll,
			Records: kafka.NewRecordReader(kafka.Record{Value: kafka.NewBytes([]byte(value))}),
		})
		if err != nil {
			return err
		}
		return res.Error
	}
	// produceEventually retries while leadership moves (NOT_LEADER, a
	// connection to the dead node), with a deadline.
	produceEventually := func(value string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			err := produce(value)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("produce %q: %v", value, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	produceEventually("before")
	leader, err := c.Leader(ctx, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	produceEventually("one node down")
	next, err := c.Leader(ctx, topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("node %d was killed and still leads", leader)
	}
	// A second node down: one replica left, below min.insync.replicas.
	if err := c.Stop(next); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := produce("two nodes down")
		if errors.Is(err, kafka.NotEnoughReplicas) || errors.Is(err, kafka.NotEnoughReplicasAfterAppend) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with one node of three, acks=all answered %v, want NOT_ENOUGH_REPLICAS", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, id := range []int{leader, next} {
		if err := c.Start(id); err != nil {
			t.Fatal(err)
		}
	}
	for {
		err := c.InSync(ctx, topic)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("replicas not back in sync: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Every acknowledged record is there, on whichever node leads now.
	lo, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	if end := lo.Topics[topic][0].LastOffset; end < 2 {
		t.Fatalf("end offset %d after two acknowledged writes", end)
	}
}
