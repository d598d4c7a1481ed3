// Package consumer is the group runtime of idemstream: one kafka-go
// consumer group member per pipeline ([Pipeline.Run]), partitions processed
// in parallel and each in order, records fetched in batches, decided by the
// dedupe package, handed to the [Handler] once per key per window, written
// by the sinks package, and committed only once every outcome below the
// committed offset is durable.
//
// Two files hold it: batch.go is the batch loop (run the handler, dead
// letters, replies, metrics); protocol.go is the result protocol, the
// steps below, which alone make a result exactly-once.
//
// # The result protocol of one batch
//
//  1. Floors: read the end offset of every output partition.
//  2. Decide (results.decide): the store decides every record. For each
//     first copy it keeps, atomically with the PENDING state, the owner
//     token (instance, generation, the partition's run in this process,
//     input partition, and the record's own source) and the intent: the output partition of the result (murmur2
//     of the result key, as Java producers pick it; recorded once and never
//     recomputed) and that partition's floor.
//  3. Recover (results.recover): a resumed key (its own record delivered
//     again, a released key, an expired lease taken over) may have its
//     result written already. Each intended partition is read once per
//     batch, from the lowest floor, for results whose idemstream-key is a
//     wanted key and whose idemstream-source names this pipeline's input.
//     Found: the key completes with that result and nothing is written.
//  4. Handle: the handler runs for the other first copies, in order.
//  5. Write (results.write): before every attempt the leases of the keys
//     about to be written must outlast SettleWait plus WriteTimeout; when
//     less may be left they are renewed (a renewal only extends a lease
//     its owner still holds: a key lost meanwhile fences the batch), and
//     the attempt must end by then. Requests are split by bytes. A result the broker refuses for
//     its size becomes a dead letter (payload_too_large) and its key
//     FAILED; a refusal of the topic itself (authorization, a missing
//     topic) stops the pipeline. A write of unknown outcome is never
//     repeated blindly: the partition waits SettleWait, scans, and writes
//     only what is missing.
//  6. Dead letters and replies are written (at least once).
//  7. Complete (results.complete): SUCCESS with the result's offset, or
//     FAILED; only the owner token may.
//  8. Commit the offset after the batch.
//
// # Where it can stop, and what the next owner finds
//
//	stops                           next owner finds          does
//	before 2                        nothing                   decides normally
//	revoked between 2 and 5         PENDING, lease released   resumes at once, scans, writes
//	  (rebalance, SIGTERM: the batch gets DrainTimeout to finish first)
//	killed between 2 and 5          PENDING, lease running    its own record waits for the
//	                                                          lease (never a replay), resumes,
//	                                                          scans, writes
//	write sent, outcome unknown     PENDING, lease running    same owner: settle, scan, write
//	                                                          what is missing; others: as above
//	after the write is acked        PENDING                   resumes, scans, finds it, completes
//	after 7, before 8               SUCCESS                   a replay (or a conflict)
//	a stale owner completes         another owner's token     refused (fenced): no commit
//	outage longer than the window   PENDING (kept past its    owner completes; others resume and
//	                                window)                   scan, never decide it new
//
// A revoked member stops fetching at once and gives the batch in hand
// DrainTimeout (half the session timeout, below the rebalance timeout) to
// finish and commit; kafka-go does not rejoin before it returns. What does
// not finish is abandoned by stage (results.abandon): keys whose result was
// acknowledged or found are completed, keys for which nothing was sent are
// released (their lease ends now, their intent stays), keys with a write of
// unknown outcome are left to their lease. So a rolling restart stalls a
// partition for at most the drain time, and a crash stalls the keys it held
// for at most the lease.
//
// Other records of a key PENDING elsewhere wait with backoff up to
// pending_timeout, then are decided on the stored state (a replay, or a
// conflict) and committed: the owner's own record, still uncommitted, gives
// the key its result. A record that is its PENDING entry's own source
// never does that: it waits for the lease, whatever pending_timeout says.
//
// When the rules change inside a window, a copy whose fingerprint differs
// from one made under the old rules is settled by reading the first copy
// back from its source and fingerprinting it under the current rules:
// equal, a replay; different, a conflict.
//
// # Assumptions that remain, and the tests that cover them
//
//   - A write of unknown outcome settles within SettleWait (--settle-wait,
//     45s by default): at least 1.5 × the brokers' replica.lag.time.max.ms,
//     the longest a leader may hold an appended record back while it drops
//     a lagging follower from the ISR. Every produce error that a broker
//     may return after appending (NOT_LEADER_OR_FOLLOWER during a leader
//     move among them) counts as of unknown outcome. Only the partition
//     concerned waits, and only after such a write. TestAmbiguousWriteIsNotRepeated; the chaos
//     test kills the leader of an output partition of a three-broker
//     cluster (internal/chaos).
//   - The lease (twice pending_timeout) outlasts a write plus SettleWait:
//     `idemstream run` refuses a lease shorter than --settle-wait plus 10s.
//     A pause longer than the lease between a renewal and its write (a
//     frozen VM) is the known limit of any lease: owner tokens keep the
//     state right, and the scan finds every write that became visible
//     before it. The chaos test freezes a member for longer than its lease.
//   - Leases run on the store's clock, the owner measures them on its own
//     monotonic clock from before the call that set them: a step of the
//     store's clock (an NTP correction, a failover to a replica whose clock
//     is ahead) shortens every lease by the step, like a pause.
//   - Redis keeps every acknowledged write (appendonly yes, appendfsync
//     always, or acknowledgement by replicas). A store that forgets an entry
//     forgets that the key was seen. redisstore's durability tests.
//   - A PENDING entry is kept dedupe.PendingRetention (a day) past its lease:
//     a group stopped for longer and its records then read again may decide
//     such a key first without a scan. storetest PendingOutlivesItsWindow.
//   - Each pipeline has its own output topic (config refuses a shared one):
//     the scan tells this pipeline's results by their source topic.
//     TestRecoveryScanStartsAtTheLogStartAndReadsOnce.
//   - The output partitions a floor names are kept long enough to scan;
//     records deleted below a floor (retention, DeleteRecords) cannot be
//     found: the scan starts at the log start and counts it
//     (idemstream_scan_floor_truncated_total).
//   - The handler may run again for a key after a crash or a revocation
//     between steps 4 and 7: it must be idempotent, or its effect must be
//     the result record itself (the default handler forwards the command).
//     TestRevokedBatchReleasesItsKeys.
//   - A scan matches a result by key and source topic from the entry's
//     floor, which is read before the batch is decided (shared by the
//     batches of a fetch for at most two seconds). A key whose window ends
//     while its record waits for another owner (up to pending_timeout)
//     and is then decided new, with that older floor, could take the
//     previous window's result for its own if its batch is then abandoned
//     before it writes. The window edge, a wait and an abandon must meet.
//   - Counting: a crash between steps 7 and 8 counts a record as first in
//     the process that died and as a replay in the next; the topics, not
//     the counters, are the record of what happened.
//   - Dead letters and replies are written at least once: after an
//     ambiguous write they may appear twice, with the same
//     idemstream-source. Replays whose result is still PENDING elsewhere,
//     failed or gone get no reply, counted in
//     idemstream_replies_skipped_total. TestSkippedRepliesAreCounted.
//   - A topic that disappears while the pipeline runs pauses the partitions
//     that write to it (not ready, the store alert); one missing at start
//     stops the pipeline after 30 s. TestMissingTopicRefusesToStart.
package consumer
