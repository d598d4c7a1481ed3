package consumer_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// TestLoadStrictPipelineVsBareLoop measures records per second of the
// strict pipeline on a real broker and a real Redis, and of a bare kafka-go
// consume→produce loop over the same input in the same run. It is a load
// test, not a unit test: it runs only with IDEMSTREAM_LOAD=1 (make load)
// and asserts nothing about speed; the figures go to the log.
func TestLoadStrictPipelineVsBareLoop(t *testing.T) {
	if os.Getenv("IDEMSTREAM_LOAD") == "" {
		t.Skip("a load test: run it with make load (IDEMSTREAM_LOAD=1)")
	}
	n := 50000
	if v, err := strconv.Atoi(os.Getenv("IDEMSTREAM_LOAD_RECORDS")); err == nil && v > 0 {
		n = v
	}
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	run := testenv.UniqueName(t, "load")
	in, bareOut, out, dlq := run+".in", run+".bare", run+".out", run+".dlq"
	testenv.CreateTopics(t, brokers, 6, in, bareOut, out, dlq)
	ctx := context.Background()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second, Transport: transport})

	// The workload: one key in five is sent twice, with a new client_time.
	msgs := make([]sinks.Message, 0, n)
	for i := 0; len(msgs) < n; i++ {
		k := fmt.Sprintf("9f8a2c1d-3e4f-4a5b-8c6d-%012d", i)
		body := fmt.Sprintf(`{"user_id":"u-%d","coupon_id":12345,"amount":50,"items":[{"sku":"A-1","qty":1},{"sku":"B-2","qty":2}],"client_time":"2026-06-18T10:00:%02d.000Z","trace_id":"%016x"}`, i, i%60, i)
		msgs = append(msgs, sinks.Message{Topic: in, Partition: -1, Key: []byte(k), Value: []byte(body),
			Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(k)}}})
		if i%5 == 0 && len(msgs) < n {
			dup := msgs[len(msgs)-1]
			dup.Value = []byte(string(body[:len(body)-40]) + `"client_time":"2026-06-18T10:01:00.000Z","trace_id":"x"}`)
			msgs = append(msgs, dup)
		}
	}
	for start := 0; start < len(msgs); start += 1000 {
		if _, err := io.Write(ctx, msgs[start:min(start+1000, len(msgs))]); err != nil {
			t.Fatal(err)
		}
	}

	bare := bareLoop(t, brokers, in, bareOut, run+".bare-group", n)
	strict := strictPipeline(t, brokers, redisAddr, io, run, in, out, dlq, n)
	t.Logf("records: %d (1 in 6 a volatile-only retry), 6 partitions, one process each", n)
	t.Logf("bare kafka-go consume→produce loop: %.0f records/s (%v)", float64(n)/bare.Seconds(), bare.Round(time.Millisecond))
	t.Logf("idemstream strict pipeline (real Redis): %.0f records/s (%v)", float64(n)/strict.Seconds(), strict.Round(time.Millisecond))
	t.Logf("ratio idemstream / bare: %.2f", bare.Seconds()/strict.Seconds())
}

// bareLoop is what a team writes without idemstream: read, forward,
// commit, nothing decided.
func bareLoop(t *testing.T, brokers []string, in, out, group string, n int) time.Duration {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: group, Topic: in, MinBytes: 1, MaxBytes: 4 << 20,
		MaxWait: 100 * time.Millisecond, StartOffset: kafka.FirstOffset, QueueCapacity: 1000})
	defer r.Close()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: out, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, BatchSize: 500, Balancer: &kafka.Murmur2Balancer{}}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	done := 0
	for done < n {
		first, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("bare loop: %v", err)
		}
		batch := []kafka.Message{first}
		for len(batch) < 500 {
			short, c := context.WithTimeout(ctx, 2*time.Millisecond)
			m, err := r.FetchMessage(short)
			c()
			if err != nil {
				break
			}
			batch = append(batch, m)
		}
		fwd := make([]kafka.Message, len(batch))
		for i, m := range batch {
			fwd[i] = kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers}
		}
		if err := w.WriteMessages(ctx, fwd...); err != nil {
			t.Fatalf("bare loop write: %v", err)
		}
		if err := r.CommitMessages(ctx, batch...); err != nil {
			t.Fatalf("bare loop commit: %v", err)
		}
		done += len(batch)
	}
	return time.Since(start)
}

func strictPipeline(t *testing.T, brokers []string, redisAddr string, io *sinks.Kafka, run, in, out, dlq string, n int) time.Duration {
	client, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + redisAddr + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	reg := prometheus.NewRegistry()
	m, _ := consumer.NewMetrics(reg, "load")
	store := consumer.InstrumentStore(redisstore.New(client, run), m)
	format, _ := dedupe.ParseKeyFormat("uuid")
	d, err := dedupe.NewDecider(dedupe.Policy{Pipeline: "strict", Key: dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "Idempotency-Key", Format: format, MaxLength: 128},
		Semantics: dedupe.Strict, Window: 10 * time.Minute, Clock: dedupe.ClockStore,
		Rules:           dedupe.CanonicalRules{Volatile: []string{"/client_time", "/trace_id"}, Unordered: []string{"/items"}},
		MaxPayloadBytes: 1 << 20, PendingTimeout: 30 * time.Second, FailedTTL: 10 * time.Minute}, store)
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(consumer.Config{Name: "strict", Input: in, Output: out, DLQ: dlq, Group: run + ".strict",
		Brokers: brokers, Decider: d, Store: store, Broker: io, Metrics: m, MaxWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		sum := 0.0
		for _, o := range dedupe.Outcomes {
			sum += testutil.ToFloat64(m.Records.WithLabelValues("strict", string(o)))
		}
		if int(sum) >= n {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("strict pipeline decided %v of %d records in 10 minutes", sum, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
