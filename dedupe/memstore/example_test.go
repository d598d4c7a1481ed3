package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
)

// A test of a policy with the memory store: a first copy, a retry that
// differs only in a volatile field, and a reuse of the key with another
// body; then the key's entry, read as `idemstream inspect` reads it.
func ExampleNew() {
	keys, _ := dedupe.ParseKeyFormat("any")
	store := memstore.New()
	d, err := dedupe.NewDecider(dedupe.Policy{
		Pipeline:  "coupon-claim",
		Key:       dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "Idempotency-Key", Format: keys, MaxLength: 128},
		Semantics: dedupe.Strict, Window: 10 * time.Minute, Clock: dedupe.ClockStore,
		Rules:           dedupe.CanonicalRules{Volatile: []string{"/client_time"}},
		MaxPayloadBytes: 1 << 20, PendingTimeout: 30 * time.Second, FailedTTL: 10 * time.Minute,
	}, store)
	if err != nil {
		panic(err)
	}
	claim := func(offset int64, body string) dedupe.Record {
		return dedupe.Record{Topic: "claims", Offset: offset, Value: []byte(body),
			Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte("k-1")}}}
	}
	outs, err := d.Decide(context.Background(), "worker-1", []dedupe.Record{
		claim(0, `{"coupon":"SPRING24","amount":50,"client_time":"12:00:00"}`),
		claim(1, `{"coupon":"SPRING24","amount":50,"client_time":"12:00:07"}`),
		claim(2, `{"coupon":"SPRING24","amount":60,"client_time":"12:00:09"}`),
	}, nil)
	if err != nil {
		panic(err)
	}
	for _, o := range outs {
		fmt.Println(o.Kind)
	}

	entry, found, _ := store.Lookup(context.Background(), "coupon-claim", "k-1")
	fmt.Println(found, entry.State, entry.FirstSource)
	// Output:
	// first
	// replay
	// conflict
	// true PENDING claims/0/0
}
