package consumer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// errFenced ends a partition's work: another worker owns a key of the
// batch now, so this one must not commit.
var errFenced = errors.New("fenced by a newer owner")

type resultWork struct {
	rec   int // index in the batch
	floor int64
	msg   sinks.Message
}

type replyWork struct {
	rec   int
	first int // index in results when the first copy is in this batch, else -1
	ref   dedupe.ResultRef
}

// processBatch decides a batch, acts on every outcome, and returns once
// every outcome is durable (results and dead letters acknowledged, state
// completed), which is when the caller may commit past it. An error means
// nothing may be committed: the context ended, or a newer owner fenced
// this one.
func (p *Pipeline) processBatch(ctx context.Context, pz *pauser, holder string, batch []sinks.Fetched, fetched time.Time) error {
	m := p.cfg.Metrics
	recs := make([]dedupe.Record, len(batch))
	for i, f := range batch {
		recs[i] = dedupe.Record{Topic: p.cfg.Input, Partition: f.Partition, Offset: f.Offset,
			Key: f.Key, Value: f.Value, Headers: f.Headers, Time: f.Time}
	}

	outs, nOut, err := p.decide(ctx, pz, holder, recs)
	if err != nil {
		return err
	}

	var (
		results     []resultWork
		dlq         []sinks.Message
		replies     []replyWork
		completions []dedupe.Completion
		counts      = map[dedupe.OutcomeKind]int{}
		reasons     = map[dedupe.Reason]int{}
		mismatches  int
		rulesChange int
		firstIn     = map[string]int{}
	)
	deadLetter := func(i int, reason dedupe.Reason, cause error, paths []string) {
		dlq = append(dlq, sinks.DeadLetter(p.cfg.DLQ, &recs[i], &outs[i], reason, cause, paths))
		reasons[reason]++
	}
	for i := range outs {
		o, rec := &outs[i], &recs[i]
		owner := dedupe.Owner{Holder: holder, Source: rec.Source()}
		switch o.Kind {
		case dedupe.OutcomeFirst:
			intent := o.Decision.Entry.Intent
			q := int(intent.Partition)
			if q < 0 || q >= nOut {
				q = sinks.PartitionFor(sinks.ResultKey(rec, o.Key), nOut)
			}
			if o.Decision.Resumed && intent.Floor >= 0 {
				// An earlier owner may have written the result already.
				w, found, err := p.findResult(ctx, pz, q, intent.Floor, o.Key)
				if err != nil {
					return err
				}
				if found {
					completions = append(completions, dedupe.Completion{Namespace: p.cfg.Name, Key: o.Key, Owner: owner,
						State: dedupe.Success, Result: dedupe.ResultRef{Partition: int32(w.Partition), Offset: w.Offset}})
					counts[dedupe.OutcomeFirst]++
					continue
				}
			}
			res, herr := p.handle(ctx, rec, o)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if herr != nil {
				deadLetter(i, dedupe.ReasonHandlerFailed, herr, nil)
				completions = append(completions, dedupe.Completion{Namespace: p.cfg.Name, Key: o.Key, Owner: owner,
					State: dedupe.Failed, FailedTTL: p.policy.FailedTTL})
				counts[dedupe.OutcomeFailed]++
				continue
			}
			firstIn[o.Key] = len(results)
			results = append(results, resultWork{rec: i, floor: intent.Floor,
				msg: sinks.Result(p.cfg.Output, q, rec, o, res.Value, res.Headers)})
			counts[dedupe.OutcomeFirst]++
		case dedupe.OutcomeReplay:
			counts[dedupe.OutcomeReplay]++
			if o.LenientMismatch {
				mismatches++
			}
			if o.Decision.RulesChanged && o.Decision.Mismatch {
				rulesChange++
			}
			if p.cfg.Replies != "" {
				first, ok := firstIn[o.Key]
				if !ok {
					first = -1
				}
				replies = append(replies, replyWork{rec: i, first: first, ref: o.Decision.Entry.Result})
			}
		case dedupe.OutcomeConflict:
			counts[dedupe.OutcomeConflict]++
			deadLetter(i, dedupe.ReasonConflict, o.Err, p.conflictPaths(ctx, o, rec, recs, results, firstIn))
		default:
			counts[dedupe.OutcomeInvalid]++
			deadLetter(i, o.Reason, o.Err, nil)
		}
	}

	if len(results) > 0 {
		// Never write a result for a key this holder no longer owns.
		if err := p.renew(ctx, pz, holder, recs, outs, results); err != nil {
			return err
		}
		msgs := make([]sinks.Message, len(results))
		floors := make([]int64, len(results))
		keys := make([]string, len(results))
		for j, r := range results {
			msgs[j], floors[j], keys[j] = r.msg, r.floor, outs[r.rec].Key
		}
		written, err := p.writeOutputs(ctx, pz, msgs, floors, keys)
		if err != nil {
			return err
		}
		for j, r := range results {
			completions = append(completions, dedupe.Completion{Namespace: p.cfg.Name, Key: outs[r.rec].Key,
				Owner: dedupe.Owner{Holder: holder, Source: recs[r.rec].Source()}, State: dedupe.Success,
				Result: dedupe.ResultRef{Partition: int32(written[j].Partition), Offset: written[j].Offset}})
		}
	}
	if len(dlq) > 0 {
		if _, err := p.writeOutputs(ctx, pz, dlq, nil, nil); err != nil {
			return err
		}
	}
	if len(replies) > 0 {
		if err := p.writeReplies(ctx, pz, recs, results, replies); err != nil {
			return err
		}
	}
	if err := p.complete(ctx, pz, completions); err != nil {
		return err
	}

	if m != nil {
		for kind, n := range counts {
			m.Records.WithLabelValues(p.cfg.Name, string(kind)).Add(float64(n))
		}
		for reason, n := range reasons {
			m.DLQRecords.WithLabelValues(p.cfg.Name, string(reason)).Add(float64(n))
		}
		m.LenientMismatch.WithLabelValues(p.cfg.Name).Add(float64(mismatches))
		m.DecisionSeconds.WithLabelValues(p.cfg.Name).Observe(time.Since(fetched).Seconds())
	}
	p.logBurst(reasons, rulesChange)
	return nil
}

// decide asks the decider until the store answers; meanwhile the
// partition is paused.
func (p *Pipeline) decide(ctx context.Context, pz *pauser, holder string, recs []dedupe.Record) ([]dedupe.Outcome, int, error) {
	for {
		nOut, floors, err := p.floors(ctx)
		if err == nil {
			var outs []dedupe.Outcome
			outs, err = p.cfg.Decider.Decide(ctx, holder, recs, func(rec *dedupe.Record, key string) dedupe.Intent {
				q := sinks.PartitionFor(sinks.ResultKey(rec, key), nOut)
				return dedupe.Intent{Partition: int32(q), Floor: floors[q]}
			})
			if err == nil {
				pz.resume()
				return outs, nOut, nil
			}
			if !dedupe.IsRetryable(err) && ctx.Err() == nil {
				return nil, 0, fmt.Errorf("decide: %w", err)
			}
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		pz.pause(ctx, "decide", err)
	}
}

// renew extends the leases of the keys about to be written; a key taken
// over meanwhile fences the whole batch, which is then read again.
func (p *Pipeline) renew(ctx context.Context, pz *pauser, holder string, recs []dedupe.Record, outs []dedupe.Outcome, results []resultWork) error {
	rs := make([]*dedupe.Record, len(results))
	os := make([]*dedupe.Outcome, len(results))
	for j, r := range results {
		rs[j], os[j] = &recs[r.rec], &outs[r.rec]
	}
	var lost []bool
	err := pz.retryStore(ctx, "renew", func() (err error) {
		lost, err = p.cfg.Decider.Renew(ctx, holder, rs, os)
		return err
	})
	if err != nil {
		return err
	}
	for j, l := range lost {
		if l {
			return fmt.Errorf("%w: key %s was taken over before its result was written", errFenced, os[j].Key)
		}
	}
	return nil
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
		if sleep(ctx, backoff) != nil {
			return Result{}, ctx.Err()
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// writeOutputs writes msgs until every one is acknowledged. After a failed
// write the partition is paused; results (those with a floor) are then
// looked for in their partition from the floor once the failed write must
// have settled, and only the missing ones are written again: kafka-go
// retries nothing itself, so a result is never appended twice by us.
// Dead letters (no floor) are written again, at least once.
func (p *Pipeline) writeOutputs(ctx context.Context, pz *pauser, msgs []sinks.Message, floors []int64, keys []string) ([]sinks.Written, error) {
	out := make([]sinks.Written, len(msgs))
	todo := make([]int, len(msgs))
	for i := range todo {
		todo[i] = i
	}
	for {
		batch := make([]sinks.Message, len(todo))
		for j, i := range todo {
			batch[j] = msgs[i]
		}
		written, err := p.cfg.Broker.Write(ctx, batch)
		if err == nil {
			for j, i := range todo {
				out[i] = written[j]
			}
			pz.resume()
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		pz.pause(ctx, "write", err)
		if floors == nil {
			continue
		}
		if err := sleep(ctx, p.cfg.SettleWait); err != nil {
			return nil, err
		}
		var missing []int
		for _, i := range todo {
			if floors[i] >= 0 {
				w, found, err := p.findResult(ctx, pz, msgs[i].Partition, floors[i], keys[i])
				if err != nil {
					return nil, err
				}
				if found {
					out[i] = w
					continue
				}
			}
			missing = append(missing, i)
		}
		if len(missing) == 0 {
			pz.resume()
			return out, nil
		}
		todo = missing
	}
}

// findResult scans an output partition from floor for a result of key.
func (p *Pipeline) findResult(ctx context.Context, pz *pauser, partition int, floor int64, key string) (sinks.Written, bool, error) {
	offset := floor
	for {
		recs, hw, err := p.cfg.Broker.Fetch(ctx, p.cfg.Output, partition, offset, 10*time.Millisecond)
		if err != nil {
			if ctx.Err() != nil {
				return sinks.Written{}, false, ctx.Err()
			}
			pz.pause(ctx, "scan", err)
			continue
		}
		for _, r := range recs {
			if k, _ := sinks.HeaderValue(r.Headers, sinks.HeaderKey); k == key {
				return sinks.Written{Partition: partition, Offset: r.Offset}, true, nil
			}
		}
		if len(recs) == 0 || recs[len(recs)-1].Offset+1 >= hw {
			return sinks.Written{}, false, nil
		}
		offset = recs[len(recs)-1].Offset + 1
	}
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
	return recs[0].Message, true
}

// inputRecord reads the input record at source (topic/partition/offset).
func (p *Pipeline) inputRecord(ctx context.Context, source string) (sinks.Message, bool) {
	rest, ok := strings.CutPrefix(source, p.cfg.Input+"/")
	if !ok {
		return sinks.Message{}, false
	}
	part, off, ok := strings.Cut(rest, "/")
	if !ok {
		return sinks.Message{}, false
	}
	partition, err1 := strconv.Atoi(part)
	offset, err2 := strconv.ParseInt(off, 10, 64)
	if err1 != nil || err2 != nil {
		return sinks.Message{}, false
	}
	recs, _, err := p.cfg.Broker.Fetch(ctx, p.cfg.Input, partition, offset, 10*time.Millisecond)
	if err != nil || len(recs) == 0 || recs[0].Offset != offset {
		return sinks.Message{}, false
	}
	return recs[0].Message, true
}

// conflictPaths names the fields that differ from the first copy. The
// first copy is in this batch, or read back from the input at the source
// the store recorded (while the topic's retention keeps it).
func (p *Pipeline) conflictPaths(ctx context.Context, o *dedupe.Outcome, cur *dedupe.Record, recs []dedupe.Record, results []resultWork, firstIn map[string]int) []string {
	var first []byte
	if j, ok := firstIn[o.Key]; ok {
		first = recs[results[j].rec].Value
	} else if msg, ok := p.inputRecord(ctx, o.Decision.Entry.FirstSource); ok {
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

func (p *Pipeline) writeReplies(ctx context.Context, pz *pauser, recs []dedupe.Record, results []resultWork, replies []replyWork) error {
	var msgs []sinks.Message
	for _, r := range replies {
		var stored sinks.Message
		if r.first >= 0 {
			stored = results[r.first].msg
		} else {
			var ok bool
			if stored, ok = p.storedResult(ctx, r.ref); !ok {
				continue
			}
		}
		msgs = append(msgs, sinks.Reply(p.cfg.Replies, stored, &recs[r.rec]))
	}
	if len(msgs) == 0 {
		return nil
	}
	_, err := p.writeOutputs(ctx, pz, msgs, nil, nil)
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
func (p *Pipeline) logBurst(reasons map[dedupe.Reason]int, rulesChanged int) {
	if rulesChanged > 0 {
		p.log.Info("rules_changed: fingerprints made under other rules decided as replays", "records", rulesChanged)
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
