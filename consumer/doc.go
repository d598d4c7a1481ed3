// Package consumer is the group runtime of idemstream: it joins one Kafka
// consumer group per pipeline, fetches records in batches, has them decided
// by the dedupe package, hands first copies to the handler, writes results,
// replies and dead letters through the sinks package, and commits an offset
// only once every outcome below it is durable.
//
// This version of the package holds no runtime yet: `idemstream run`
// validates its configuration and says so instead of pretending to consume.
package consumer
