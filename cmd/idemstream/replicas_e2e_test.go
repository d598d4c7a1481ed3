package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// TestRunPausesWhileReplicasDoNotAcknowledge: with min_replicas 1 and the
// replication link cut, the instance decides nothing, reports why on
// /readyz and counts it; when the link is back it resumes by itself.
func TestRunPausesWhileReplicasDoNotAcknowledge(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	master := testenv.StartRedis(t, testenv.RedisConfig{})
	proxy := testenv.StartReplicationProxy(t, master.Addr)
	testenv.StartRedisReplica(t, proxy.Addr, testenv.RedisConfig{})
	run, inTopic, outTopic, dlqTopic := pipelineTopics(t, brokers, "replicas", 1)
	config := filepath.Join(t.TempDir(), "c.yaml")
	// No persistence on the master: min_replicas 1 is what keeps the
	// decisions, and the start-up checks accept it.
	yaml := fmt.Sprintf("kafka: {brokers: [%s], group: %s}\nstore: {redis: {url: 'redis://%s/0', min_replicas: 1, replica_timeout: 300ms}}\npipelines:\n  - {name: p, input: %s, output: %s, dlq: %s, key: {format: any}}\n",
		strings.Join(brokers, ","), run, master.Addr, inTopic, outTopic, dlqTopic)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	inst := startInstance(t, config, nil)
	waitUntil(t, 60*time.Second, "ready", func() bool { code, _ := inst.get("/readyz"); return code == 200 })
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	produce(t, io, produced{inTopic, 0, nil, key("before"), `{"n":1}`})
	waitUntil(t, 30*time.Second, "the first record", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 1
	})

	proxy.Partition()
	produce(t, io, produced{inTopic, 0, nil, key("during"), `{"n":2}`})
	waitUntil(t, 30*time.Second, "/readyz to report the unacknowledged writes", func() bool {
		code, body := inst.get("/readyz")
		return code == 503 && strings.Contains(body, "store writes not acknowledged by replicas")
	})
	if got := inst.metric("idemstream_store_replica_ack_failures_total", "op", "decide"); got < 1 {
		t.Errorf("idemstream_store_replica_ack_failures_total{op=decide} = %v, want > 0", got)
	}
	if got := inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first"); got != 1 {
		t.Errorf("decided %v firsts while no replica acknowledged, want still 1", got)
	}
	if got := len(readTopic(t, io, outTopic)); got != 1 {
		t.Errorf("%d results while no replica acknowledged, want 1", got)
	}

	proxy.Heal()
	waitUntil(t, 60*time.Second, "ready again", func() bool { code, _ := inst.get("/readyz"); return code == 200 })
	waitUntil(t, 30*time.Second, "the held record decided", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 2
	})
	if got := len(readTopic(t, io, outTopic)); got != 2 {
		t.Errorf("%d results after the link returned, want 2", got)
	}
}
