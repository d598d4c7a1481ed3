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
//     about a second later, freezes Redis with SIGSTOP for 3 s once, and
//     restarts the broker once (internal/testenv/scripts/kafka.sh stop, then
//     start), but only when the scripts started that broker
//     (IDEMSTREAM_TESTENV_DIR is set and `kafka.sh status` names the broker
//     of IDEMSTREAM_TEST_KAFKA); otherwise the restart is skipped and logged;
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
// ambiguous error may append the same dead letter twice. The test counts
// dead letters by their idemstream-source (distinct sources), requires the
// copies of one source to agree on the reason, and reports how many
// duplicates it saw. Results, in contrast, must never be duplicated.
//
// Two variants. CI runs the short one as part of `go test ./...` (2,000
// keys, 40 s of load; about two minutes on 2 cores with -race, most of it
// waiting for rebalances). The full one is for the Makefile or by hand:
//
//	IDEMSTREAM_CHAOS=full go test -count=1 -run Chaos -v -timeout 30m ./internal/chaos/
//
// (10,000 keys, 3 minutes of load, more kills). With the real servers of
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
