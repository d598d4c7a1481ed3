package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// longRange is n bytes of a random block of 128 KiB repeated: zstd, whose
// window spans the repeats, packs it into about one block, while lz4 (64
// KiB back) cannot shrink it. A producer using zstd gets it past the
// broker's message.max.bytes; written back as it came, or with another
// codec, it is refused.
func longRange(n int) []byte {
	block := make([]byte, 128<<10)
	_, _ = rand.Read(block)
	return bytes.Repeat(block, n/len(block)+1)[:n]
}

// jsonOf is a valid JSON command of exactly n bytes.
func jsonOf(n int, key string) []byte {
	head := fmt.Sprintf(`{"id":%q,"pad":"`, key)
	return []byte(head + strings.Repeat("x", n-len(head)-2) + `"}`)
}

// TestPoisonRecordsOnTheRealBroker drains one partition that mixes
// ordinary commands with every record a producer can send that cannot be
// passed on as it came, with default settings (compression, settle wait,
// pending_timeout, window) on the real broker and Redis:
//   - a 3 MB command that arrived zstd-compressed, far over
//     max_payload_bytes, that lz4 cannot shrink (its dead letter is
//     trimmed);
//   - a small valid command with 3 MB of such headers (its result is
//     refused, and its dead letter is written without the input's headers);
//   - commands at the size edge: exactly max_payload_bytes (a result) and
//     one byte over (a dead letter), both compressible.
//
// Judged from the topics: every ordinary command one result, each large one
// exactly one outcome, no dead letter twice, the committed offset at the
// end, the process still running and ready. The store's entries are
// compact.
func TestPoisonRecordsOnTheRealBroker(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	name, in, out, dlq := pipelineTopics(t, brokers, "poison", 1)
	config := writeRunConfig(t, brokers, redisAddr, name,
		fmt.Sprintf("{name: p, input: %s, output: %s, dlq: %s, key: {format: any}}", in, out, dlq))

	zstd := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second})
	zstd.Compression = kafka.Zstd
	const limit = 1 << 20 // max_payload_bytes' default
	var msgs []sinks.Message
	ordinary := func(from, to int) {
		for i := from; i < to; i++ {
			k := fmt.Sprintf("k%02d", i)
			msgs = append(msgs, sinks.Message{Topic: in, Partition: 0, Value: []byte(fmt.Sprintf(`{"id":%q,"client_time":"%d"}`, k, i)),
				Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(k)}}})
		}
	}
	large := map[string]int64{} // key: offset
	add := func(key string, value []byte, extra ...dedupe.Header) {
		large[key] = int64(len(msgs))
		msgs = append(msgs, sinks.Message{Topic: in, Partition: 0, Value: value,
			Headers: append([]dedupe.Header{{Key: "Idempotency-Key", Value: []byte(key)}}, extra...)})
	}
	ordinary(0, 30)
	add("huge-payload", longRange(3<<20))
	add("huge-headers", []byte(`{"id":"huge-headers"}`), dedupe.Header{Key: "X-Trace", Value: longRange(3 << 20)})
	add("at-limit", jsonOf(limit, "at-limit"))
	add("over-limit", jsonOf(limit+1, "over-limit"))
	ordinary(30, 60)
	// One record per request: each large one travels in a batch of its own.
	for i := range msgs {
		if _, err := zstd.Write(context.Background(), msgs[i:i+1]); err != nil {
			t.Fatalf("producing record %d: %v", i, err)
		}
	}

	// Compact entries: the format a deployment moves to (the other
	// end-to-end runs write text).
	inst := startInstanceWith(t, config, map[string]string{"IDEMSTREAM_REDIS_ENTRY_FORMAT": "compact"})

	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	committed := func() int64 {
		res, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: name + ".p", Topics: map[string][]int{in: {0}}})
		if err != nil || len(res.Topics[in]) == 0 {
			return -1
		}
		return res.Topics[in][0].CommittedOffset
	}
	waitUntil(t, 3*time.Minute, "the offset at the end of the partition", func() bool {
		select {
		case code := <-inst.done:
			inst.stopped = true
			t.Fatalf("run exited %d before the partition was drained:\n%s", code, inst.stderr.String())
		default:
		}
		return committed() == int64(len(msgs))
	})
	if code, body := inst.get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d %s after the poison records", code, body)
	}
	if raw, err := testenv.RedisCommand(redisAddr, "GET", name+":{p:k00}"); err != nil || raw == "" || raw[0] >= ' ' {
		t.Errorf("the entry of k00 is %q (%v), want a compact entry", raw, err)
	}

	reader := sinks.NewKafka(client)
	results := map[string]int{}
	for _, r := range readTopic(t, reader, out) {
		results[hv(r, "idemstream-key")]++
	}
	deadLetters := map[string][]sinks.Fetched{}
	for _, d := range readTopic(t, reader, dlq) {
		deadLetters[hv(d, "idemstream-source")] = append(deadLetters[hv(d, "idemstream-source")], d)
	}
	for i := range 60 {
		if k := fmt.Sprintf("k%02d", i); results[k] != 1 {
			t.Errorf("%s has %d results, want 1", k, results[k])
		}
	}
	for source, ds := range deadLetters {
		if len(ds) != 1 {
			t.Errorf("%d dead letters for %s, want 1", len(ds), source)
		}
	}
	for key, offset := range large {
		source := fmt.Sprintf("%s/0/%d", in, offset)
		if n := results[key] + len(deadLetters[source]); n != 1 {
			t.Errorf("%s (%s): %d results and %d dead letters, want exactly one outcome", key, source, results[key], len(deadLetters[source]))
		}
	}
	if results["at-limit"] != 1 {
		t.Errorf("the command of exactly max_payload_bytes got %d results, want 1", results["at-limit"])
	}
	for key, want := range map[string]struct{ trimmed, bare bool }{
		"huge-payload": {trimmed: true}, "huge-headers": {trimmed: true, bare: true}, "over-limit": {},
	} {
		ds := deadLetters[fmt.Sprintf("%s/0/%d", in, large[key])]
		if len(ds) != 1 {
			continue
		}
		d := ds[0]
		if hv(d, "idemstream-reason") != "payload_too_large" {
			t.Errorf("%s: reason %q, want payload_too_large", key, hv(d, "idemstream-reason"))
		}
		_, trimmed := sinks.HeaderValue(d.Headers, "idemstream-payload-size")
		_, hasTrace := sinks.HeaderValue(d.Headers, "X-Trace")
		if trimmed != want.trimmed || hasTrace == want.bare && key == "huge-headers" {
			t.Errorf("%s: trimmed %v (idemstream-payload-size %q), X-Trace kept %v; want trimmed %v, bare %v",
				key, trimmed, hv(d, "idemstream-payload-size"), hasTrace, want.trimmed, want.bare)
		}
	}
	t.Logf("%d records drained: %d results, %d dead letters", len(msgs), len(results), len(deadLetters))
}
