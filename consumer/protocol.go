package consumer

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemstream/idemstream/internal/retry"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/envelope"
	"github.com/idemstream/idemstream/internal/partition"
	"github.com/idemstream/idemstream/sinks"
)

// This file is the result protocol of doc.go ("The result protocol"): how
// the first copies of one batch get exactly one result each. The batch
// loop (batch.go) runs the handler and writes dead letters and replies;
// everything that makes a result exactly-once happens here, in the order
// of the steps below.

// stage is where one first copy stands in the protocol. What a batch that
// ends early (revoked, fenced, the pipeline stopping) does with a first
// copy depends only on its stage (see abandon).
type stage int

const (
	// stageDecided: PENDING under this holder's token, nothing sent.
	stageDecided stage = iota
	// stageFound: the scan found the result an earlier owner wrote.
	stageFound
	// stageHandled: the handler produced the result; not sent.
	stageHandled
	// stageFailed: the handler failed for good, or the broker refused the
	// result record for good; nothing was appended.
	stageFailed
	// stageSent: a write was sent and its outcome is unknown.
	stageSent
	// stageWritten: the broker acknowledged the result.
	stageWritten
)

// firstCopy is one key this holder decided first in the batch.
type firstCopy struct {
	rec     int // index in the batch
	key     string
	owner   dedupe.Owner
	resumed bool
	// intent is where the result goes: the partition recorded with the
	// PENDING state (never recomputed once recorded) and its floor.
	intent dedupe.Intent
	// decision names the entry's decision (dedupe.Entry.DecisionID): the
	// scan takes a result for this key's only when it carries it.
	decision string
	stage    stage
	msg      sinks.Message
	result   dedupe.ResultRef
	reason   dedupe.Reason // stageFailed: the dead letter's reason
	err      error         // stageFailed: why
	// deadLettered: stageFailed, and the dead letter was acknowledged.
	// An abandoned batch then completes the key FAILED: released, its
	// record read again would run the handler again, and one input could
	// get a dead letter and a result.
	deadLettered bool
}

// results runs the protocol for the first copies of one batch.
type results struct {
	p      *Pipeline
	pz     *pauser
	holder string
	recs   []dedupe.Record
	outs   []dedupe.Outcome
	firsts []*firstCopy
	byRec  map[int]*firstCopy
	// leaseFrom is a local time no later than the store's start of the
	// batch's leases (taken before the call that set them): every lease
	// of the batch lasts at least until leaseFrom plus the lease.
	leaseFrom time.Time
	// floors are the output's end offsets read for the fetch this batch
	// came in, shared by its batches: read before any of them was
	// decided, they are floors for all.
	floors *floors
	// wait: records whose key another holder owns are waited for (the
	// second phase of a batch); otherwise they are deferred.
	wait     bool
	deferred []int
	// intent is the IntentFunc of the last decision (the floors it read).
	intent dedupe.IntentFunc
	// tail: the completions after the first deferred record (complete).
	tail []dedupe.Completion
}

// floors are the end offsets of the output partitions at one moment.
type floors struct {
	n    int
	ends map[int]int64
	read time.Time // zero: not read yet
}

// floorsMaxAge is how long the floors of a fetch serve its later batches.
// The older a floor, the further back a scan reads, and the more room for
// a result of the key's previous window to pass for this one's (doc.go).
const floorsMaxAge = 2 * time.Second

// writeBudget is the longest one write of a batch's results may take (the
// Kafka client's timeout): a lease must outlast it plus SettleWait.
const writeBudget = 10 * time.Second

func (p *Pipeline) newResults(pz *pauser, holder string, recs []dedupe.Record, fl *floors, wait bool) *results {
	return &results{p: p, pz: pz, holder: holder, recs: recs, byRec: map[int]*firstCopy{}, floors: fl, wait: wait}
}

// Step 1 and 2: read the floors (shared by a fetch's batches for at most
// floorsMaxAge), then decide the batch, recording with every PENDING key
// the partition its result will go to and that partition's end offset.
// Store and broker failures pause the partition and try again; a refusal
// that cannot pass is returned.
func (r *results) decide(ctx context.Context) error {
	p := r.p
	for attempt := 0; ; attempt++ {
		r.leaseFrom = time.Now()
		var err error
		if attempt > 0 || r.floors.read.IsZero() || time.Since(r.floors.read) > floorsMaxAge {
			r.floors.n, r.floors.ends, err = p.floors(ctx)
			r.floors.read = time.Time{}
			if err == nil {
				r.floors.read = r.leaseFrom
			}
		}
		nOut, floors := r.floors.n, r.floors.ends
		if err == nil {
			intent := func(rec *dedupe.Record, key string) dedupe.Intent {
				q := partition.For(envelope.ResultKey(rec, key), nOut)
				return dedupe.Intent{Partition: int32(q), Floor: floors[q]}
			}
			r.intent = intent
			var outs []dedupe.Outcome
			if r.wait {
				outs, err = p.cfg.Decider.Decide(ctx, r.holder, r.recs, intent)
			} else {
				outs, r.deferred, err = p.cfg.Decider.DecideAvailable(ctx, r.holder, r.recs, intent)
			}
			// Keys decided before an error are this holder's already:
			// abandon releases them if the batch ends here.
			r.track(outs, nOut)
			if err == nil {
				r.outs = outs
				r.pz.resume()
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !dedupe.IsRetryable(err) {
			return fmt.Errorf("decide: %w", err)
		}
		r.pz.pause(ctx, "decide", err)
	}
}

// track records the first copies of an attempt's outcomes. A retried
// attempt decides again what the failed one did (a key it held may have
// been taken over meanwhile): its answer replaces the older one, which is
// kept only for records it left undecided, so that abandon still releases
// them.
func (r *results) track(outs []dedupe.Outcome, nOut int) {
	old := r.byRec
	r.byRec, r.firsts = make(map[int]*firstCopy, len(old)+len(outs)), r.firsts[:0]
	// The attempt's first copies in one array: one allocation, not one
	// each. A new array per attempt, as the older attempt's are kept.
	n := 0
	for i := range outs {
		if outs[i].Kind == dedupe.OutcomeFirst {
			n++
		}
	}
	slab := make([]firstCopy, n)
	for i := range r.recs {
		var o *dedupe.Outcome
		if i < len(outs) {
			o = &outs[i]
		}
		if o == nil || o.Kind == "" {
			if fc := old[i]; fc != nil {
				r.firsts = append(r.firsts, fc)
				r.byRec[i] = fc
			}
			continue
		}
		if o.Kind != dedupe.OutcomeFirst {
			continue
		}
		fc := &slab[0]
		slab = slab[1:]
		*fc = r.firstCopyOf(i, o, nOut)
		r.firsts = append(r.firsts, fc)
		r.byRec[i] = fc
	}
}

// firstCopyOf is the first copy of record i, decided first in o.
func (r *results) firstCopyOf(i int, o *dedupe.Outcome, nOut int) firstCopy {
	rec := &r.recs[i]
	intent := o.Decision.Entry.Intent
	if intent.Partition < 0 {
		// No partition recorded (an entry from before intents):
		// chosen now, with this batch's floor, below anything this
		// holder writes for it.
		q := partition.For(envelope.ResultKey(rec, o.Key), nOut)
		intent.Partition, intent.Floor = int32(q), dedupe.NoPosition
		if f, ok := r.floors.ends[q]; ok {
			intent.Floor = f
		}
	}
	return firstCopy{rec: i, key: o.Key, owner: dedupe.Owner{Holder: r.holder, Source: sameSource(rec, o.Decision.Entry.Owner.Source)},
		resumed: o.Decision.Resumed, intent: intent, decision: o.Decision.Entry.DecisionID()}
}

// sameSource is rec.Source(), as named when named spells it: the decision
// made the entry's owner from the same record, and a second copy of the
// string would be an allocation per first copy.
func sameSource(rec *dedupe.Record, named string) string {
	var buf [80]byte
	if string(rec.AppendSource(buf[:0])) == named {
		return named
	}
	return rec.Source()
}

// Step 2b: a strict conflict against an entry made under other rules, on
// a decision that would have acted on the key (rerun a FAILED key, take a
// PENDING one over), is checked against the first copy under the current
// rules. The same request, or a first copy the input no longer holds, is
// decided again with the store told so; a real conflict stays one.
func (r *results) checkRules(ctx context.Context) error {
	p := r.p
	var idx []int
	for i := range r.outs {
		o := &r.outs[i]
		if !p.cfg.Decider.NeedsRulesCheck(o) {
			continue
		}
		conflict, err := p.conflictUnderCurrentRules(ctx, r.pz, o, &r.recs[i])
		if err != nil {
			return err
		}
		if !conflict {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	recs := make([]dedupe.Record, len(idx))
	for j, i := range idx {
		recs[j] = r.recs[i]
	}
	var outs []dedupe.Outcome
	var deferred []int
	err := r.pz.retryStore(ctx, "decide", func() (err error) {
		outs, deferred, err = p.cfg.Decider.DecideRulesChecked(ctx, r.holder, recs, r.intent, r.wait)
		return err
	})
	if err != nil {
		return err
	}
	for j, i := range idx {
		r.outs[i] = outs[j]
		if outs[j].Kind == dedupe.OutcomeFirst {
			fc := new(firstCopy)
			*fc = r.firstCopyOf(i, &r.outs[i], r.floors.n)
			r.firsts = append(r.firsts, fc)
			r.byRec[i] = fc
		}
	}
	for _, j := range deferred {
		r.deferred = append(r.deferred, idx[j])
	}
	sort.Ints(r.deferred)
	return nil
}

// Step 3: a resumed key (its own redelivered record, a released key, an
// expired lease taken over) may have its result written already: scan
// each intended partition once, from the lowest floor of the batch.
func (r *results) recover(ctx context.Context) error {
	var resumed []*firstCopy
	for _, fc := range r.firsts {
		if fc.resumed && fc.intent.Floor >= 0 {
			resumed = append(resumed, fc)
		}
	}
	found, err := r.p.scanFor(ctx, r.pz, resumed)
	if err != nil {
		return err
	}
	for fc, w := range found {
		fc.stage, fc.result = stageFound, dedupe.ResultRef{Partition: int32(w.Partition), Offset: w.Offset}
	}
	return nil
}

// handled and failed record the handler's answer (batch.go runs it).
func (fc *firstCopy) handled(msg sinks.Message) { fc.stage, fc.msg = stageHandled, msg }

func (fc *firstCopy) failed(reason dedupe.Reason, err error) {
	fc.stage, fc.reason, fc.err = stageFailed, reason, err
}

// Step 4: write the results. Before every attempt the leases of the keys
// about to be written must have SettleWait plus WriteTimeout left, so that
// however long a recovery takes, no successor can scan before this write
// is visible: they are renewed when less may be left (a slow handler, a
// long wait for a key held elsewhere, a retried write), and a key lost
// meanwhile fences the batch. While more is left nobody can have taken a
// key over, and the renewal, a store round trip per batch, is skipped. A write that may have been appended is never repeated
// blindly: the partition waits SettleWait, scans, and writes only what is
// missing. A result the broker refuses for good (too large) becomes a
// dead letter; a refusal of the topic itself stops the pipeline.
func (r *results) write(ctx context.Context) error {
	var todo []*firstCopy
	for _, fc := range r.firsts {
		if fc.stage == stageHandled {
			todo = append(todo, fc)
		}
	}
	for len(todo) > 0 {
		if time.Since(r.leaseFrom)+r.p.cfg.SettleWait+r.p.cfg.WriteTimeout >= r.p.policy.Lease() {
			from := time.Now()
			if err := r.renew(ctx, todo); err != nil {
				return err
			}
			r.leaseFrom = from
		}
		msgs := make([]sinks.Message, len(todo))
		for j, fc := range todo {
			msgs[j], fc.stage = fc.msg, stageSent
		}
		// A write may be several requests: it must end while the leases
		// still outlast SettleWait, however slow the broker, so that a
		// successor, which scans only once they ran out, finds it. The
		// renewal above leaves it WriteTimeout at least.
		wctx, cancel := context.WithDeadline(ctx, r.leaseFrom.Add(r.p.policy.Lease()-r.p.cfg.SettleWait))
		written, werr := r.p.cfg.Broker.Write(wctx, msgs)
		cancel()
		if werr == nil {
			for j, fc := range todo {
				fc.wrote(written[j])
			}
			r.pz.resume()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		again, unknown, err := r.sortWrites(todo, written, werr)
		if err != nil {
			return err
		}
		if len(again) == 0 {
			r.pz.resume()
			return nil
		}
		r.pz.pause(ctx, "write", werr)
		if err := r.settle(ctx, unknown); err != nil {
			return err
		}
		todo = todo[:0]
		for _, fc := range again {
			if fc.stage == stageHandled {
				todo = append(todo, fc)
			}
		}
	}
	return nil
}

// writtenAt is what became of write j of a call that answered written
// and err: its own answer, or err where the call answered for none.
func writtenAt(written []sinks.Written, j int, err error) sinks.Written {
	if written != nil {
		return written[j]
	}
	return sinks.Written{Offset: dedupe.NoPosition, Err: err}
}

// sortWrites sorts the results of a write that failed (werr) by what
// became of each: written; maybe appended (unknown, to be looked for) or
// refused for now, both to be written again (again); refused for good,
// the first copy failed. A refusal of the topic itself is the error.
func (r *results) sortWrites(todo []*firstCopy, written []sinks.Written, werr error) (again, unknown []*firstCopy, err error) {
	for j, fc := range todo {
		w := writtenAt(written, j, werr)
		switch {
		case w.Err == nil && w.Offset >= 0:
			fc.wrote(w)
		case errors.Is(w.Err, sinks.ErrAmbiguous):
			again, unknown = append(again, fc), append(unknown, fc)
		case dedupe.Classify(w.Err) == dedupe.Poison:
			fc.failed(dedupe.ReasonOf(w.Err), fmt.Errorf("the broker refused the result record: %w", w.Err))
		case dedupe.IsRetryable(w.Err):
			fc.stage = stageHandled // refused for now: nothing appended
			again = append(again, fc)
		default:
			return nil, nil, fmt.Errorf("write results to %s: %w", r.p.cfg.Output, w.Err)
		}
	}
	return again, unknown, nil
}

// settle waits SettleWait and looks for the results that may have been
// appended: one found was written; one absent was not, and is written
// again.
func (r *results) settle(ctx context.Context, unknown []*firstCopy) error {
	if len(unknown) == 0 {
		return nil
	}
	if err := retry.Sleep(ctx, r.p.cfg.SettleWait); err != nil {
		return err
	}
	found, err := r.p.scanFor(ctx, r.pz, unknown)
	if err != nil {
		return err
	}
	for _, fc := range unknown {
		if w, ok := found[fc]; ok {
			fc.wrote(w)
		} else {
			fc.stage = stageHandled // settled and absent: not appended
		}
	}
	return nil
}

func (fc *firstCopy) wrote(w sinks.Written) {
	fc.stage, fc.result = stageWritten, dedupe.ResultRef{Partition: int32(w.Partition), Offset: w.Offset}
}

// renew extends the leases of the keys about to be written; a key taken
// over meanwhile fences the whole batch, which is then read again.
func (r *results) renew(ctx context.Context, fcs []*firstCopy) error {
	rs := make([]*dedupe.Record, len(fcs))
	os := make([]*dedupe.Outcome, len(fcs))
	for j, fc := range fcs {
		rs[j], os[j] = &r.recs[fc.rec], &r.outs[fc.rec]
	}
	var lost []bool
	err := r.pz.retryStore(ctx, "renew", func() (err error) {
		lost, err = r.p.cfg.Decider.Renew(ctx, r.holder, rs, os)
		return err
	})
	if err != nil {
		return err
	}
	for j, l := range lost {
		if l {
			return fmt.Errorf("%w: key %s was taken over before its result was written", errFenced, fcs[j].key)
		}
	}
	return nil
}

// Step 5: record every first copy's end in the store: SUCCESS with the
// result's offset, or FAILED. Only the owner token may; a refusal means
// another worker took a key over, and the batch must not commit.
func (r *results) complete(ctx context.Context) error {
	comps := make([]dedupe.Completion, 0, len(r.firsts))
	for _, fc := range r.firsts {
		switch fc.stage {
		case stageFound, stageWritten:
			c := r.completion(fc, dedupe.Success)
			comps = append(comps, c)
			if len(r.deferred) > 0 && r.recs[fc.rec].Offset > r.firstDeferred() {
				// Committed only once the records that wait for a key
				// held elsewhere are decided: kept longer if that phase
				// is abandoned (processBatch).
				r.tail = append(r.tail, c)
			}
		case stageFailed:
			comps = append(comps, r.completion(fc, dedupe.Failed))
		default:
			return fmt.Errorf("complete: key %s is at stage %d, not finished", fc.key, fc.stage)
		}
	}
	return r.p.complete(ctx, r.pz, comps)
}

func (r *results) completion(fc *firstCopy, st dedupe.State) dedupe.Completion {
	c := dedupe.Completion{Namespace: r.p.cfg.Name, Key: fc.key, Owner: fc.owner, State: st,
		Result: dedupe.ResultRef{Partition: -1, Offset: dedupe.NoPosition}}
	switch st {
	case dedupe.Success:
		c.Result, c.KeepAtLeast = fc.result, r.p.policy.Window
	case dedupe.Failed:
		c.FailedTTL = r.p.policy.FailedTTL
	}
	return c
}

// firstDeferred is the offset of the first record that waits for a key
// held elsewhere; the batch commits up to it before it waits.
func (r *results) firstDeferred() int64 {
	first := r.recs[r.deferred[0]].Offset
	for _, i := range r.deferred {
		first = min(first, r.recs[i].Offset)
	}
	return first
}

// abandonTimeout bounds the store call of abandon, which runs after the
// batch's own context ended.
const abandonTimeout = 3 * time.Second

// abandon leaves the store as the next holder needs it when a batch ends
// before step 5: keys whose result was acknowledged or found are
// completed; keys for which nothing was sent are released, so that the
// next holder takes them over at once instead of waiting for the lease;
// keys with a write of unknown outcome are left to their lease, after
// which the next owner scans for the result.
func (r *results) abandon() (released, completed, leased int) {
	var comps []dedupe.Completion
	for _, fc := range r.firsts {
		switch fc.stage {
		case stageFound, stageWritten:
			// The batch will be read again, maybe much later (the
			// pipeline stopped): the entry must outlive its window until
			// then, or its record would be decided first again. A SUCCESS
			// entry answers its own record as a replay while it is stored.
			c := r.completion(fc, dedupe.Success)
			c.KeepAtLeast = max(c.KeepAtLeast, dedupe.PendingRetention)
			comps = append(comps, c)
			completed++
		case stageFailed:
			if fc.deadLettered {
				comps = append(comps, r.completion(fc, dedupe.Failed))
				completed++
				continue
			}
			comps = append(comps, r.completion(fc, dedupe.Pending))
			released++
		case stageDecided, stageHandled:
			comps = append(comps, r.completion(fc, dedupe.Pending))
			released++
		case stageSent:
			leased++
		}
	}
	if len(comps) == 0 {
		return released, completed, leased
	}
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	if _, err := r.p.cfg.Store.Complete(ctx, comps); err != nil {
		r.pz.log.Warn("abandoned batch: the store did not answer; its keys wait for their lease", "err", err)
		return 0, 0, leased + len(comps)
	}
	return released, completed, leased
}

// scanFor reads each output partition that fcs intend once, from the
// lowest of their floors to its end, and returns where a result of this
// pipeline for each key stands. A result matches by its idemstream-key
// header and by its idemstream-source naming this pipeline's input, and
// config refuses two pipelines writing one output topic.
func (p *Pipeline) scanFor(ctx context.Context, pz *pauser, fcs []*firstCopy) (map[*firstCopy]sinks.Written, error) {
	byPartition := map[int32][]*firstCopy{}
	for _, fc := range fcs {
		byPartition[fc.intent.Partition] = append(byPartition[fc.intent.Partition], fc)
	}
	found := map[*firstCopy]sinks.Written{}
	for q, group := range byPartition {
		floor := group[0].intent.Floor
		want := map[string]string{}
		for _, fc := range group {
			floor = min(floor, fc.intent.Floor)
			want[fc.key] = fc.decision
		}
		hits, err := p.scan(ctx, pz, int(q), floor, want)
		if err != nil {
			return nil, err
		}
		for _, fc := range group {
			if w, ok := hits[fc.key]; ok {
				found[fc] = w
			}
		}
	}
	return found, nil
}

// scan reads output partition q from floor up to its high watermark and
// returns the first result of each wanted key (want maps a key to its
// decision, see resultOf). A floor the partition no longer holds
// (retention, DeleteRecords) is counted and the scan starts at the log
// start: what was deleted cannot be found by anyone.
func (p *Pipeline) scan(ctx context.Context, pz *pauser, q int, floor int64, want map[string]string) (map[string]sinks.Written, error) {
	hits := map[string]sinks.Written{}
	prefix := p.cfg.Input + "/"
	offset := floor
	empty := 0 // fetches that returned nothing below the high watermark
	for len(hits) < len(want) {
		recs, hw, err := p.cfg.Broker.Fetch(ctx, p.cfg.Output, q, offset, 10*time.Millisecond)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, kafka.OffsetOutOfRange) {
				start, serr := p.logStart(ctx, q)
				if serr == nil && start > offset {
					p.log.Warn("scan: floor below the partition's log start; scanning from the log start (records between were deleted)",
						"partition", q, "floor", offset, "log_start", start)
					if m := p.cfg.Metrics; m != nil {
						m.scanFloorTruncated.WithLabelValues(p.cfg.Name).Inc()
					}
					offset = start
					continue
				}
				if serr == nil {
					return hits, nil // past the end: nothing more to find
				}
				err = serr
			}
			if !dedupe.IsRetryable(err) {
				return nil, fmt.Errorf("scan %s/%d: %w", p.cfg.Output, q, err)
			}
			pz.pause(ctx, "scan", err)
			continue
		}
		for _, rec := range recs {
			key, _ := sinks.HeaderValue(rec.Headers, sinks.HeaderKey)
			decision, ok := want[key]
			if !ok {
				continue
			}
			if _, seen := hits[key]; seen {
				continue
			}
			if !resultOf(rec.Headers, prefix, decision) {
				continue
			}
			hits[key] = sinks.Written{Partition: q, Offset: rec.Offset}
		}
		if len(recs) == 0 {
			if offset >= hw {
				break
			}
			// Nothing returned below the high watermark: a record absent
			// from an unread stretch must not pass for one never written.
			// The partition pauses and reads the stretch again.
			if empty++; empty > 20 {
				pz.pause(ctx, "scan", fmt.Errorf("scan %s/%d: no records from %d below the high watermark %d: %w",
					p.cfg.Output, q, offset, hw, dedupe.ErrBrokerUnavailable))
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				empty = 0
			}
			continue
		}
		empty = 0
		if recs[len(recs)-1].Offset+1 >= hw {
			break
		}
		offset = recs[len(recs)-1].Offset + 1
	}
	return hits, nil
}

// resultOf reports whether a record of the output is the result of the
// decision named: its idemstream-source is on this pipeline's input
// (prefix), and its idemstream-decision names the decision. A result with
// no idemstream-decision was written by a release before it, and is
// matched by key and source alone, as that release did: a key of the
// previous window could pass for this one's only with such a result.
func resultOf(hs []dedupe.Header, prefix, decision string) bool {
	if src, _ := sinks.HeaderValue(hs, sinks.HeaderSource); !strings.HasPrefix(src, prefix) {
		return false
	}
	d, ok := sinks.HeaderValue(hs, sinks.HeaderDecision)
	return !ok || d == decision
}

func (p *Pipeline) logStart(ctx context.Context, q int) (int64, error) {
	starts, err := p.cfg.Broker.StartOffsets(ctx, p.cfg.Output, []int{q})
	if err != nil {
		return 0, err
	}
	start, ok := starts[q]
	if !ok {
		return 0, fmt.Errorf("no log start offset for %s/%d: %w", p.cfg.Output, q, dedupe.ErrBrokerUnavailable)
	}
	return start, nil
}
