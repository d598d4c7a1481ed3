// Package group is idemstream's consumer group member: one member of one
// group on one topic, built on kafka-go's low-level Client, with static
// membership (KIP-345) and cooperative rebalancing (KIP-429), which
// kafka-go's Reader and ConsumerGroup offer neither of.
//
// # Using it
//
// A [Handler] is told what the member owns; [Member.Run] keeps the member
// in the group until its context ends; [Member.Commit] commits offsets
// under the generation in force:
//
//	m, err := group.New(group.Config{Group: "orders", Topic: "orders", Client: client,
//		InstanceID: os.Getenv("POD_NAME")}, handler)
//	err = m.Run(ctx) // Assigned, Revoked and Lost are called from here
//
// # The protocol, step by step
//
//  1. Join (JoinGroup). The member offers cooperative-sticky and range
//     (or range alone), each with its subscription: version 1 of the
//     consumer protocol with the partitions it owns under
//     cooperative-sticky, version 0 under range, which every kafka-go
//     member reads. The broker picks the protocol all members offer, by
//     their votes: range while any member of the previous release (eager,
//     range only) is in the group, cooperative-sticky once none is. A
//     first join is answered MEMBER_ID_REQUIRED with the id to join
//     with (KIP-394), and made again with it. A static member joins with
//     its instance id, and the broker gives it its old place.
//  2. Assign (the leader only). The leader reads the topic's partition
//     count and plans: [AssignRange] under range; under cooperative-sticky
//     [AssignCooperativeSticky], which keeps each member's owned
//     partitions up to its share, balances the rest, and holds back every
//     partition that would move away from a member that still owns it.
//  3. Sync (SyncGroup). Each member gets its assignment. What it owned and
//     is not assigned is revoked ([Handler.Revoked] returns once that
//     work is committed or given up); what is new is read from the
//     group's committed offsets (OffsetFetch) and handed over
//     ([Handler.Assigned]). Under cooperative-sticky a member that
//     revoked anything joins again at once: the second round, in which
//     the held-back partitions, owned by nobody now, go to their new
//     owners. Partitions that stay are never stopped.
//  4. Heartbeat, every HeartbeatInterval, to the coordinator (kafka-go
//     routes every group request there except Heartbeat, which names no
//     group: the member finds the coordinator itself). REBALANCE_IN_PROGRESS
//     sends the member back to step 1: under range it first revokes
//     everything (the eager protocol: nothing is kept across a join);
//     under cooperative-sticky it keeps processing and committing while it
//     joins. The leader also rejoins when the partition count changes.
//  5. Commit (OffsetCommit) with generation, member id and instance id,
//     for partitions the member owns only. A commit that meets the end of
//     its generation (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION) waits for
//     the next one and is sent again if the partition is still owned;
//     otherwise it fails with [ErrNotOwned].
//  6. Stop. When Run's context ends the member revokes everything, and a
//     dynamic member leaves the group (LeaveGroup), so that its
//     partitions move at once. A static member does not (KIP-345): its
//     restart under the same id takes them back without a rebalance, and
//     until its session ends they wait for it; with LeaveOnStop it leaves
//     too, naming its instance id (an identity that will not come back).
//     A process that dies sends nothing either way.
//
// # When the member is not what it thought
//
// UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION from a heartbeat means the group
// has gone on without the member; so, for the member's own purposes, does
// no answer from the coordinator for its session less a heartbeat
// interval (counted from the sending of its last answered heartbeat, join
// or sync, so that it comes before the broker's own deadline; a JoinGroup
// waiting at the broker keeps the member). Either ends the membership's
// context at once, from the heartbeat goroutine, whatever the join loop is
// doing: the partitions' work stops, commits nothing more, the Handler is
// told (Lost), and the member joins anew. FENCED_INSTANCE_ID means another
// process joined under this member's instance id: its partitions are lost
// and Run returns [ErrFenced]. Static membership assumes one process per
// instance id, which a container restarted in its pod (or a StatefulSet's
// pod) gives; two processes under one id fence each other, and the one
// fenced stops.
//
// # Two kafka-go defects it works around
//
// kafka-go v0.4.51 reads the Heartbeat response of versions 1 and later
// with its fields out of order (segmentio/kafka-go#1371): the error code
// lands in the throttle time. heartbeatError reads it from there, and
// TestHeartbeatErrorsAreRead fails if a kafka-go that reads it right
// arrives. And its Client.JoinGroup and Client.SyncGroup decode every
// subscription and assignment as version 1 of the consumer protocol,
// failing on the version 0 that kafka-go's own ConsumerGroup sends; the
// member sends both requests through the protocol package and reads the
// consumer protocol itself (wire.go), every version.
package group
