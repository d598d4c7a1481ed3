// Package chaos holds the system-level chaos test of idemstream: real OS
// processes of `idemstream run` against the real Kafka broker and a real
// redis-server, killed and disturbed while a stream of commands flows, and
// then judged from the topics alone.
//
// What TestChaos does:
//
//   - builds the binary once (go build ./cmd/idemstream, without -race) and
//     starts three `idemstream run` processes in one consumer group over a
//     six-partition input topic, each with its own metrics port and a log
//     file per instance;
//   - uses a private redis-server with appendonly yes / appendfsync always;
//   - produces a steady stream: N distinct UUID keys sent once each, plus
//     volatile-only retries (only /client_time differs; some on another
//     partition, some with the key in upper case, some with the amount
//     spelled 5e1 or 50.0), about 3% conflicting copies (another amount),
//     and a few invalid records (malformed JSON, no key header); the
//     producer retries until acknowledged, so an ambiguous produce may
//     duplicate an input record (a replay, counted from the input topic);
//   - meanwhile SIGKILLs a random instance every few seconds and restarts it
//     about a second later (every other kill first waits for a Stable group,
//     so that it lands in the middle of batches), freezes Redis with SIGSTOP
//     for 3 s once, and restarts the broker once (kafka.sh stop, 2 s down,
//     kafka.sh start: same port, same data);
//   - the broker it restarts is its own: when the servers were started by
//     internal/testenv/scripts (IDEMSTREAM_TESTENV_DIR names their state and
//     holds the broker's jars), the test starts a private broker with
//     `kafka.sh up` in a temporary state directory (a few seconds) and stops
//     it at the end, because `go test ./...` runs packages in parallel and a
//     restart of the shared broker would break other packages' tests.
//     Without IDEMSTREAM_TESTENV_DIR it uses IDEMSTREAM_TEST_KAFKA and skips
//     the restart, saying so in the log;
//   - after the Redis pause and after the broker restart, holds the kills
//     until the group has committed everything produced before the fault
//     ended: a partition that stalls without a rebalance to rescue it fails
//     the test (liveness);
//   - waits until the group's committed offsets reach the end of every
//     input partition, stops the instances with SIGTERM (each must exit 0);
//   - reads the input, output and DLQ topics in full and checks: every key
//     has exactly one result, none lost; the result's source is an input
//     record of that key with that value; every input record whose body
//     differs from the winner's (the result's) is in the DLQ as a conflict
//     whose first fingerprint is the winner's, every record with the winner's
//     body is not; every invalid record is in the DLQ with its reason; and
//     first + replay + conflict + invalid + failed = records in the input
//     topic, where first = distinct result sources, conflict/invalid/failed =
//     distinct DLQ sources by reason, replay = every other input record.
//
// Dead letters are written at least once: a DLQ write retried after an
// ambiguous error, or a batch read again after it was dropped (fenced),
// may append the same dead letter twice. The test counts
// dead letters by their idemstream-source (distinct sources), requires the
// copies of one source to agree on the reason, and reports how many
// duplicates it saw. Results, in contrast, must never be duplicated.
//
// Two variants. CI runs the short one as part of `go test ./...` (2,000
// keys, 75 s of load, about 8 kills; under two minutes on 2 cores with
// -race, much of it waiting for rebalances: a SIGKILLed member holds its
// partitions until its 10 s session times out). The full one is for the
// Makefile or by hand:
//
//	IDEMSTREAM_CHAOS=full go test -count=1 -run Chaos -v -timeout 30m ./internal/chaos/
//
// (10,000 keys, 4 minutes of load, a kill every 2–5 s). With the real servers of
// the test suite, from the module root:
//
//	bash -c 'source internal/testenv/scripts/servers.sh; servers_start; export IDEMSTREAM_REQUIRE_SERVERS=1; IDEMSTREAM_CHAOS=full go test -count=1 -race -run Chaos -v -timeout 30m ./internal/chaos/; servers_stop'
//
// Other knobs: IDEMSTREAM_CHAOS_SEED=N replays a run's random choices (the
// seed is logged; the fault timing still depends on the machine), and
// IDEMSTREAM_CHAOS_LOGS=DIR keeps the instance logs, the config and a
// verification report in DIR instead of a temporary directory. `go test
// -short` skips the test.
package chaos
