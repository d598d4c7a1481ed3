// Package sinks writes what idemstream emits: result records on a
// pipeline's output topic, dead letters with their reason and evidence on
// its dlq topic, and replayed results on its replies topic, with the
// headers of docs/design.md ("The records it writes") (the Header* constants).
//
// # Reading what idemstream wrote
//
// A program downstream of a pipeline reads results and dead letters like
// any Kafka records; the headers say what happened, and [HeaderValue]
// reads them:
//
//	key, _ := sinks.HeaderValue(headers, sinks.HeaderKey)       // the idempotency key
//	reason, _ := sinks.HeaderValue(headers, sinks.HeaderReason) // on a dead letter: conflict, handler_failed, ...
//	why, _ := sinks.HeaderValue(headers, sinks.HeaderError)     // one readable sentence
//
// # Writing
//
// [Kafka] is the writer and reader the consumer uses (kafka-go's low-level
// Client: acks=all, offsets handed back, no blind retries of a write whose
// outcome is unknown). [JSONLines] prints the same records as JSON lines
// instead, for `idemstream run --sink stdout` while debugging; the
// published JSON Schemas (package schemas) describe those lines.
package sinks
