// Package consumer is the group runtime of idemstream: one kafka-go
// consumer group member per pipeline ([Pipeline.Run]), partitions processed
// in parallel and each in order, records fetched in batches, decided by the
// dedupe package, handed to the [Handler] once per key per window, written
// by the sinks package, and committed only once every outcome below the
// committed offset is durable.
//
// # Using it as a library
//
// A team that wants its own handler (claim the coupon in its database, call
// its service) imports this package and dedupe, and wires a pipeline with
// [NewPipeline]:
//
//	p, err := consumer.NewPipeline(consumer.Options{
//		Brokers: []string{"kafka:9092"},
//		Policy:  pol,   // dedupe.Policy, e.g. from the configuration file (schemas.Config.Policy)
//		Store:   store, // redisstore.New(client, "idem"), or memstore.New() in one process
//		Handler: consumer.HandlerFunc(claimCoupon),
//		Input:   "coupon.claim.commands", Output: "coupon.claim.results", DLQ: "coupon.claim.dlq",
//	})
//	err = p.Run(ctx) // until ctx ends
//
// The [Handler] runs once per key per window with the first copy of each
// request; what it returns is the result record. An error wrapped by
// [Permanent] dead-letters the record (handler_failed) and marks the key
// FAILED; any other error is retried while the partition waits. Start as
// many processes as you like: they share the group's partitions, and the
// store makes sure only one of them acts on a key. For TLS or SASL, a
// Broker of your own, build a [Config] and call [New].
//
// # One batch
//
//  1. Fetch up to BatchSize records of a partition (kafka-go Client.Fetch).
//  2. Read the end offset of every output partition: the floors.
//  3. Decide the batch in the store. For every first copy the store keeps,
//     atomically with the PENDING state, the owner token and the intent:
//     the output partition of the result (murmur2 of the result key, as
//     Java producers pick it) and that partition's floor.
//  4. Run the handler for the first copies, in order.
//  5. Write results to their intended partitions, dead letters and replies
//     (kafka-go Client.Produce, acks=all, offsets handed back).
//  6. Renew the leases of the keys about to get a result (before step 5's
//     result writes), then complete the keys in the store (SUCCESS with
//     the result's offset, or FAILED): only the owner token may.
//  7. Commit the offset after the batch.
//
// # Exactly one result per key without Kafka transactions
//
// kafka-go has no idempotent or transactional producer, so "written once"
// comes from the store and from reading our own output back:
//
//   - Crash before step 5: the key is PENDING under a lease. The record was
//     not committed, so it is delivered again; whoever gets it finds the
//     PENDING entry (its own token: resumed; another's with the lease over:
//     taken over with a new token, the old intent kept) and scans the
//     intended partition from the recorded floor for a record whose
//     idemstream-key header is the key. Found: complete with it, write
//     nothing. Not found: run the handler and write.
//   - Write whose outcome is unknown (timeout, connection cut after the
//     request was sent): nothing is retried blindly. The partition pauses
//     for SettleWait (the time an appended record may take to become
//     visible), scans from the floor, and writes only what is missing.
//   - Crash after step 5, before step 6: the same as the first case; the
//     scan finds the result and completes without writing.
//   - Crash after step 6, before step 7: the redelivered records find
//     SUCCESS and are replays (or conflicts): no second result.
//   - A stale owner (paused by GC, partition revoked, kafka-go delivering
//     records of a revoked partition, #1398) that tries to complete is
//     refused by the owner token; it drops the batch without committing.
//     A late commit from an old member that moves an offset backwards
//     (#1308) only causes redelivery, which the store decides as replays.
//   - Another record of the same key on another partition while the key is
//     PENDING waits with backoff up to pending_timeout, then decides on
//     the stored state or takes the expired lease over, as above.
//   - Store unreachable: nothing is decided, written or committed; the
//     partition pauses and /readyz reports not ready until it answers.
//
// Residual assumptions, which an operator must make hold:
//
//   - A write of unknown outcome settles within SettleWait (the --settle-wait
//     flag, 30s by default): on a replicated topic, set it to at least the
//     brokers' replica.lag.time.max.ms. Only the partition concerned waits,
//     and only after an ambiguous write.
//   - The lease is twice pending_timeout. A waiter gives up after
//     pending_timeout and decides on the stored state (a replay, or a
//     conflict), so it never takes a live owner's key; and an owner renews
//     the leases of its batch just before it writes results (Decider.Renew),
//     writing nothing for a key it lost. After a renewal a full lease
//     remains: `idemstream run` refuses to start when it is shorter than
//     --settle-wait plus 10s for a write, so a successor cannot scan before
//     the owner's write is visible. A pause longer than the lease (a frozen
//     VM between renewal and write) is the known limit of any lease: the
//     owner tokens still keep the state right.
//   - Redis persists every acknowledged write (appendonly yes, appendfsync
//     always, or WAIT on replicas). A store that forgets a SUCCESS entry
//     forgets that the key was seen.
//   - The output topic keeps its partition count during a window: the
//     intended partition is computed from it.
//   - The handler may run again for a key after a crash between step 4 and
//     step 6: it must be idempotent, or its effect must be the result
//     record itself (the default handler forwards the command).
//   - Dead letters and replies are written at least once: after an
//     ambiguous write they may appear twice, with the same idemstream-source.
package consumer
