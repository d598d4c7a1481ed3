// Package chaos holds the system-level chaos test of idemstream: real OS
// processes of `idemstream run` against a real, replicated Apache Kafka
// cluster and a real redis-server, disturbed the way production disturbs
// them while a backlog drains and more commands keep coming, and then
// judged from the topics alone.
//
// Every timing is at its default. The test sets no pending_timeout (30s,
// so a lease of 60s), no session timeout (10s) and no --settle-wait (45s,
// 1.5 × the cluster's replica.lag.time.max.ms). Shorter timings hide failures:
// with pending_timeout below the time a redelivery takes, a key left
// PENDING by an interrupted batch is taken over before anybody decides it
// on its stale state. The faults are sized against the defaults instead
// (a zombie is frozen for longer than the 60s lease).
//
// What TestChaos does:
//
//   - starts a private three-node KRaft cluster on loopback
//     (testenv.StartKafkaCluster, scripts/kafka-cluster.sh: replication
//     factor 3, min.insync.replicas=2, replica.lag.time.max.ms at its
//     default, about 15-25 s to start on two cores) and a private
//     redis-server with appendonly yes / appendfsync always; the single
//     broker of the other tests is not touched;
//   - builds the binary once (go build ./cmd/idemstream, without -race);
//   - produces a backlog first (12,000 keys, about 18,000 records in the
//     short variant): distinct UUID keys, about 35% with volatile-only
//     retries (only /client_time differs; some on another partition, some
//     with the key in upper case, some with the amount spelled 50.0 or
//     50e0, some with members reordered), about 3% with a conflicting copy
//     (another amount), and a few invalid records (malformed JSON, no key
//     header); then starts three `idemstream run` members in one group
//     over the six input partitions, each under an identity of its own
//     kept across its restarts (IDEMSTREAM_INSTANCE_ID=chaos-N: static
//     members, as a StatefulSet's pods; the cooperative-sticky assignor), and keeps streaming more keys of the
//     same mix (about 40 a second) while they work, until the rolling
//     restart below is over;
//   - a fourth member, dynamic, joins and leaves with SIGTERM every few
//     seconds until the faults are over (a rolling deploy, an autoscaler):
//     each leave must end with exit status 0 within 30s;
//   - SIGKILLs members (restarted about a second later), freezes a member
//     with SIGSTOP for longer than its lease and lets it continue (a
//     zombie whose keys were taken over meanwhile), SIGKILLs the broker
//     that leads an output partition while results are being appended to
//     it (its end offset moves between two looks; acks=all with two
//     replicas in sync, so writes of unknown outcome are real, not
//     simulated) and starts it again after a few seconds, and freezes
//     Redis for 3s once. A kill or a freeze picks, among the running
//     members, one that holds records in flight
//     (idemstream_inflight_records > 0), polling all of them for up to
//     45s (a rebalance after a kill can leave the whole group idle for a
//     session timeout and more); a leave waits for the joiner to hold
//     records in flight while it stays. A fault counts as mid-batch when
//     its target held records; a fault type that never landed mid-batch
//     (for a broker: during result writes) fails the test. The faults
//     come one at a time, in the order planned: each when its time has
//     come and every partition has committed since the last one ended
//     (see below). The load phase lasts until the last fault is over;
//     no fault starts after a cap, and a fault not injected fails the
//     test;
//   - once the faults are over, requires the group to commit everything
//     produced until then within what a crash can explain (lease + settle
//     wait + session timeout + 30s);
//   - then restarts the three members one by one with SIGTERM, each
//     successor joining before the next member goes, while the stream
//     goes on: no partition may stall (stay behind its end without its
//     committed offset moving) for more than 15s during this graceful
//     rolling restart; at no time may a partition stall for longer than
//     a crash can explain (lease + settle wait + session timeout + 30s;
//     see below);
//   - a member that exits by itself fails the test (CRASH, with its exit
//     status) and is started again a second later, as a supervisor would,
//     so that the run goes on proving what it can;
//   - waits until the group's committed offsets reach the end of every
//     input partition, stops the members with SIGTERM (each must exit 0);
//   - reads the input, output and DLQ topics in full and checks: every key
//     has exactly one result, none lost; the result's source is an input
//     record of that key with that value; every input record whose body
//     differs from the winner's (the result's) is in the DLQ as a conflict
//     whose first fingerprint is the winner's, every record with the winner's
//     body is not; every invalid record is in the DLQ with its reason; and
//     first + replay + conflict + invalid + failed = records in the input
//     topic, where first = distinct result sources, conflict/invalid/failed =
//     distinct DLQ sources by reason, replay = every other input record;
//   - prints what it injected (member kills and how many mid-batch, joins
//     and leaves, zombie pauses, broker kills and which node, Redis pauses,
//     the rolling restart and its longest stall) and the verdict (keys
//     lost, results duplicated, the identity). For a key it flags it logs
//     `idemstream inspect` (the stored state) and the instance log lines
//     that name it.
//
// Dead letters are written at least once: a DLQ write retried after an
// ambiguous error, or a batch read again after it was dropped (fenced),
// may append the same dead letter twice. The test counts dead letters by
// their idemstream-source (distinct sources), requires the copies of one
// source to agree on the reason, and reports how many duplicates it saw.
// Results, in contrast, must never be duplicated. The producer of the test
// retries until acknowledged, so an ambiguous produce may duplicate an
// input record; that copy is a replay, counted from the input topic.
//
// Two variants. `go test ./...` (make test) runs the short one: a
// backlog of 12,000 keys, faults planned over 5 minutes and run one at a
// time, which takes 7-10 (3 member kills, a zombie, a broker kill, a
// Redis pause; a join and a leave every few seconds meanwhile), then the
// recovery, the rolling restart and the drain; about 12-16 minutes on
// two loaded cores. The full one is `make
// chaos`:
//
//	IDEMSTREAM_REQUIRE_SERVERS=1 IDEMSTREAM_CHAOS=full go test -count=1 -race -run TestChaos -v -timeout 75m ./internal/chaos/
//
// (a backlog of 30,000 keys, about 45,000 records, faults planned over 14
// minutes, which takes 17-22, none started after 25: 8 member kills, 2
// zombies, 3 broker kills, a Redis pause).
// Other knobs: IDEMSTREAM_CHAOS_SEED=N replays a run's random choices (the
// seed is logged; the fault timing still depends on the machine), and
// IDEMSTREAM_CHAOS_LOGS=DIR keeps the instance logs, the config and a
// verification report in DIR instead of a temporary directory, and
// IDEMSTREAM_CHAOS_STORE=valkey puts the store on Valkey 8.1 (completions
// with SET … IFEQ; valkey-server on PATH, or the container path's image),
// and IDEMSTREAM_CHAOS_PREVIOUS=BIN runs the odd-numbered instances from
// another release's binary (a rolling upgrade in mid-course: build it
// with `git worktree add /tmp/prev REV && go build -C /tmp/prev -o
// /tmp/idemstream-prev ./cmd/idemstream`), and
// IDEMSTREAM_CHAOS_ENTRY_FORMAT=text|compact|mixed chooses the entries
// the instances write (mixed, the default: even slots compact, odd ones
// text; text with a previous release). `go test -short` skips the test.
//
// The liveness bounds judge each continuous stall of a partition. Faults
// that follow each other before the group has recovered add up into one
// stall, since each can leave keys PENDING for a lease of its own: a kill
// of the member that waits out a killed member's keys, or a broker kill
// or Redis freeze whose write or completion of unknown outcome is revoked
// by a rebalance during its settle wait. A full run with independent
// schedules had every partition stalled for 2m after a freeze and three
// kills within 70s, which no bound per fault can judge. So the faults
// come one at a time, and every stall must be shorter than what one
// crash can explain. Only the joins and leaves keep their own schedule:
// they are the background every fault lands in, as a deploy or an
// autoscaler would be.
package chaos
