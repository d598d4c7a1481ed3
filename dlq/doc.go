// Package dlq operates a pipeline's dead-letter topic: it counts what the
// topic holds (Summarize), explains one dead letter (Inspector.Show), and
// sends the dead letters that can end otherwise back to the pipeline's
// input (Redriver). `idemstream dlq summary|show|redrive` is built on it;
// docs/dlq.md is the operator's guide.
//
// # Reading a dead letter
//
// idemstream writes a dead letter as the input record byte for byte (key,
// value, headers) followed by its evidence, headers that start with
// idemstream-reason (sinks.HeaderReason). [Parse] splits the two:
//
//	d := dlq.Parse(&rec) // rec read from the dead-letter topic
//	d.Reason             // conflict, malformed_payload, handler_failed, ...
//	d.Source             // the input record: topic/partition/offset
//	key, value, headers := d.Original() // what the producer sent
//
// # Counting a topic
//
// A dead-letter topic is read like `idemstream audit` reads a command
// topic: every partition from a start point to the end offsets seen at
// the start, without a consumer group, through [audit.KafkaTopic]:
//
//	src := &audit.KafkaTopic{Reader: kafka, Topic: p.DLQ, From: from}
//	sum, err := dlq.Summarize(ctx, src, dlq.SummaryOptions{Pipeline: p.Name, Topic: p.DLQ, Input: p.Input})
//	sum.WriteText(os.Stdout, time.Now()) // or encode sum as JSON
//
// A dead-letter topic may be shared by pipelines: a dead letter belongs to
// the pipeline whose input its idemstream-source names.
//
// # Explaining one
//
// An [Inspector] reads a dead letter back, the input record it came from
// and, for a conflict, the first copy its key was stored with, and
// compares them under the pipeline's current rules:
//
//	in, err := dlq.NewInspector(policy, p.Input, kafka)
//	shown, err := in.Show(ctx, dlq.Position{Topic: p.DLQ, Partition: 0, Offset: 42})
//
// # Sending them back
//
// A [Redriver] writes the selected dead letters' original key, value and
// headers to the input (to the partition each was consumed from), plus
// idemstream-redrive-of naming the dead letter, at the pace of a
// [Limiter]:
//
//	lim, _ := dlq.NewLimiter(100, nil) // 100 records a second
//	rd, err := dlq.NewRedriver(kafka, kafka, dlq.RedriveOptions{
//		Pipeline: p.Name, DLQ: p.DLQ, Input: p.Input, Limiter: lim,
//		Select: dlq.Selector{Reasons: []dedupe.Reason{dedupe.ReasonHandlerFailed}},
//	})
//	report, err := rd.Run(ctx, &audit.KafkaTopic{Reader: kafka, Topic: p.DLQ})
//
// Only handler_failed is sent without Force ([Redrivable]): a conflict
// meets the same stored key again and an invalid record the same rules,
// so both come straight back.
//
// # Why a redrive is safe to repeat and to interrupt
//
// A redriven record keeps its key and its body, so it has the fingerprint
// of the command that failed, and a source (offset) of its own. The
// pipeline's decision table (internal/decide) then gives every copy of it
// one outcome between them:
//
//   - the key is FAILED with that fingerprint: the first copy to arrive
//     runs the handler again (a rerun), once; a FAILED key whose
//     failed_ttl ended is forgotten, and the copy is a first;
//   - the key is SUCCESS (a redrive before, or a client's retry, got it
//     through): the copy is a replay, no second result;
//   - the key is PENDING under another copy: the copy waits, then replays.
//
// Two copies written by two redrives, or by one redrive stopped half-way
// and run again, land in the same partition in order, so the first is
// decided before the second. Within one run, dead letters of the same key
// and fingerprint (a command that failed twice) are sent once. A write of
// unknown outcome is tried again; a second copy it leaves is a replay.
// What "exactly one result" cannot cover is a key's window: a redrive
// repeated after the window of the first redrive's result has ended is a
// new command, as any command is once its key is forgotten.
package dlq
