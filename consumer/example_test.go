package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

// A coupon desk with one coupon left, behind idemstream: the handler runs
// once per idempotency key, a client's retry (new client_time) is a replay
// that never reaches it, and a claim it refuses for good goes to the
// dead-letter topic. Kafka here is an in-process fake and the store is in
// memory; in production they are a cluster and redisstore.
func ExampleNewPipeline() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "claims", "claims.results", "claims.dlq"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	var mu sync.Mutex
	stock := 1
	desk := consumer.HandlerFunc(func(ctx context.Context, cmd consumer.Command) (consumer.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println("handler runs for", cmd.Key)
		if stock == 0 {
			// Retrying cannot help: dead-letter it, and remember the key
			// as FAILED until failed_ttl.
			return consumer.Result{}, consumer.Permanent(errors.New("coupon SPRING24 is out of stock"))
		}
		stock--
		return consumer.Result{Value: []byte(`{"coupon":"SPRING24","issued":true}`)}, nil
	})

	keys, _ := dedupe.ParseKeyFormat("any")
	p, err := consumer.NewPipeline(consumer.Options{
		Brokers: brokers,
		Policy: dedupe.Policy{
			Pipeline:  "coupon-claim",
			Key:       dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "Idempotency-Key", Format: keys, MaxLength: 128},
			Semantics: dedupe.Strict, Window: 10 * time.Minute, Clock: dedupe.ClockStore,
			Rules:           dedupe.CanonicalRules{Volatile: []string{"/client_time"}},
			MaxPayloadBytes: 1 << 20, PendingTimeout: 30 * time.Second, FailedTTL: 10 * time.Minute,
		},
		Store:   memstore.New(),
		Handler: desk,
		Input:   "claims", Output: "claims.results", DLQ: "claims.dlq",
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	claim := func(key, body string) kafka.Message {
		return kafka.Message{Value: []byte(body), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(key)}}}
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "claims", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(context.Background(),
		claim("k-1", `{"user":"u-1","coupon":"SPRING24","client_time":"12:00:00"}`),
		claim("k-1", `{"user":"u-1","coupon":"SPRING24","client_time":"12:00:07"}`), // the client's retry
		claim("k-2", `{"user":"u-2","coupon":"SPRING24","client_time":"12:00:09"}`),
	); err != nil {
		panic(err)
	}
	_ = w.Close()

	// Wait (with a deadline) for the result and the dead letter.
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...)})
	var results, dead []sinks.Fetched
	for deadline := time.Now().Add(30 * time.Second); len(results) < 1 || len(dead) < 1; {
		if time.Now().After(deadline) {
			panic("no result and dead letter within 30s")
		}
		time.Sleep(20 * time.Millisecond)
		results, _ = io.Read(context.Background(), "claims.results", 0, 0, 0)
		dead, _ = io.Read(context.Background(), "claims.dlq", 0, 0, 0)
	}
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}

	for _, r := range results {
		key, _ := sinks.HeaderValue(r.Headers, sinks.HeaderKey)
		fmt.Printf("result for %s: %s\n", key, r.Value)
	}
	for _, d := range dead {
		reason, _ := sinks.HeaderValue(d.Headers, sinks.HeaderReason)
		msg, _ := sinks.HeaderValue(d.Headers, sinks.HeaderError)
		fmt.Printf("dead letter: %s (%s)\n", reason, strings.TrimSpace(msg))
	}
	// Output:
	// handler runs for k-1
	// handler runs for k-2
	// result for k-1: {"coupon":"SPRING24","issued":true}
	// dead letter: handler_failed (coupon SPRING24 is out of stock)
}

// A handler tells a final refusal from a passing trouble by wrapping the
// error: Permanent errors dead-letter the record, any other error is
// retried while the partition waits.
func ExamplePermanent() {
	errClosed := errors.New("account closed")
	err := fmt.Errorf("claim for u-7: %w", consumer.Permanent(errClosed))
	fmt.Println(consumer.IsPermanent(err), errors.Is(err, errClosed))

	timeout := errors.New("coupon service: timeout")
	fmt.Println(consumer.IsPermanent(timeout))
	// Output:
	// true true
	// false
}

// A service built from a configuration file, as `idemstream run` builds
// it: the file's kafka.tls and kafka.sasl, its store (Redis standalone,
// Sentinel or Cluster, or memory as here) and its rules all apply; the
// program adds its own handler and its own Prometheus registry. Kafka here
// is an in-process fake.
func ExampleNewService() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "orders.results", "orders.dlq"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()[0]

	cfg, err := schemas.Parse([]byte(`
kafka: {brokers: ["`+brokers+`"]}       # tls: and sasl: go here too
store: {kind: memory}                    # or redis: {url: ..., min_replicas: 1}
pipelines:
  - name: orders
    input: orders
    output: orders.results
    dlq: orders.dlq
    key: {from: header, name: Idempotency-Key, format: any}
    volatile: [/client_time]
`), "")
	if err != nil {
		panic(err)
	}
	ship := consumer.HandlerFunc(func(ctx context.Context, cmd consumer.Command) (consumer.Result, error) {
		fmt.Println("shipping", cmd.Key)
		return consumer.Result{Value: []byte(`{"shipped":true}`)}, nil
	})
	svc, err := consumer.NewService(cfg, consumer.ServiceOptions{
		Handlers:   map[string]consumer.Handler{"orders": ship},
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		panic(err)
	}
	defer svc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()

	order := func(key, body string) kafka.Message {
		return kafka.Message{Value: []byte(body), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(key)}}}
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers), Topic: "orders", RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(context.Background(),
		order("o-1", `{"sku":"A-1","client_time":"12:00:00"}`),
		order("o-1", `{"sku":"A-1","client_time":"12:00:05"}`), // a retry
		order("o-2", `{"sku":"B-7","client_time":"12:00:09"}`),
	); err != nil {
		panic(err)
	}
	_ = w.Close()

	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers)})
	var results []sinks.Fetched // o-2's result comes after whatever the retry got
	for deadline := time.Now().Add(30 * time.Second); len(results) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			panic("no results within 30s")
		}
		results, _ = io.Read(context.Background(), "orders.results", 0, 0, 0)
	}
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	for _, r := range results {
		key, _ := sinks.HeaderValue(r.Headers, sinks.HeaderKey)
		fmt.Printf("result for %s: %s\n", key, r.Value)
	}
	// Output:
	// shipping o-1
	// shipping o-2
	// result for o-1: {"shipped":true}
	// result for o-2: {"shipped":true}
}
