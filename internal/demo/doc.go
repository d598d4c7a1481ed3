// Package demo replays the coupon incident behind
// idemstream, on an in-process Kafka-protocol broker (franz-go's kfake)
// and the memory store, through the real code path: kafka-go consumer
// groups, the dedupe decider, the sinks, the consumer runtime.
//
// Two pipelines read the same commands side by side. The naive one is the
// backend of the incident: its idempotency identity is the key plus a hash
// of the raw body (the producer puts both in the Kafka record key), so a
// retry whose client_time changed is a new request and claims another
// coupon. The idemstream one applies the incident's rules: strict
// semantics, client_time, retry_count and trace_id volatile, the items
// list unordered. A coupon desk handler, one per pipeline, issues coupons
// from a stock of 500; a coupon is non-stackable, so every coupon a user
// gets beyond the first is money lost.
package demo
