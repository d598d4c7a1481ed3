package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// TestRunStopsAtAnEntryItCannotRead: a value at a key's entry that this
// release does not read (here one in the form a later format would take)
// stops the pipeline with a reason naming it, on the real broker and a
// real Redis. Nothing of the batch is written or committed, the value is
// left as it was, and the rest of the process does not guess.
func TestRunStopsAtAnEntryItCannotRead(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	name, in, out, dlq := pipelineTopics(t, brokers, "unreadable", 1)
	config := writeRunConfig(t, brokers, redisAddr, name,
		fmt.Sprintf("{name: p, input: %s, output: %s, dlq: %s, key: {format: any}}", in, out, dlq))
	const later = "\x00\x01a later release's entry"
	entry := name + ":{p:k01}"
	if _, err := testenv.RedisCommand(redisAddr, "SET", entry, later, "EX", "600"); err != nil {
		t.Fatal(err)
	}
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	produce(t, io, produced{in, 0, nil, key("k00"), `{"n":0}`}, produced{in, 0, nil, key("k01"), `{"n":1}`}, produced{in, 0, nil, key("k02"), `{"n":2}`})

	inst := startInstance(t, config, nil)
	var code int
	waitUntil(t, 2*time.Minute, "the run to stop", func() bool {
		select {
		case code = <-inst.done:
			inst.stopped = true
			return true
		default:
			return false
		}
	})
	if log := inst.stderr.String(); code == 0 || !strings.Contains(log, entry) || !strings.Contains(log, "is not one this release reads") {
		t.Errorf("run exited %d; want an error naming %s as not one this release reads:\n%s", code, entry, tail(log, 20))
	}
	if got := readTopic(t, io, out); len(got) != 0 {
		t.Errorf("%d results written, want none: the batch stopped", len(got))
	}
	if got := readTopic(t, io, dlq); len(got) != 0 {
		t.Errorf("%d dead letters written, want none: the record is not at fault", len(got))
	}
	if raw, err := testenv.RedisCommand(redisAddr, "GET", entry); err != nil || raw != later {
		t.Errorf("the entry became %q (%v), want it unchanged", raw, err)
	}
}
