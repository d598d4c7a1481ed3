// Command passthrough is the peer that the load and latency runs measure
// idemstream against: the strongest plain kafka-go forwarder we know how
// to write, so that the ratio says what idempotency costs and not how slow
// a naive loop is.
//
// It decides nothing. A fetching goroutine reads the input as a consumer
// group and hands batches of up to -batch records to a writing goroutine,
// which forwards them (key, value and headers as they are) with one
// kafka.Writer (acks=all, batches of -writer-batch, murmur2 partitioning
// like idemstream's results) and then commits the batch. Fetching goes on
// while a batch is written, so the broker round trips of the two overlap;
// the commit comes only after the write was acknowledged, as it must for
// at-least-once. The defaults are the fastest we found on a 2-core machine
// with a local broker: a BatchTimeout of 5 ms instead of 1 ms cost about a
// quarter of the rate (a synchronous write of a partial batch waits it
// out), and --batch 2000 or --overlap-commit (committing a batch while
// the next is written) made no difference that stood out of the noise.
//
//	passthrough --brokers HOST:PORT --input T --output T --group G
//
// With --volatile, --unordered or --redis it becomes a floor: a stage between the
// batcher and the writer fingerprints each record under those canonical
// rules, and with --redis also sets one entry of --entry-bytes per key
// with a pipelined SET NX (expiring after --ttl) and forwards only the
// records whose SET NX wrote. That is the least an idempotent consumer
// with one entry per key does (no comparison of a replay, no outcome, no
// completion, and a crash between a batch's SET NX and its write loses
// the batch), so the load run measures where idemstream's goals stand
// against work no design leaves out.
//
// SIGTERM or SIGINT stops it: the batch in hand is finished, the group is
// left, and it exits 0. A bad flag exits 2, a Kafka error 1.
package main
