// Package consumer is the group runtime of idemstream: one consumer group
// member per pipeline ([Pipeline.Run]; package group, static membership
// and cooperative rebalancing on kafka-go's Client), partitions processed
// in parallel and each in order, records fetched in batches, decided by the
// dedupe package, handed to the [Handler] once per key per window, written
// by the sinks package, and committed only once every outcome below the
// committed offset is durable.
//
// # Using it as a library
//
// A team that wants its own handler (claim the coupon in its database, call
// its service) runs its configuration file with [NewService], which honours
// everything the file says, as `idemstream run` does: Kafka's TLS and SASL,
// the store (Redis standalone, Sentinel or Cluster, replica
// acknowledgement, the settings check), the rules of every pipeline:
//
//	cfg, err := schemas.Load("idemstream.yaml")
//	svc, err := consumer.NewService(cfg, consumer.ServiceOptions{
//		Handlers:   map[string]consumer.Handler{"coupon-claim": consumer.HandlerFunc(claimCoupon)},
//		Registerer: prometheus.DefaultRegisterer,
//	})
//	defer svc.Close()
//	err = svc.Run(ctx) // until ctx ends; svc.Ready(ctx) for a readiness probe
//
// The [Handler] runs once per key per window with the first copy of each
// request; what it returns is the result record. An error wrapped by
// [Permanent] dead-letters the record (handler_failed) and marks the key
// FAILED; any other error is retried while the partition waits. Start as
// many processes as you like: they share the group's partitions, and the
// store makes sure only one of them acts on a key. [NewPipeline] builds one
// pipeline from a policy written in code (plaintext Kafka); [New], from
// parts of your own (a Broker, a Decider).
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
//     input partition, and the record's own source) and the intent: the
//     output partition of the result (murmur2 of the result key, as Java
//     producers pick it; recorded once and never recomputed) and that
//     partition's floor.
//  3. Check, then recover. A strict mismatch against an entry made under
//     other rules would rerun a FAILED key or take a PENDING one over:
//     the store answers a conflict instead, the first copy is read back
//     and fingerprinted under the current rules, and only the same
//     request is decided again, the store told so (results.checkRules).
//     A resumed key (its own record delivered again, a released key, an
//     expired lease taken over) may have its result written already
//     (results.recover). Each intended partition is read once per batch,
//     from the lowest floor, for results whose idemstream-key is a wanted
//     key, whose idemstream-source names this pipeline's input and whose
//     idemstream-decision names the entry's decision (its first source
//     and window start: a takeover keeps it, a new window changes it).
//     Found: the key completes with that result and nothing is written.
//  4. Handle: the handler runs for the other first copies, in order.
//  5. Write (results.write): before every attempt the leases of the keys
//     about to be written must outlast SettleWait plus WriteTimeout; when
//     less may be left they are renewed (a renewal only extends a lease
//     its owner still holds: a key lost meanwhile fences the batch), and
//     the attempt must end by then. Requests are split by bytes and
//     compressed (kafka.compression). A result the broker refuses for its
//     size becomes a dead letter (payload_too_large) and its key FAILED;
//     a refusal of the topic itself (authorization, a missing topic)
//     stops the pipeline. A write of unknown outcome is never repeated
//     blindly: the partition waits SettleWait, scans, and writes only
//     what is missing.
//  6. Dead letters and replies are written (at least once). A dead letter
//     the broker refuses for its size is written again trimmed: its
//     payload halved down to none, then without the input's key and
//     headers; the reason, source, fingerprint and size stay
//     (internal/envelope.TrimDeadLetter). A reply is the stored result or nothing: one
//     too large is skipped and counted.
//  7. Complete (results.complete): SUCCESS with the result's offset, or
//     FAILED; only the owner token may.
//  8. Commit the offset after the batch; a failed commit is tried again
//     with backoff while the partition is owned.
//
// A batch that ends in an error is read again only when it was fenced
// (another owner took a key over) or met an error that may pass, after a
// pause that doubles up to 10 s. Any other error that ends a batch would
// end it again: the pipeline stops with the reason, and nothing past the
// batch is committed.
//
// Step 1 may need a schema registry (avro, protobuf and json_schema
// payloads, package decode). A registry that does not answer is never a
// record's fault: Prepare returns the error before any key is claimed, and
// the partition pauses as for a store that does not answer; a registry
// that refuses stops the pipeline. The same holds for the first copy a
// rules check reads back (Decider.SameRequestUnderCurrentRules).
//
// # Why step 7 writes once per key, not once per batch
//
// A batch could record its outcome once (one record naming the offsets of
// its results) and let every reader of a PENDING entry resolve it through
// that record. Such a design must answer four questions; the answers found
// so far are why step 7 stays one compare-and-set per key (a WATCH
// transaction, or SET … IFEQ where the server has it):
//
//   - Fencing a stale owner: a batch record written by an owner whose lease
//     expired must not resolve the keys its successor took over. So each
//     entry must name the attempt that holds it, and every resume and
//     takeover writes the new attempt into the entry: a write per key in
//     the very cases that matter.
//   - Redis Cluster: an entry and its batch's record sit in different
//     slots, so no script or transaction sees both; a reader resolves the
//     entry with a second read, and a compare must be on the entry alone.
//   - Lifetime: an entry never rewritten keeps its PENDING expiry, a day
//     past its lease, so the batch record must live as long, and Redis
//     would hold 144 times the entries it holds today at a 10-minute
//     window. Bringing each expiry down is the per-key write again. Moving
//     the day of retention to a per-partition ledger fails a rule of its
//     own: copies on other partitions decided hours late must resume, not
//     start anew (storetest PendingPastItsWindowIsResumedNotNew).
//   - Rolling deploy: a release before reads a resolved entry as PENDING
//     for a day, so after the window it would take the old key over, find
//     the old result and leave a new request unhandled. The new format
//     would need a release that reads it before any release writes it.
//
// docs/design.md gives the two shapes in full, what the per-key
// completion costs (measured by skipping it, Redis's CPU per record
// halves, on Valkey it falls by a third, and the consumer's falls by a
// tenth to a fifth), and a later shape that keeps the attempt inside the
// Redis store, with its measured cost and the ordered list of what a
// review found it must hold before it is built.
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
//	after 7, before 8               SUCCESS (or FAILED)       its own record: a replay; another
//	                                                          copy: a replay (or a conflict)
//	a stale owner completes         another owner's token     refused (fenced): no commit
//	outage longer than the window   PENDING (kept past its    owner completes; others resume and
//	                                window)                   scan, never decide it new
//
// A revoked partition stops fetching at once and gives the batch in hand
// DrainTimeout (half the session timeout, below the rebalance timeout) to
// finish and commit; the member gives the partition up (under the eager
// range protocol: joins again; under cooperative-sticky: joins the second
// round) only once it returns. A lost partition (the group went on
// without this member, or another process took its instance id) stops at
// once and commits nothing. What does
// not finish is abandoned by stage (results.abandon): keys whose result was
// acknowledged or found are completed and kept for at least
// dedupe.PendingRetention (their records will be read again, maybe only
// once a stopped pipeline starts again, and must then be replays), keys
// whose dead letter was written are completed FAILED, keys for which
// nothing was sent are
// released (their lease ends now, their intent stays), keys with a write of
// unknown outcome are left to their lease. So a rolling restart stalls a
// partition for at most the drain time, and a crash stalls the keys it held
// for at most the lease.
//
// A member restarted under its identity (kafka.instance_id: a container
// killed and restarted in its pod) gets its partitions back at once,
// without a rebalance, but not the keys its previous incarnation left
// PENDING: their records wait for the lease, as at any other next owner.
// Static membership assumes one process per identity, and Kafka fences
// the older of two; but even a process certainly dead may have sent a
// result write whose outcome is unknown, and a record the leader appended
// can become visible up to SettleWait later (replica.lag.time.max.ms), so
// a scan made sooner could miss it and write a second result. Only the
// lease, which outlasts SettleWait plus a write, bounds that. So a crash
// in the middle of a batch still costs that batch's keys (and the
// partition behind them) up to the lease; a crash between batches costs
// nothing but the restart. TestRestartedIdentityWaitsForItsPredecessorsLease.
//
// A batch runs the protocol in two phases: first for everything the store
// decides at once (above all the first copies it now owns), then for the
// records whose key another holder owns, which wait. So two batches that
// each hold a key the other waits for (records of one key on two
// partitions) finish their own keys first and never wait each other out;
// the records before the first that waits are committed between the
// phases, the rest after the second; if the second phase is abandoned,
// the first phase's keys after the first that waits are kept as long as
// an abandoned batch's. A waiting record polls with
// backoff up to pending_timeout, then is decided on the stored state (a
// replay, or a conflict) and committed: the owner's own record, still
// uncommitted, gives the key its result. A record that is its PENDING
// entry's own source never does that: it waits for the lease, whatever
// pending_timeout says.
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
//     concerned waits, and only after such a write. TestAmbiguousWriteIsNotRepeated and
//     TestAmbiguousWriteSettlesEitherWay (appended late, or never); the chaos
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
//     Acknowledgement by a replica holds only while no failover promotes a
//     replica that never synced: Sentinel's choice does not look at that,
//     so a node that comes back empty must not be promotable (replica-
//     priority 0, or persistence) and down-after-milliseconds must outlast
//     any stall (docs/operations.md, "A master without persistence";
//     TestSentinelFailoverKeepsDecisionsWithReplicaAcks, whose CI run lost
//     2,400 decisions to such a second failover before it set both).
//   - A store that loses its data as a whole (FLUSHALL, a restart without
//     persistence, an empty replica promoted, a Cluster node restored
//     empty) is noticed, not trusted: every round trip that decides or
//     completes reads the store's generation marker behind its writes, and
//     one that does not read it back fails with dedupe.ErrStoreForgot,
//     which pauses every partition until an operator accepts the loss or
//     the longest window has passed (redisstore, "A store that forgot").
//     A loss while no member of this release runs, or of the last writes
//     only, is not seen. TestRunStopsDecidingAfter* (cmd/idemstream) on
//     the real broker with a standalone, a Sentinel and a Cluster store.
//   - A PENDING entry is kept dedupe.PendingRetention (a day) past its lease:
//     a group stopped for longer and its records then read again may decide
//     such a key first without a scan. storetest PendingOutlivesItsWindow
//     and PendingIsForgottenADayAfterItsLease.
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
//   - A scan takes a result for a key's only when it names the entry's
//     decision (idemstream-decision), so a result of the key's previous
//     window in the scanned stretch never passes for this one's.
//     TestRecoveryScanMatchesTheDecision. A result written by a release
//     before this header is matched by key and source topic, as that
//     release did (TestRecoveryScanFindsItsOwnAndLegacyResults): during a
//     rolling deploy the window edge, a wait and an abandon must then
//     meet for it to take the wrong one.
//   - Completed records are committed within the window. A batch commits
//     what it finished before it waits for keys held elsewhere
//     (TestBatchCommitsWhatIsCompleteBeforeItWaits) and keeps those it
//     finished after the first that waits a day if the wait is abandoned
//     (TestRecordsAfterAnAbandonedWaitAreKeptLonger), a failed commit is tried again
//     (TestFailedCommitIsRetried), and an abandoned batch's completed keys
//     are kept a day (TestStoppedBatchKeepsItsCompletedKeysPastTheWindow).
//     A start at "latest" or at a time is committed once resolved
//     (TestStartAtLatestIsResolvedOnce). What remains:
//     a crash between a completion and its commit, followed by an outage
//     longer than the window (a day for an abandoned batch), decides those
//     records first again once their entries expired.
//   - No record is too large to end: one that cannot be passed on as it
//     came gets one trimmed dead letter; only a topic that refuses even
//     the idemstream headers alone stops the pipeline.
//     TestRecordsTooLargeToPassOnGetOneOutcomeEach, and against the real
//     broker TestPoisonRecordsOnTheRealBroker (cmd/idemstream).
//   - A record whose own decision failed is a replay when it comes again
//     (its entry's owner or first source), and a batch that ends early
//     completes FAILED every key whose dead letter may have been appended:
//     so its input does not get a result besides its dead letter.
//     TestFailedRecordDeliveredAgainIsAReplay,
//     TestAbandonedBatchKeepsItsDeadLetteredKeysFailed,
//     TestAcknowledgedDeadLetterKeepsItsKeyFailed. What remains: a FAILED
//     entry lives failed_ttl, so a record read again after longer (a
//     stopped pipeline) is decided anew; a kill between a dead letter and
//     its completion leaves the key PENDING, and its record, resumed after
//     the lease, runs the handler again (as a result's may, above); a
//     FAILED key's rerun by another copy that is then released lets the
//     first copy take it over. A conflict or replay whose record is read
//     again after its key's window ended is decided anew like any other.
//     And the first-source rule makes a first copy whose decision was taken
//     over, then failed, a replay rather than a rerun (no second result,
//     but no rerun for that copy).
//   - A pipeline's identity (input, output, group, store namespace, key
//     rule) is what its entries were made under: results carry it
//     (idemstream-pipeline), and a pipeline whose output's latest results
//     name another refuses to start unless accept_identity names it, since
//     it would decide again every command whose entry it cannot see.
//     TestChangedIdentityRefusesToStart. A new group starts where
//     pipelines[].start says (earliest by default).
//     TestNewGroupStartsWhereConfigured.
//   - Counting: a crash between steps 7 and 8 counts a record as first in
//     the process that died and as a replay in the next; the topics, not
//     the counters, are the record of what happened.
//   - Dead letters and replies are written at least once: after an
//     ambiguous write they may appear twice, with the same
//     idemstream-source. Replays whose result is still PENDING elsewhere,
//     failed or gone get no reply, counted in
//     idemstream_replies_skipped_total. TestSkippedRepliesAreCounted.
//   - A topic that disappears while the pipeline runs pauses the partitions
//     that write to it (not ready, the store alert) and nothing past them
//     is committed; once it is back they resume. TestTopicDeletedWhileRunning.
//     One missing at start stops the pipeline after 30 s.
//     TestMissingTopicRefusesToStart.
package consumer
