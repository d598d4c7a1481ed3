// Package load holds the throughput and latency runs of idemstream against
// a strong kafka-go passthrough (./passthrough), on a real Kafka broker and
// a real redis-server, and the crash run (TestCrashLatency: what a member
// SIGKILLed and restarted costs, against the previous release's binary).
// They are benchmarks, not tests: they run only when asked
// (IDEMSTREAM_LOAD=1 for make load, IDEMSTREAM_LATENCY=1 for make latency,
// IDEMSTREAM_CRASH=1 for make crash-latency), print their figures, and fail only when a result is wrong
// (a key without exactly one result, a dead letter where none belongs) or
// a run does not finish in its time bound, never because it was slow.
//
// Both sides run as processes built from this tree (the real `idemstream
// run` and the passthrough binary), each timed from its start to the
// moment its group's committed offsets reach the input's end offsets, so
// start-up and group join count on both sides. The passthrough runs
// uncounted to warm the broker up (six times: its CPU per record falls
// to about a third over the first six or seven runs on a fresh broker), then before the
// first of
// IDEMSTREAM_LOAD_ROUNDS idemstream runs (make load LOAD_ROUNDS=N, 3 by
// default) and after each; every idemstream run is compared with the two
// around it, and the median of those ratios is the figure, since the
// machine's pace moves within minutes. The workload is the
// issue's: commands of about 1 KB keyed by a UUID idempotency key, 30 % of
// the keys sent twice with new volatile values (client_time, retry_count,
// trace_id, items/*/client_ts) and the unordered items array shuffled,
// decided under the strict policy.
//
// With IDEMSTREAM_LOAD_STREAMS=1 (make load LOAD_STREAMS=1) a third
// contender runs over the same backlog: ./streams/Dedup.java, the dedup a
// Kafka Streams user would write (a processor with a persistent RocksDB
// store of fingerprints, exactly_once_v2, the same volatile fields and
// unordered array), built by ./streams/streams.sh from Maven Central's
// kafka-streams with javac, timed the same way (its application.id is
// its group).
//
// With IDEMSTREAM_LOAD_PAYLOAD=avro (make load LOAD_PAYLOAD=avro) the same
// commands are also written in Avro, in the registry's wire format, to a
// backlog of their own (the same keys and headers; avro_test.go has the
// schema and the encoder), with a real schema registry
// (testenv.StartSchemaRegistry) holding their schema; after each round's
// JSON run an idemstream run with `payload: avro` and the same rules reads
// that backlog, so that JSON and Avro runs alternate in one run and each
// Avro run is compared with the JSON run just before it.
//
// The helpers that need no server (workload, percentiles, the INFO parser)
// are tested in every go test run.
package load
