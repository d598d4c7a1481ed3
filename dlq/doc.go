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
//		Pipeline: p.Name, DLQ: p.DLQ, Input: p.Input, Output: p.Output, Limiter: lim,
//		Select: dlq.Selector{Reasons: []dedupe.Reason{dedupe.ReasonHandlerFailed}},
//	})
//	report, err := rd.Run(ctx, &audit.KafkaTopic{Reader: kafka, Topic: p.DLQ})
//
// Only handler_failed is sent without Force ([Redrivable]): a conflict
// meets the same stored key again and an invalid record the same rules,
// so both come straight back.
//
// # What a redrive does not send
//
// A redriven record keeps its key and its body, so it has the fingerprint
// of the command that failed. The pipeline's decision table
// (internal/decide) runs the handler again for it when the key is FAILED
// with that fingerprint, and also when the key is forgotten: a key that
// got its result after the dead letter (a client's retry, a redelivery
// after a crash between the dead letter and FAILED, an earlier redrive)
// is forgotten when that result's window ends, and a copy then is a new
// command. So Run looks before it sends. It reads the dead-letter topic
// twice: the first pass finds the dead letters that may be sent, the
// earliest one's time and each key's latest handler_failed dead letter;
// then it reads, from that time to their end offsets, the pipeline's
// output (a dead letter whose key has a result at or after it is skipped,
// [SkippedHasResult]) and the topics it writes to (a dead letter named by
// an idemstream-redrive-of there was sent before, [SkippedRedrivenBefore]),
// and sends in the second pass. Per key only the latest selected
// handler_failed dead letter is sent ([SkippedSuperseded],
// [SkippedDuplicate]). Force lifts none of these.
//
// A redrive run again, however long after, thus sends nothing it sent
// before. What it cannot see: records that retention removed from the
// output or the input, a redrive running at the same time, copies written
// to other topics, and a later dead letter outside the selection; "after"
// compares record timestamps. Copies of one command go to one partition
// (the one it was consumed from, or that of its Kafka key or idempotency
// key), in order, so a second copy that a write of unknown outcome left is
// decided after the first: a replay. A record the broker refuses for its
// size is skipped ([SkippedTooLarge]) and the others are sent.
package dlq
