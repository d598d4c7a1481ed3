package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/internal/retry"
	"github.com/idemstream/idemstream/sinks"
)

// errFenced ends a partition's work: another worker owns a key of the
// batch now, so this one must not commit.
var errFenced = errors.New("fenced by a newer owner")

type replyWork struct {
	rec int
	// first is the batch's own first copy of the key, nil when the first
	// copy came earlier.
	first *firstCopy
	ref   dedupe.ResultRef
	state dedupe.State
}

// processBatch decides a batch, acts on every outcome, and returns once
// every outcome is durable (results and dead letters acknowledged, state
// completed), which is when the caller may commit past it. An error means
// nothing may be committed: the context ended, a newer owner fenced this
// one, or something refused for good (see Classify); the keys the batch
// held are then abandoned as protocol.go says.
//
// It runs in two phases. First everything the store decides at once is
// acted on and made durable: most records, and above all the first copies
// this batch owns. Then the records whose key another holder owns are
// waited for and decided. So two batches that each hold a key the other
// waits for (records of one key on two partitions) never wait each other
// out: each finishes its own keys before it waits.
//
// Between the phases, the records before the first one that waits are
// committed (commitTo): they are complete, and a crash while the batch
// waits, followed by an outage longer than the window, would otherwise
// decide them first again once their entries expired.
func (p *Pipeline) processBatch(ctx context.Context, pz *pauser, holder string, batch []sinks.Fetched, fetched time.Time, fl *floors, commitTo func(next int64)) error {
	recs := make([]dedupe.Record, len(batch))
	for i, f := range batch {
		recs[i] = dedupe.Record{Topic: p.cfg.Input, Partition: f.Partition, Offset: f.Offset,
			Key: f.Key, Value: f.Value, Headers: f.Headers, Time: f.Time}
	}
	deferred, tail, err := p.decideAndAct(ctx, pz, holder, recs, fl, false)
	if err != nil {
		return err
	}
	if len(deferred) > 0 {
		first := recs[deferred[0]].Offset
		for _, i := range deferred {
			first = min(first, recs[i].Offset)
		}
		commitTo(first)
		waiting := make([]dedupe.Record, len(deferred))
		for j, i := range deferred {
			waiting[j] = recs[i]
		}
		if _, _, err := p.decideAndAct(ctx, pz, holder, waiting, fl, true); err != nil {
			// The first phase's keys after the first record that waits
			// are not committed, and will be read again, maybe much
			// later: kept as long as an abandoned batch's.
			p.keepLonger(pz, tail)
			return err
		}
	}
	if m := p.cfg.Metrics; m != nil {
		m.decisionSeconds.WithLabelValues(p.cfg.Name).Observe(time.Since(fetched).Seconds())
	}
	return nil
}

// decideAndAct is one phase of processBatch: decide recs (waiting for keys
// held elsewhere, or deferring them), act on every outcome, and return once
// they are durable, with the indexes of the records deferred.
//
// tail are the SUCCESS completions of records after the first deferred
// one: uncommitted until the second phase ends.
func (p *Pipeline) decideAndAct(ctx context.Context, pz *pauser, holder string, recs []dedupe.Record, fl *floors, wait bool) (deferred []int, tail []dedupe.Completion, err error) {
	r := p.newResults(pz, holder, recs, fl, wait)
	defer func() {
		if err != nil {
			released, completed, leased := r.abandon()
			if released+completed+leased > 0 {
				pz.log.Info("batch abandoned", "released", released, "completed", completed, "left_to_lease", leased, "err", err)
			}
		}
	}()

	if err := r.decide(ctx); err != nil {
		return nil, nil, err
	}
	if err := r.checkRules(ctx); err != nil {
		return nil, nil, err
	}
	if err := r.recover(ctx); err != nil {
		return nil, nil, err
	}
	isDeferred := make(map[int]bool, len(r.deferred))
	for _, i := range r.deferred {
		isDeferred[i] = true
	}
	t := newTally()
	for i := range r.outs {
		if isDeferred[i] {
			continue
		}
		if err := p.act(ctx, pz, r, t, i); err != nil {
			return nil, nil, err
		}
	}
	if err := r.write(ctx); err != nil {
		return nil, nil, err
	}
	if err := p.sendDeadLetters(ctx, pz, r, t); err != nil {
		return nil, nil, err
	}
	if len(t.replies) > 0 {
		if err := p.writeReplies(ctx, pz, recs, t.replies, t.skipped); err != nil {
			return nil, nil, err
		}
	}
	if err := r.complete(ctx); err != nil {
		return nil, nil, err
	}
	p.account(t)
	return r.deferred, r.tail, nil
}

// tally is what one phase of a batch came to, gathered record by record
// as decideAndAct acts on them: the dead letters and replies still to
// write, and what the metrics and the log report.
type tally struct {
	dlq      []sinks.Message
	failedAt map[int]*firstCopy // a dead letter's index: its failed first copy
	replies  []replyWork
	counts   map[dedupe.OutcomeKind]int
	reasons  map[dedupe.Reason]int // dead letters
	skipped  map[string]int        // replies not sent, by reason
	// mismatches are lenient replays whose body differs; rulesChange,
	// strict replays fingerprinted again under new rules.
	mismatches, rulesChange int
	// firstIn is the batch's first copy of each key acted on so far.
	firstIn map[string]*firstCopy
}

func newTally() *tally {
	return &tally{failedAt: map[int]*firstCopy{}, counts: map[dedupe.OutcomeKind]int{}, reasons: map[dedupe.Reason]int{},
		skipped: map[string]int{}, firstIn: map[string]*firstCopy{}}
}

// deadLetter adds the dead letter of rec, whose outcome is o.
func (t *tally) deadLetter(p *Pipeline, rec *dedupe.Record, o *dedupe.Outcome, reason dedupe.Reason, cause error, paths []string) {
	t.dlq = append(t.dlq, envelope.DeadLetter(p.cfg.DLQ, rec, o, reason, cause, paths))
	t.reasons[reason]++
}

// sent marks the failed first copy whose dead letter is t.dlq[i] as
// dead-lettered.
func (t *tally) sent(i int) {
	if fc := t.failedAt[i]; fc != nil {
		fc.deadLettered = true
	}
}

// act acts on the outcome of record i: a first copy is handled and its
// result staged in r, a replay counted and answered, the rest
// dead-lettered.
func (p *Pipeline) act(ctx context.Context, pz *pauser, r *results, t *tally, i int) error {
	o, rec := &r.outs[i], &r.recs[i]
	switch o.Kind {
	case dedupe.OutcomeFirst:
		return p.actFirst(ctx, r, t, i)
	case dedupe.OutcomeReplay:
		return p.actReplay(ctx, pz, r, t, i)
	case dedupe.OutcomeConflict:
		t.counts[dedupe.OutcomeConflict]++
		t.deadLetter(p, rec, o, dedupe.ReasonConflict, o.Err, p.conflictPaths(ctx, o, r.recs, rec, t.firstIn))
	default:
		t.counts[dedupe.OutcomeInvalid]++
		t.deadLetter(p, rec, o, o.Reason, o.Err, nil)
	}
	return nil
}

// actFirst runs the handler on first copy i and stages its result, unless
// recovery found the result already written.
func (p *Pipeline) actFirst(ctx context.Context, r *results, t *tally, i int) error {
	o, rec := &r.outs[i], &r.recs[i]
	fc := r.byRec[i]
	t.firstIn[o.Key] = fc
	if fc.stage == stageFound {
		return nil
	}
	res, herr := p.handle(ctx, rec, o)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if herr != nil {
		fc.failed(dedupe.ReasonHandlerFailed, herr)
		return nil
	}
	msg := envelope.Result(p.cfg.Output, int(fc.intent.Partition), rec, o, fc.owner.Source, fc.decision, res.Value, res.Headers)
	if p.cfg.Identity != "" {
		msg.Headers = append(msg.Headers, dedupe.Header{Key: sinks.HeaderPipeline, Value: p.identity})
	}
	fc.handled(msg)
	return nil
}

// actReplay counts replay i and queues its reply. Under strict semantics a
// replay whose first copy was fingerprinted under other rules is a
// conflict if the first copy, fingerprinted again under the current ones,
// differs.
func (p *Pipeline) actReplay(ctx context.Context, pz *pauser, r *results, t *tally, i int) error {
	o, rec := &r.outs[i], &r.recs[i]
	if o.Decision.RulesChanged && o.Decision.Mismatch && p.policy.Semantics == dedupe.Strict {
		t.rulesChange++
		conflict, err := p.conflictUnderCurrentRules(ctx, pz, o, rec)
		if err != nil {
			return err
		}
		if conflict {
			o.Kind, o.Reason = dedupe.OutcomeConflict, dedupe.ReasonConflict
			o.Err = fmt.Errorf("idempotency key reused with a different payload: fingerprint %s; the first copy at %s, fingerprinted again under the current rules, differs",
				o.Fingerprint, o.Decision.Entry.FirstSource)
			t.counts[dedupe.OutcomeConflict]++
			t.deadLetter(p, rec, o, dedupe.ReasonConflict, o.Err, p.conflictPaths(ctx, o, r.recs, rec, t.firstIn))
			return nil
		}
	}
	t.counts[dedupe.OutcomeReplay]++
	if o.LenientMismatch {
		t.mismatches++
	}
	if p.cfg.Replies != "" {
		t.replies = append(t.replies, replyWork{rec: i, first: t.firstIn[o.Key], ref: o.Decision.Entry.Result, state: o.Decision.Entry.State})
	}
	return nil
}

// sendDeadLetters counts the batch's first copies, dead-letters those that
// failed, and writes every dead letter of the batch. A failed first copy
// is dead-lettered as soon as its dead letter may have been appended,
// whatever becomes of the others.
func (p *Pipeline) sendDeadLetters(ctx context.Context, pz *pauser, r *results, t *tally) error {
	for _, fc := range r.firsts {
		if fc.stage != stageFailed {
			t.counts[dedupe.OutcomeFirst]++
			continue
		}
		t.counts[dedupe.OutcomeFailed]++
		t.failedAt[len(t.dlq)] = fc
		t.deadLetter(p, &r.recs[fc.rec], &r.outs[fc.rec], fc.reason, fc.err, nil)
	}
	if len(t.dlq) == 0 {
		return nil
	}
	_, err := p.writeAtLeastOnce(ctx, pz, "dead letters", p.cfg.DLQ, t.dlq, true, t.sent)
	return err
}

// account reports what a phase came to, in the metrics and the log.
func (p *Pipeline) account(t *tally) {
	if m := p.cfg.Metrics; m != nil {
		for kind, n := range t.counts {
			m.records.WithLabelValues(p.cfg.Name, string(kind)).Add(float64(n))
		}
		for reason, n := range t.reasons {
			m.dlqRecords.WithLabelValues(p.cfg.Name, string(reason)).Add(float64(n))
		}
		for reason, n := range t.skipped {
			m.repliesSkipped.WithLabelValues(p.cfg.Name, reason).Add(float64(n))
		}
		m.lenientMismatch.WithLabelValues(p.cfg.Name).Add(float64(t.mismatches))
	}
	p.logBurst(t.reasons, t.rulesChange, t.skipped)
}

// keepLonger asks the store to keep completed entries for
// dedupe.PendingRetention: their records will be read again. Best effort,
// like abandon: the store may not answer.
func (p *Pipeline) keepLonger(pz *pauser, comps []dedupe.Completion) {
	if len(comps) == 0 {
		return
	}
	for i := range comps {
		comps[i].KeepAtLeast = max(comps[i].KeepAtLeast, dedupe.PendingRetention)
	}
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	if _, err := p.cfg.Store.Complete(ctx, comps); err != nil {
		pz.log.Warn("abandoned batch: the store did not answer; completed keys keep their window only", "err", err)
	}
}

// conflictUnderCurrentRules settles a mismatch against an entry made under
// other rules: the first copy, read back from its source, is checked under
// the current rules by the decider (SameRequestUnderCurrentRules, the one
// verdict the front door uses too). A rules change must not flood the DLQ
// with false conflicts, nor let a real one pass. A fetch that fails, or a
// schema registry that does not answer, pauses the partition and is tried
// again, never read as "gone" or "the same".
func (p *Pipeline) conflictUnderCurrentRules(ctx context.Context, pz *pauser, o *dedupe.Outcome, rec *dedupe.Record) (bool, error) {
	msg, found, err := p.firstCopy(ctx, pz, o.Decision.Entry.FirstSource)
	if err != nil {
		return false, err
	}
	var same bool
	err = pz.retryStore(ctx, "check the first copy under the current rules", func() (err error) {
		same, err = p.cfg.Decider.SameRequestUnderCurrentRules(o, rec.Value, msg.Value, found)
		return err
	})
	return !same, err
}

// firstCopy reads the input record at source, pausing while the broker
// does not answer: false when the input no longer holds it.
func (p *Pipeline) firstCopy(ctx context.Context, pz *pauser, source string) (sinks.Message, bool, error) {
	for empty := 0; ; {
		msg, ok, err := p.inputRecord(ctx, source)
		switch {
		case err == nil && ok:
			pz.resume()
			return msg, true, nil
		case err == nil:
			pz.resume()
			return sinks.Message{}, false, nil
		case errors.Is(err, errNoRecords) && empty < 20:
			empty++
			continue
		case ctx.Err() != nil:
			return sinks.Message{}, false, ctx.Err()
		case !dedupe.IsRetryable(err):
			return sinks.Message{}, false, fmt.Errorf("read the first copy at %s: %w", source, err)
		}
		pz.pause(ctx, "read the first copy", err)
	}
}

// floors reads the end offset of every output partition before a batch is
// decided: the intent recorded with each PENDING key, from which a later
// owner scans for a result already written.
func (p *Pipeline) floors(ctx context.Context) (int, map[int]int64, error) {
	n, err := p.cfg.Broker.Partitions(ctx, p.cfg.Output)
	if err != nil {
		return 0, nil, err
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	ends, err := p.cfg.Broker.EndOffsets(ctx, p.cfg.Output, parts)
	if err != nil {
		return 0, nil, err
	}
	return n, ends, nil
}

// handle runs the handler, retrying errors not marked Permanent with
// backoff while the partition waits.
func (p *Pipeline) handle(ctx context.Context, rec *dedupe.Record, o *dedupe.Outcome) (Result, error) {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		res, err := p.cfg.Handler.Handle(ctx, Command{Record: *rec, Key: o.Key, Fingerprint: o.Fingerprint})
		if err == nil || IsPermanent(err) {
			return res, err
		}
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		if attempt == 1 || attempt%10 == 0 {
			p.log.Warn("handler failed; retrying", "key", o.Key, "source", rec.Source(), "attempt", attempt, "err", err)
		}
		if retry.Sleep(ctx, backoff) != nil {
			return Result{}, ctx.Err()
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// writeAtLeastOnce writes dead letters or replies until every one is
// acknowledged. They carry no idempotency of their own: after a write of
// unknown outcome they are written again and may appear twice, with the
// same idemstream-source. A record the broker refuses for its size is an
// answer about that record, not the batch: with trim it is trimmed (see
// trimmed) and written again, without it is left out, and tooLarge lists
// the indexes of those left out. sent, when given, hears of each message
// once it was acknowledged or may have been appended. A record the topic
// refuses for good stops the pipeline: nothing can be committed past it.
func (p *Pipeline) writeAtLeastOnce(ctx context.Context, pz *pauser, what, topic string, msgs []sinks.Message, trim bool, sent ...func(i int)) (tooLarge []int, err error) {
	heard := func(i int) {
		for _, f := range sent {
			f(i)
		}
	}
	msgs = slices.Clone(msgs)
	tries := make([]int, len(msgs)) // size refusals of each message so far
	idx := make([]int, len(msgs))   // pending messages, by index
	for i := range idx {
		idx[i] = i
	}
	for len(idx) > 0 {
		batch := make([]sinks.Message, len(idx))
		for j, i := range idx {
			batch[j] = msgs[i]
		}
		written, err := p.cfg.Broker.Write(ctx, batch)
		if err == nil {
			for _, i := range idx {
				heard(i)
			}
			pz.resume()
			return tooLarge, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var again []int
		unavailable := false
		// Every message the broker took, or may have, is heard of
		// before anything else ends the write.
		for j, i := range idx {
			if written != nil && (written[j].Err == nil && written[j].Offset >= 0 || errors.Is(written[j].Err, sinks.ErrAmbiguous)) {
				heard(i)
			}
		}
		for j, i := range idx {
			w := writtenAt(written, j, err)
			switch {
			case w.Err == nil && w.Offset >= 0:
			case errors.Is(w.Err, dedupe.ErrPayloadTooLarge) && !trim:
				tooLarge = append(tooLarge, i)
			case errors.Is(w.Err, dedupe.ErrPayloadTooLarge):
				tries[i]++
				next, ok := trimmed(msgs[i], tries[i])
				if !ok {
					return nil, fmt.Errorf("write %s to %s: %w: even without its payload, key and input headers the record from %s is refused: %w",
						what, topic, dedupe.ErrBrokerRefused, sourceOf(msgs[i]), w.Err)
				}
				msgs[i] = next
				again = append(again, i)
				if tries[i] == 1 {
					if m := p.cfg.Metrics; m != nil {
						m.recordsTrimmed.WithLabelValues(p.cfg.Name).Inc()
					}
					p.log.Warn("a "+what+" record was too large for its topic; writing it trimmed", "topic", topic, "source", sourceOf(msgs[i]), "err", w.Err)
				}
			case errors.Is(w.Err, sinks.ErrAmbiguous), dedupe.IsRetryable(w.Err):
				again, unavailable = append(again, i), true
			default:
				return nil, fmt.Errorf("write %s to %s: %w: %w", what, topic, dedupe.ErrBrokerRefused, w.Err)
			}
		}
		idx = again
		if unavailable {
			pz.pause(ctx, "write "+what, err)
		}
	}
	pz.resume()
	return tooLarge, nil
}

// trimmed is the try-th smaller form of a record the broker refused for
// its size: its payload halved each time (down to none), then without the
// input's key and headers. A refused record was not appended, so writing
// a smaller one is safe. false: nothing smaller is left to try.
func trimmed(m sinks.Message, try int) (sinks.Message, bool) {
	size := len(m.Value)
	if try > 1 {
		if _, bare := sinks.HeaderValue(m.Headers, sinks.HeaderPayloadSize); bare && size == 0 {
			if m.Key == nil && !hasForeignHeaders(m.Headers) {
				return m, false
			}
			return envelope.TrimDeadLetter(m, 0, true), true
		}
	}
	keep := size / 2
	if keep < 1024 {
		keep = 0
	}
	return envelope.TrimDeadLetter(m, keep, false), true
}

func hasForeignHeaders(hs []dedupe.Header) bool {
	for _, h := range hs {
		if !strings.HasPrefix(h.Key, "idemstream-") {
			return true
		}
	}
	return false
}

func sourceOf(m sinks.Message) string {
	src, _ := sinks.HeaderValue(m.Headers, sinks.HeaderSource)
	return src
}

// storedResult reads the result record a completed key points to.
func (p *Pipeline) storedResult(ctx context.Context, ref dedupe.ResultRef) (sinks.Message, bool) {
	if ref.Offset < 0 || ref.Partition < 0 {
		return sinks.Message{}, false
	}
	recs, _, err := p.cfg.Broker.Fetch(ctx, p.cfg.Output, int(ref.Partition), ref.Offset, 10*time.Millisecond)
	if err != nil || len(recs) == 0 || recs[0].Offset != ref.Offset {
		return sinks.Message{}, false
	}
	// Kept for the batch's replies, not its fetch's blocks.
	return recs[0].Own(), true
}

// errNoRecords is a fetch below the high watermark that returned nothing.
var errNoRecords = fmt.Errorf("no records returned below the high watermark: %w", dedupe.ErrBrokerUnavailable)

// inputRecord reads the input record at source (topic/partition/offset):
// false with no error when the input no longer holds it (deleted by
// retention or compaction, or not on this pipeline's input), an error when
// the broker did not say.
func (p *Pipeline) inputRecord(ctx context.Context, source string) (sinks.Message, bool, error) {
	rest, ok := strings.CutPrefix(source, p.cfg.Input+"/")
	if !ok {
		return sinks.Message{}, false, nil
	}
	part, off, ok := strings.Cut(rest, "/")
	if !ok {
		return sinks.Message{}, false, nil
	}
	partition, err1 := strconv.Atoi(part)
	offset, err2 := strconv.ParseInt(off, 10, 64)
	if err1 != nil || err2 != nil {
		return sinks.Message{}, false, nil
	}
	recs, hw, err := p.cfg.Broker.Fetch(ctx, p.cfg.Input, partition, offset, 10*time.Millisecond)
	switch {
	case errors.Is(err, kafka.OffsetOutOfRange):
		return sinks.Message{}, false, nil
	case errors.Is(err, sinks.ErrUnknownTopic):
		// A partition the input no longer has (recreated with fewer) is
		// gone; one it has is a broker that does not know it yet.
		if n, perr := p.cfg.Broker.Partitions(ctx, p.cfg.Input); perr == nil && partition >= n {
			return sinks.Message{}, false, nil
		}
		return sinks.Message{}, false, err
	case err != nil:
		return sinks.Message{}, false, err
	case len(recs) == 0 && offset < hw:
		return sinks.Message{}, false, errNoRecords
	case len(recs) == 0 || recs[0].Offset != offset:
		return sinks.Message{}, false, nil
	}
	return recs[0].Own(), true, nil
}

// conflictPaths names the fields that differ from the first copy. The
// first copy is in this batch, or read back from the input at the source
// the store recorded (while the topic's retention keeps it).
func (p *Pipeline) conflictPaths(ctx context.Context, o *dedupe.Outcome, recs []dedupe.Record, cur *dedupe.Record, firstIn map[string]*firstCopy) []string {
	var first []byte
	if fc, ok := firstIn[o.Key]; ok {
		first = recs[fc.rec].Value
	} else if msg, ok, _ := p.inputRecord(ctx, o.Decision.Entry.FirstSource); ok {
		first = msg.Value
	}
	if first == nil {
		return nil
	}
	paths, err := p.canon.Diff(first, cur.Value)
	if err != nil {
		return nil
	}
	return paths
}

// writeReplies re-publishes the stored result for each replay. A reply
// needs the result: one whose key is still PENDING elsewhere, or whose
// result can no longer be read (retention), is skipped and counted by
// reason in skipped.
func (p *Pipeline) writeReplies(ctx context.Context, pz *pauser, recs []dedupe.Record, replies []replyWork, skipped map[string]int) error {
	var msgs []sinks.Message
	for _, r := range replies {
		var stored sinks.Message
		switch {
		case r.first != nil && r.first.stage == stageWritten:
			stored = r.first.msg
		case r.first != nil && r.first.stage == stageFound:
			var ok bool
			if stored, ok = p.storedResult(ctx, r.first.result); !ok {
				skipped["unreadable"]++
				continue
			}
		case r.first != nil:
			skipped["failed"]++
			continue
		case r.state == dedupe.Pending:
			skipped["pending"]++
			continue
		case r.state == dedupe.Failed:
			skipped["failed"]++
			continue
		default:
			var ok bool
			if stored, ok = p.storedResult(ctx, r.ref); !ok {
				skipped["unreadable"]++
				continue
			}
		}
		msgs = append(msgs, envelope.Reply(p.cfg.Replies, stored, &recs[r.rec]))
	}
	// A reply is the stored result or nothing: one the topic refuses for
	// its size is left out and counted, never trimmed.
	tooLarge, err := p.writeAtLeastOnce(ctx, pz, "replies", p.cfg.Replies, msgs, false)
	if len(tooLarge) > 0 {
		skipped["too_large"] += len(tooLarge)
	}
	return err
}

// complete records the outcome of every first copy; a refused completion
// means another worker took a key over, and the batch must not commit.
func (p *Pipeline) complete(ctx context.Context, pz *pauser, comps []dedupe.Completion) error {
	if len(comps) == 0 {
		return nil
	}
	var errs []error
	err := pz.retryStore(ctx, "complete", func() (err error) {
		errs, err = p.cfg.Store.Complete(ctx, comps)
		return err
	})
	if err != nil {
		return err
	}
	for _, e := range errs {
		if e != nil {
			return fmt.Errorf("%w: %w", errFenced, e)
		}
	}
	return nil
}

// logBurst writes one line per batch that dead-lettered records, at most
// every ten seconds per pipeline, never one per record.
func (p *Pipeline) logBurst(reasons map[dedupe.Reason]int, rulesChanged int, repliesSkipped map[string]int) {
	if rulesChanged > 0 {
		p.log.Info("rules_changed: fingerprints made under other rules decided again under the current ones", "records", rulesChanged)
	}
	if len(repliesSkipped) > 0 {
		p.log.Info("replies skipped: no stored result to replay", "by_reason", fmt.Sprint(repliesSkipped))
	}
	if len(reasons) == 0 {
		return
	}
	now := time.Now().UnixNano()
	last := p.lastBurst.Load()
	if now-last < int64(10*time.Second) || !p.lastBurst.CompareAndSwap(last, now) {
		return
	}
	parts := make([]string, 0, len(reasons))
	for r, n := range reasons {
		parts = append(parts, fmt.Sprintf("%s=%d", r, n))
	}
	sort.Strings(parts)
	p.log.Warn("dead-lettered records", "dlq", p.cfg.DLQ, "reasons", strings.Join(parts, " "))
}
