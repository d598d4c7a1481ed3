package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// Skipped reasons: why a selected dead letter that would otherwise be
// sent is not.
const (
	// SkippedSuperseded is a handler_failed dead letter of a key that has
	// a later selected handler_failed dead letter with another body: only
	// the latest command of a key is sent.
	SkippedSuperseded = "superseded"
	// SkippedDuplicate is a dead letter of the same key and fingerprint as
	// the one sent for its key (a command that failed twice).
	SkippedDuplicate = "duplicate"
	// SkippedRedrivenBefore is a dead letter that an earlier redrive
	// already wrote: the input (or the --to topic) holds a record whose
	// idemstream-redrive-of names it.
	SkippedRedrivenBefore = "redriven_before"
	// SkippedHasResult is a dead letter whose key has a result in the
	// pipeline's output with a timestamp at or after the dead letter's: a
	// client's retry, a redelivery or an earlier redrive got it through.
	SkippedHasResult = "has_result"
	// SkippedPayloadCut is a trimmed dead letter whose source, which holds
	// the whole record, is gone.
	SkippedPayloadCut = "payload_cut"
	// SkippedTooLarge is a record the broker refused for its size.
	SkippedTooLarge = "too_large"
)

// SkipReasons are the reasons a RedriveReport's Skipped counts by, in the
// order a dead letter is checked for them.
func SkipReasons() []string {
	return []string{SkippedSuperseded, SkippedDuplicate, SkippedRedrivenBefore, SkippedHasResult, SkippedPayloadCut, SkippedTooLarge}
}

// readMargin is read before the earliest dead letter's time in the
// output and input topics: the timestamps of records written by other
// hosts may be off by that much.
const readMargin = time.Minute

// dlqPos is a record of the dead-letter topic.
type dlqPos struct {
	partition int
	offset    int64
}

// keyPlan is what a redrive knows of one idempotency key before it sends.
type keyPlan struct {
	// latest is the key's last selected handler_failed dead letter (in
	// the order the topic is read: by timestamp), fp its fingerprint.
	latest    dlqPos
	fp        string
	hasLatest bool
	// result is the timestamp of the key's latest result in the output
	// (zero: none read).
	result time.Time
}

// plan is the first pass's findings: which dead letters may be sent, the
// latest per key, and which of them were sent before.
type plan struct {
	// from is the earliest time of the dead letters that may be sent.
	from time.Time
	keys map[string]*keyPlan
	// letters are the dead letters that may be sent; true when a record
	// that an earlier redrive wrote names it.
	letters map[dlqPos]bool
}

// sendable reports whether d is selected and allowed without or with
// Force.
func (rd *Redriver) sendable(d *DeadLetter) bool {
	return rd.o.Select.Match(d) && (Redrivable(d.Reason) || rd.o.Force)
}

// survey is the first pass over the dead-letter topic: the dead letters
// that may be sent, the earliest one's time and the latest handler_failed
// dead letter of each key.
func (rd *Redriver) survey(ctx context.Context, src audit.Source) error {
	p := &rd.plan
	return src.Scan(ctx, func(rec *dedupe.Record) error {
		d := Parse(rec)
		if !rd.sendable(&d) {
			return nil
		}
		at := dlqPos{d.At.Partition, d.At.Offset}
		if len(p.letters) == 0 || d.Time.Before(p.from) {
			p.from = d.Time
		}
		p.letters[at] = false
		if d.IdemKey == "" {
			return nil
		}
		k := p.keys[d.IdemKey]
		if k == nil {
			k = &keyPlan{}
			p.keys[d.IdemKey] = k
		}
		if d.Reason == dedupe.ReasonHandlerFailed {
			k.latest, k.fp, k.hasLatest = at, d.Fingerprint, true
		}
		return nil
	})
}

// readFrom is where the output and the topics written to are read from:
// readMargin before the earliest dead letter, or from the earliest record
// for a time before 1970 (no timestamp).
func (p *plan) readFrom() time.Time {
	if at := p.from.Add(-readMargin); at.UnixMilli() > 0 {
		return at
	}
	return time.Time{}
}

// readResults reads the pipeline's output from the earliest dead letter's
// time and keeps the latest result's timestamp of each key surveyed. A
// result names its key in idemstream-key, after the input's headers (an
// upstream pipeline's idemstream-key among them): the last one is the
// pipeline's.
func (rd *Redriver) readResults(ctx context.Context) error {
	src := rd.o.Open(rd.o.Output, rd.plan.readFrom())
	err := src.Scan(ctx, func(rec *dedupe.Record) error {
		key, ok := sinks.HeaderValue(rec.Headers, sinks.HeaderKey)
		if !ok {
			return nil
		}
		if k := rd.plan.keys[key]; k != nil && rec.Time.After(k.result) {
			k.result = rec.Time
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the results in %s: %w", rd.o.Output, err)
	}
	return nil
}

// readRedrives reads the topics a redrive writes to (the input, and To
// when it differs) from the earliest dead letter's time, and marks the
// dead letters that a record there names in idemstream-redrive-of.
func (rd *Redriver) readRedrives(ctx context.Context) error {
	topics := []string{rd.o.Input}
	if rd.o.To != rd.o.Input {
		topics = append(topics, rd.o.To)
	}
	for _, topic := range topics {
		src := rd.o.Open(topic, rd.plan.readFrom())
		err := src.Scan(ctx, func(rec *dedupe.Record) error {
			of, ok := sinks.HeaderValue(rec.Headers, HeaderRedriveOf)
			if !ok {
				return nil
			}
			pos, err := ParsePosition(of)
			at := dlqPos{pos.Partition, pos.Offset}
			if _, ours := rd.plan.letters[at]; err == nil && ours && pos.Topic == rd.o.DLQ {
				rd.plan.letters[at] = true
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read the records redriven before to %s: %w", topic, err)
		}
	}
	return nil
}

// prepare runs the first pass and the reads of the output and input.
func (rd *Redriver) prepare(ctx context.Context, src audit.Source) error {
	rd.plan = plan{keys: map[string]*keyPlan{}, letters: map[dlqPos]bool{}}
	if err := rd.survey(ctx, src); err != nil {
		return err
	}
	if len(rd.plan.letters) == 0 {
		return ctx.Err()
	}
	if err := rd.readResults(ctx); err != nil {
		return err
	}
	return rd.readRedrives(ctx)
}

// skip says why d, selected and allowed, is not sent ("" when it is).
func (rd *Redriver) skip(d *DeadLetter) string {
	at := dlqPos{d.At.Partition, d.At.Offset}
	k := rd.plan.keys[d.IdemKey]
	if d.IdemKey == "" {
		k = nil
	}
	switch {
	case d.Reason == dedupe.ReasonHandlerFailed && k != nil && k.hasLatest && k.latest != at:
		if d.Fingerprint != "" && d.Fingerprint == k.fp {
			return SkippedDuplicate
		}
		return SkippedSuperseded
	case d.Reason != dedupe.ReasonHandlerFailed && rd.seenBefore(d):
		return SkippedDuplicate
	case rd.plan.letters[at]:
		return SkippedRedrivenBefore
	case k != nil && !k.result.IsZero() && !k.result.Before(d.Time):
		return SkippedHasResult
	}
	return ""
}

// seenBefore reports whether a dead letter of d's key and fingerprint
// was taken before in this run (for the reasons only Force sends).
func (rd *Redriver) seenBefore(d *DeadLetter) bool {
	if d.IdemKey == "" || d.Fingerprint == "" {
		return false
	}
	id := d.IdemKey + "\x00" + d.Fingerprint
	if _, dup := rd.seen[id]; dup {
		return true
	}
	rd.seen[id] = struct{}{}
	return false
}
