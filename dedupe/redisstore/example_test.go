package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
)

// A Store from a Redis URL (rediss:// for TLS; Options.Addrs for a Cluster,
// with MasterName for Sentinel). The client connects on first use; the
// store is what consumer.Options.Store takes. Here the server is an
// in-process fake; in production it is a Redis that keeps every write
// (appendonly, or replicas that acknowledge).
func ExampleNew() {
	server, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer server.Close()

	client, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + server.Addr() + "/0"})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	store := redisstore.New(client, "idem")

	keys, _ := dedupe.ParseKeyFormat("any")
	d, err := dedupe.NewDecider(dedupe.Policy{
		Pipeline: "orders", Semantics: dedupe.Strict, Window: 10 * time.Minute, Clock: dedupe.ClockStore,
		Key:             dedupe.KeySpec{From: dedupe.KeyFromMessageKey, Format: keys, MaxLength: 128},
		MaxPayloadBytes: 1 << 20, PendingTimeout: 30 * time.Second, FailedTTL: 10 * time.Minute,
	}, store)
	if err != nil {
		panic(err)
	}
	order := dedupe.Record{Topic: "orders", Offset: 7, Key: []byte("o-1"), Value: []byte(`{"sku":"A-1"}`)}
	outs, err := d.Decide(context.Background(), "worker-1", []dedupe.Record{order}, nil)
	if err != nil {
		panic(err)
	}
	entry, _, _ := store.Lookup(context.Background(), "orders", "o-1")
	fmt.Println(outs[0].Kind, entry.State, entry.FirstSource)
	// Output:
	// first PENDING orders/0/7
}
