package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
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
