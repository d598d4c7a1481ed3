package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/decide"
)

// Decide implements dedupe.Store.
//
// Most records carry a key the store has never seen, and for those the
// decision is a plain SET NX: one native command, no script. So a batch
// takes up to three round trips: TIME (the server's clock, which every
// new entry is stamped with), the SET NX of the first record of each key,
// then one decide.lua call per group for the records whose key already
// existed and for later records of a key within the batch (so that records
// of one key are decided in order).
func (s *Store) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	reqs = eventTimesAsScripts(reqs)
	names := make([]string, len(reqs))
	for i, r := range reqs {
		if err := checkFields(r); err != nil {
			return nil, err
		}
		names[i] = s.redisKey(r.Namespace, r.Key)
	}
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	out := make([]dedupe.Decision, len(reqs))
	// A renewal must not create an entry: no SET NX for it. Nor does a
	// Cluster take the SET NX path: its entries carry absolute times (the
	// lease, the window, the expiry) read from one clock, TIME of one
	// node, while each entry lives on the master of its slot, whose
	// scripts compare them with that master's own clock. decide.lua reads
	// the clock of the node that holds the entry.
	if len(reqs) < fastPathMin || reqs[0].RenewOnly || s.isCluster() {
		all := make([]int, len(reqs))
		for i := range all {
			all[i] = i
		}
		if err := s.decideScripted(ctx, reqs, names, all, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	b := &fastBatch{s: s, reqs: reqs, names: names, out: out}
	if err := b.run(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// fastBatch is one Decide call on the SET NX path, step by step: the SET
// NX of each key's first record (setNX), the reads of the keys that
// existed (decideRead), the later records of a key decided from what is
// known of it (later), and decide.lua for every record that writes.
type fastBatch struct {
	s     *Store
	reqs  []dedupe.DecideRequest
	names []string
	out   []dedupe.Decision
	// now is the store's clock, read (at timeRead, on this clock) before
	// the SET NX.
	now, timeRead time.Time
	// known holds the entries whose state after this batch's decisions
	// so far is known here exactly: created by the SET NX, or read and
	// left unchanged.
	known map[string]*dedupe.Entry
	// fromRead holds, per key, the records decided from a read so far:
	// when a later record of the key needs the script, they go with it,
	// so that every record of a key is decided against one state of its
	// entry. (Another holder may change it between the read and the
	// script: a record judged against the older state and a later one
	// against the newer would be decided out of order. A decision from a
	// read writes nothing, so deciding it again is safe.)
	fromRead map[string][]int
	// slow are the records decide.lua decides.
	slow []int
}

func (b *fastBatch) run(ctx context.Context) error {
	b.timeRead = time.Now()
	nowMs, err := b.s.client.Time(ctx).Result()
	if err != nil {
		return classify("decide", err)
	}
	b.now = time.UnixMilli(nowMs.UnixMilli())
	b.known = make(map[string]*dedupe.Entry, len(b.reqs))
	b.fromRead = map[string][]int{}
	existing, later, err := b.setNX(ctx)
	if err != nil {
		return err
	}
	if len(existing) > 0 {
		scripted, err := b.s.decideRead(ctx, b.reqs, b.names, existing, b.now, b.timeRead, b.out, b.known)
		if err != nil {
			return err
		}
		b.slow = append(b.slow, scripted...)
		for _, i := range existing {
			if _, ok := b.known[b.names[i]]; ok {
				b.fromRead[b.names[i]] = append(b.fromRead[b.names[i]], i)
			}
		}
	}
	if b.s.hooks.afterDecideRead != nil {
		b.s.hooks.afterDecideRead()
	}
	b.later(later)
	if len(b.slow) == 0 {
		return nil
	}
	sort.Ints(b.slow)
	return b.s.decideScripted(ctx, b.reqs, b.names, b.slow, b.out)
}

// setNX writes the entry of each key's first record with SET NX, and
// returns the records whose key existed and the later records of a key
// in the batch.
func (b *fastBatch) setNX(ctx context.Context) (existing, later []int, err error) {
	seen := make(map[string]struct{}, len(b.reqs))
	fast := make([]*redis.StatusCmd, len(b.reqs))
	args := newSetArgs(len(b.reqs), 1)
	var fastCmds []redis.Cmder
	var fastKeys []string
	// One pooled buffer for every value of the batch: building these is
	// the hot path of a large batch. The pipeline is done with it when
	// Exec returns.
	bp := valueBuffers.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() {
		*bp = buf[:0]
		valueBuffers.Put(bp)
	}()
	for i, r := range b.reqs {
		if _, dup := seen[b.names[i]]; dup {
			continue
		}
		seen[b.names[i]] = struct{}{}
		// The entry the key gets if the SET NX succeeds, which it does
		// for most: built in place.
		b.out[i].Entry = newEntry(r, b.now)
		start := len(buf)
		buf = b.s.appendEntry(buf, &b.out[i].Entry)
		fast[i] = redis.NewStatusCmd(ctx, args.set(i, &b.names[i], buf[start:len(buf):len(buf)], b.out[i].Entry.RetainUntil().UnixMilli(), "NX")...)
		fastCmds, fastKeys = append(fastCmds, fast[i]), append(fastKeys, b.names[i])
	}
	execErr, ackErr := b.s.roundTrips(ctx, "decide", fastKeys, fastCmds)
	if execErr != nil && !errors.Is(execErr, redis.Nil) {
		return nil, nil, classify("decide", execErr)
	}
	if ackErr != nil {
		return nil, nil, ackErr
	}
	// Only completeCAS takes what the SET NX wrote.
	remember := casState(b.s.cas.Load()) == casSupported && !b.s.waits("complete")
	for i, cmd := range fast {
		if cmd == nil {
			later = append(later, i)
			continue
		}
		switch err := cmd.Err(); {
		case err == nil:
			b.out[i].Verdict = dedupe.VerdictFirst
			b.known[b.names[i]] = &b.out[i].Entry
			if remember {
				b.s.written.put(b.names[i], args.value(i), &b.out[i].Entry)
			}
		case errors.Is(err, redis.Nil):
			existing = append(existing, i)
		default:
			return nil, nil, classify("decide", err)
		}
	}
	return existing, later, nil
}

// later decides the later records of a key decided above in this batch
// (a retry close behind its first copy) from the known entry when that
// changes nothing (a replay or a conflict against this holder's own
// PENDING entry); once one of a key's records needs the script, the
// key's later ones follow it there, in order.
func (b *fastBatch) later(later []int) {
	stale := time.Since(b.timeRead) > readMargin/2
	for _, i := range later {
		name := b.names[i]
		e := b.known[name]
		// Another key can share the name (namespace "a:b" with key "c",
		// namespace "a" with "b:c"): such a record goes to the script,
		// which refuses an entry that holds another key (decideRead sends
		// it there too).
		if e == nil || e.Key != b.reqs[i].Key || stale || nearBoundary(e, b.reqs[i], b.now) {
			b.toScript(i)
			continue
		}
		dec, next := decide.Decide(e, b.reqs[i], b.now)
		if next != nil {
			b.toScript(i)
			continue
		}
		dec.Entry.Now = b.now
		b.out[i] = dec
		if _, ok := b.fromRead[name]; ok {
			b.fromRead[name] = append(b.fromRead[name], i)
		}
	}
}

// toScript sends record i to decide.lua, with the records of its key
// decided from a read, and every later record of its key after it.
func (b *fastBatch) toScript(i int) {
	name := b.names[i]
	delete(b.known, name)
	b.slow = append(b.slow, b.fromRead[name]...)
	delete(b.fromRead, name)
	b.slow = append(b.slow, i)
}

// decideRead decides the records whose key exists (their SET NX failed)
// from a plain GET of each entry, where the decision changes nothing:
// a replay, a conflict, a key pending elsewhere. Such a decision is a read,
// as true at the GET as decide.lua's would be, and costs the server a GET
// instead of a script. It returns the records decide.lua must decide: those
// whose decision writes (a takeover, a rerun, a resume, an expired entry)
// and those whose entry is within a second of a boundary of the store's
// clock (expiry, window end, lease end), since now was read before the GET.
func (s *Store) decideRead(ctx context.Context, reqs []dedupe.DecideRequest, names []string, idx []int, now, timeRead time.Time,
	out []dedupe.Decision, known map[string]*dedupe.Entry) ([]int, error) {
	pipe := s.client.Pipeline()
	gets := make([]*redis.StringCmd, len(idx))
	for j, i := range idx {
		gets[j] = pipe.Get(ctx, names[i])
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, classify("decide", err)
	}
	// The clock read before the SET NX must still be within the margin of
	// the store's clock at the GETs.
	stale := time.Since(timeRead) > readMargin/2
	var scripted []int
	for j, i := range idx {
		raw, err := gets[j].Result()
		if stale || err != nil {
			scripted = append(scripted, i)
			continue
		}
		cur, err := decodeEntry(now.UnixMilli(), raw, (s.requestContext(names[i], reqs[i])))
		if err != nil || cur.Key != reqs[i].Key || nearBoundary(&cur, reqs[i], now) {
			scripted = append(scripted, i)
			continue
		}
		dec, next := decide.Decide(&cur, reqs[i], now)
		if next != nil {
			scripted = append(scripted, i)
			continue
		}
		dec.Entry.Now = now
		out[i] = dec
		known[names[i]] = &cur
	}
	return scripted, nil
}

// pipelineChunk bounds the commands of one round trip of Decide's SET NX.
// A round trip's timeout is fixed, and under appendfsync always (which
// decisions need to survive a restart) its time grows with its bytes:
// Redis reads a client's input 16 KiB at a time and fsyncs before it
// answers what it read, so one round trip of 1,000 entries took 25 and
// 26 fsyncs (strace of redis-server 7.0), against about 14 for 500. The
// chunks go side by side, each on a connection of its own, and one fsync
// covers what Redis read from all of them: the same 1,000 entries took
// 13 fsyncs in two chunks.
const pipelineChunk = 512

// roundTrips is roundTrip in chunks of up to pipelineChunk commands, sent
// side by side. It returns the first error of a command other than
// redis.Nil (a SET NX that found its key), then the first
// acknowledgement error.
func (s *Store) roundTrips(ctx context.Context, op string, keys []string, cmds []redis.Cmder) (execErr, ackErr error) {
	if len(cmds) <= pipelineChunk {
		return s.roundTrip(ctx, op, keys, cmds)
	}
	n := (len(cmds) + pipelineChunk - 1) / pipelineChunk
	execErrs, ackErrs := make([]error, n), make([]error, n)
	acked := make([]bool, n)
	var wg sync.WaitGroup
	for c := range n {
		lo, hi := c*pipelineChunk, min((c+1)*pipelineChunk, len(cmds))
		wg.Go(func() {
			execErrs[c], ackErrs[c], acked[c] = s.sendAndWait(ctx, op, keys[lo:hi], cmds[lo:hi])
		})
	}
	wg.Wait()
	ackErr = firstErr(ackErrs)
	if s.waits(op) {
		s.noteAck(ackErr, !slices.Contains(acked, false))
	}
	for _, err := range execErrs {
		if err != nil && !errors.Is(err, redis.Nil) {
			return err, ackErr
		}
	}
	return nil, ackErr
}

// eventTimesAsScripts returns reqs with each event time as decide.lua
// keeps it: a Lua number, exact up to 2^53 ms (the year 287,396) and the
// nearest double beyond, within int64. A producer that stamps
// nanoseconds as milliseconds reaches that far; the window start that a
// result's header carries must be the one stored, or a resumed batch
// would not recognise its own result. Most calls have no such time and
// get reqs back as they are.
func eventTimesAsScripts(reqs []dedupe.DecideRequest) []dedupe.DecideRequest {
	var out []dedupe.DecideRequest
	for i := range reqs {
		t := reqs[i].EventTime
		if t.IsZero() {
			continue
		}
		ms := t.UnixMilli()
		if ms > -1<<53 && ms < 1<<53 {
			continue
		}
		if out == nil {
			out = slices.Clone(reqs)
		}
		out[i].EventTime = time.UnixMilli(luaMillis(ms))
	}
	if out == nil {
		return reqs
	}
	return out
}

// luaMillis is ms as the nearest double, as Lua's tonumber reads its
// digits, kept within int64: doubles near 2^63 are 1,024 apart, and the
// largest below it prints as an int64 too.
func luaMillis(ms int64) int64 {
	const top = 1<<63 - 1024
	f := float64(ms)
	if f >= 1<<63 {
		return top
	}
	return int64(f)
}

// readMargin is how close to a boundary of the store's clock a decision
// from a read may not be.
const readMargin = time.Second

func nearBoundary(e *dedupe.Entry, r dedupe.DecideRequest, now time.Time) bool {
	ts := []time.Time{e.ExpiresAt, e.RetainUntil(), e.LeaseUntil}
	if r.EventTime.IsZero() {
		ts = append(ts, e.WindowStart.Add(r.Window))
	}
	for _, t := range ts {
		if !t.IsZero() && t.Sub(now).Abs() < readMargin {
			return true
		}
	}
	return false
}

// decideScripted decides reqs[slow...] with decide.lua, filling out.
func (s *Store) decideScripted(ctx context.Context, reqs []dedupe.DecideRequest, names []string, slow []int, out []dedupe.Decision) error {
	slowNames := make([]string, len(slow))
	args := make([][]any, len(slow))
	for j, i := range slow {
		slowNames[j] = names[i]
	}
	// decide.lua may rewrite these entries (a takeover, a renewal): what
	// an earlier SET NX wrote is not theirs any more.
	s.written.forget(slowNames)
	for j, i := range slow {
		r := reqs[i]
		event := ""
		if !r.EventTime.IsZero() {
			event = strconv.FormatInt(r.EventTime.UnixMilli(), 10)
		}
		// decide.lua's final argument: 0 or 1, plus 2 for RulesChecked.
		final := "r"
		if !r.RenewOnly {
			n := 0
			if r.Final {
				n++
			}
			if r.RulesChecked {
				n += 2
			}
			final = strconv.Itoa(n)
		}
		args[j] = []any{r.Key, r.Fingerprint, r.Owner.Source,
			strconv.FormatInt(int64(r.Intent.Partition), 10), strconv.FormatInt(r.Intent.Floor, 10), event, final}
	}
	// What a batch shares travels once per script call.
	shared := func(j int) []any {
		r := reqs[slow[j]]
		return []any{string(r.Semantics), ms(r.Window), ms(r.Lease), r.Owner.Holder, r.RulesDigest, ms(dedupe.PendingRetention), s.scriptFormat()}
	}
	class := func(j int) string {
		r := reqs[slow[j]]
		return string(r.Semantics) + sep + ms(r.Window) + sep + ms(r.Lease) + sep + r.Owner.Holder + sep + r.RulesDigest
	}
	return s.runGroups(ctx, "decide", decideScript, slowNames, args, shared, class, func(idx []int, rep []any) error {
		if len(rep) != 1+3*len(idx) {
			return fmt.Errorf("decide: %d replies for %d records", len(rep), len(idx))
		}
		for n, j := range idx {
			i := slow[j]
			d, err := parseDecision(rep[0], rep[1+3*n:4+3*n], (s.requestContext(slowNames[j], reqs[i])))
			if err != nil {
				return fmt.Errorf("decide %q: %w", reqs[i].Key, err)
			}
			if d.Verdict == dedupe.VerdictFirst && str(rep[3+3*n]) == "" {
				d.Entry = newEntry(reqs[i], d.Entry.Now)
			}
			out[i] = d
		}
		return nil
	})
}
