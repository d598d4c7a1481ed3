package redisstore_test

import (
	"log"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
)

// A Store from a Redis URL (rediss:// for TLS; Options.Addrs for a Cluster,
// with MasterName for Sentinel). The client connects on first use; the
// store is what consumer.Options.Store takes.
func ExampleNew() {
	client, err := redisstore.NewClient(redisstore.Options{URL: "redis://localhost:6379/0"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	var store dedupe.Store = redisstore.New(client, "idem")
	_ = store
}
