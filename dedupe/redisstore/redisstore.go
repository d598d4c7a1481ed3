package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/decide"
)

// Each script is the shared entry.lua (clock, load, save) followed by
// its own body, so that the encoding of an entry is written once.
var (
	//go:embed entry.lua
	entrySrc string
	//go:embed decide.lua
	decideSrc string
	//go:embed complete.lua
	completeSrc string
	//go:embed lookup.lua
	lookupSrc string

	decideScript   = redis.NewScript(entrySrc + decideSrc)
	completeScript = redis.NewScript(entrySrc + completeSrc)
	lookupScript   = redis.NewScript(entrySrc + lookupSrc)
)

// maxKeyInName is the longest idempotency key kept verbatim in a Redis key
// name; longer keys are hashed so that names stay bounded.
const maxKeyInName = 64

// Store is a dedupe.Store on Redis. It is safe for concurrent use; it owns
// no goroutine and does not close the client.
type Store struct {
	client redis.UniversalClient
	prefix string
	acks   replicaAcks
	cas    atomic.Int32 // a casState
	// What the SET NX of Decide wrote, for completeCAS (written.go).
	written written
	// The generation marker the store decides under (marker.go).
	gen generation
}

// New returns a Store that names its keys under prefix.
func New(client redis.UniversalClient, prefix string, opts ...Option) *Store {
	s := &Store{client: client, prefix: prefix}
	for _, o := range opts {
		o(s)
	}
	return s
}

// redisKey is the name of the Redis string that holds a key's entry: the
// namespace and key in one hash tag, so that a Cluster keeps it on one
// slot; a key too long for a name is replaced by its SHA-256.
func (s *Store) redisKey(namespace, key string) string {
	if len(key) > maxKeyInName {
		sum := sha256.Sum256([]byte(key))
		key = "sha256:" + hex.EncodeToString(sum[:])
	}
	return s.prefix + ":{" + namespace + ":" + key + "}"
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// maxGroup bounds the records one script call decides, so that no call
// blocks the server for long.
const maxGroup = 512

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
	// A renewal must not create an entry: no SET NX for it. Nor does a
	// Cluster take the SET NX path: its entries carry absolute times (the
	// lease, the window, the expiry) read from one clock, TIME of one
	// node, while each entry lives on the master of its slot, whose
	// scripts compare them with that master's own clock. decide.lua reads
	// the clock of the node that holds the entry.
	_, cluster := s.client.(*redis.ClusterClient)
	if len(reqs) < fastPathMin || reqs[0].RenewOnly || cluster {
		all := make([]int, len(reqs))
		for i := range all {
			all[i] = i
		}
		out := make([]dedupe.Decision, len(reqs))
		if err := s.decideScripted(ctx, reqs, names, all, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	timeRead := time.Now()
	nowMs, err := s.client.Time(ctx).Result()
	if err != nil {
		return nil, classify("decide", err)
	}
	now := time.UnixMilli(nowMs.UnixMilli())

	out := make([]dedupe.Decision, len(reqs))
	slow := make([]int, 0, 8)
	seen := make(map[string]struct{}, len(reqs))
	fast := make([]*redis.Cmd, len(reqs))
	// The arguments of every SET NX in one backing array: a command's
	// own argument slice would be an allocation per record.
	const setArgs = 6
	args := make([]any, setArgs*len(reqs))
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
	for i, r := range reqs {
		if _, dup := seen[names[i]]; dup {
			continue
		}
		seen[names[i]] = struct{}{}
		// The entry the key gets if the SET NX succeeds, which it does
		// for most: built in place.
		out[i].Entry = newEntry(r, now)
		start := len(buf)
		buf = appendEntry(buf, &out[i].Entry)
		a := args[setArgs*i : setArgs*(i+1) : setArgs*(i+1)]
		a[0], a[1], a[2], a[3], a[4], a[5] = "SET", names[i], buf[start:len(buf):len(buf)], "NX", "PXAT", out[i].Entry.RetainUntil().UnixMilli()
		fast[i] = redis.NewCmd(ctx, a...)
		fastCmds, fastKeys = append(fastCmds, fast[i]), append(fastKeys, names[i])
	}
	execErr, ackErr := s.roundTrips(ctx, "decide", fastKeys, fastCmds)
	if execErr != nil && !errors.Is(execErr, redis.Nil) {
		return nil, classify("decide", execErr)
	}
	if ackErr != nil {
		return nil, ackErr
	}
	var existing, later []int
	// Only completeCAS takes what the SET NX wrote.
	remember := casState(s.cas.Load()) == casSupported && !s.waits("complete")
	// known holds the entries whose state after this batch's decisions so
	// far is known here exactly: created by the SET NX, or read and left
	// unchanged.
	known := make(map[string]*dedupe.Entry, len(reqs))
	for i, cmd := range fast {
		if cmd == nil {
			later = append(later, i)
			continue
		}
		switch err := cmd.Err(); {
		case err == nil:
			out[i].Verdict = dedupe.VerdictFirst
			known[names[i]] = &out[i].Entry
			if remember {
				s.written.put(names[i], args[setArgs*i+2].([]byte), &out[i].Entry)
			}
		case errors.Is(err, redis.Nil):
			existing = append(existing, i)
		default:
			return nil, classify("decide", err)
		}
	}
	// fromRead holds, per key, the records decided from a read so far:
	// when a later record of the key needs the script, they go with it,
	// so that every record of a key is decided against one state of its
	// entry. (Another holder may change it between the read and the
	// script: a record judged against the older state and a later one
	// against the newer would be decided out of order. A decision from a
	// read writes nothing, so deciding it again is safe.)
	fromRead := map[string][]int{}
	if len(existing) > 0 {
		scripted, err := s.decideRead(ctx, reqs, names, existing, now, timeRead, out, known)
		if err != nil {
			return nil, err
		}
		slow = append(slow, scripted...)
		for _, i := range existing {
			if _, ok := known[names[i]]; ok {
				fromRead[names[i]] = append(fromRead[names[i]], i)
			}
		}
	}
	if afterDecideRead != nil {
		afterDecideRead()
	}
	// A later record of a key decided above in this batch (a retry close
	// behind its first copy) is decided here from the known entry when
	// that changes nothing (a replay or a conflict against this holder's
	// own PENDING entry); once one of a key's records needs the script,
	// the key's later ones follow it there, in order.
	stale := time.Since(timeRead) > readMargin/2
	toScript := func(i int) {
		delete(known, names[i])
		slow = append(slow, fromRead[names[i]]...)
		delete(fromRead, names[i])
		slow = append(slow, i)
	}
	for _, i := range later {
		e := known[names[i]]
		// Another key can share the name (namespace "a:b" with key "c",
		// namespace "a" with "b:c"): such a record goes to the script,
		// which refuses an entry that holds another key (decideRead sends
		// it there too).
		if e == nil || e.Key != reqs[i].Key || stale || nearBoundary(e, reqs[i], now) {
			toScript(i)
			continue
		}
		dec, next := decide.Decide(e, reqs[i], now)
		if next != nil {
			toScript(i)
			continue
		}
		dec.Entry.Now = now
		out[i] = dec
		if _, ok := fromRead[names[i]]; ok {
			fromRead[names[i]] = append(fromRead[names[i]], i)
		}
	}
	sort.Ints(slow)
	if len(slow) == 0 {
		return out, nil
	}
	if err := s.decideScripted(ctx, reqs, names, slow, out); err != nil {
		return nil, err
	}
	return out, nil
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
		cur, err := decodeEntry(now.UnixMilli(), raw)
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

var valueBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// fastPathMin is the smallest batch worth the extra TIME round trip of the
// SET NX path; smaller batches go to decide.lua in one round trip.
const fastPathMin = 8

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
		return []any{string(r.Semantics), ms(r.Window), ms(r.Lease), r.Owner.Holder, r.RulesDigest}
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
			d, err := parseDecision(rep[0], rep[1+3*n:4+3*n])
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

// Complete implements dedupe.Store.
//
// On a single node (or a Sentinel master) a batch is finished with SET …
// IFEQ where the server has it (completeCAS), otherwise with plain
// commands under WATCH (completeWatched); on a cluster, for a small batch,
// or when another client changed one of the entries meanwhile, by
// complete.lua (completeScripted). Both apply decide.Complete's
// rules atomically per entry.
func (s *Store) Complete(ctx context.Context, comps []dedupe.Completion) ([]error, error) {
	if len(comps) == 0 {
		return nil, nil
	}
	names := make([]string, len(comps))
	for i, c := range comps {
		names[i] = s.redisKey(c.Namespace, c.Key)
	}
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	// With replica acknowledgement every call goes to the script: one
	// WAIT per node behind it, and a retry rewrites what it finds already
	// done, so that its WAIT covers the write a failed attempt made.
	if node, ok := s.client.(*redis.Client); ok && len(comps) >= fastPathMin && !s.waits("complete") {
		if s.hasCAS(ctx, node) {
			return s.completeCAS(ctx, node, comps, names)
		}
		s.written.forget(names)
		return s.completeWatched(ctx, node, comps, names)
	}
	s.written.forget(names)
	return s.completeScripted(ctx, comps, names)
}

// watchChunk bounds the entries one transaction WATCHes: the server checks
// each new WATCH against every key the connection already watches, so the
// cost of a WATCH grows with the square of its keys (1.3 ms for 350 on
// Redis 7.0, against 40 µs for 32).
const watchChunk = 32

// completeWatched finishes comps with plain commands, in transactions of
// up to watchChunk entries: one round trip WATCHes the entries, reads the
// server's clock (TIME) and the entries (MGET); decide.Complete
// decides each completion here, on the store's clock; one MULTI/EXEC
// writes the entries that change. EXEC runs only if no watched entry
// changed since the WATCH, so each check and its write are as atomic as in
// complete.lua: when another holder took a key over in between, EXEC does
// nothing and complete.lua finishes that transaction's completions. A GET
// and a SET per completion cost the server about a fifth of the script's
// CPU.
//
// It is not used when replicas must acknowledge (see Complete).
func (s *Store) completeWatched(ctx context.Context, node *redis.Client, comps []dedupe.Completion, names []string) ([]error, error) {
	errs := make([]error, len(comps))
	// Completions of one key go into the same transaction, in order.
	chunkOf := make(map[string]int, len(comps))
	var chunks [][]int
	var watched [][]string // each chunk's distinct names
	for i, name := range names {
		c, ok := chunkOf[name]
		if !ok {
			if len(chunks) == 0 || len(watched[len(chunks)-1]) == watchChunk {
				chunks, watched = append(chunks, nil), append(watched, nil)
			}
			c = len(chunks) - 1
			chunkOf[name] = c
			watched[c] = append(watched[c], name)
		}
		chunks[c] = append(chunks[c], i)
	}
	// Chunks hold distinct keys: up to watchParallel of them run at once,
	// each on a connection of its own, so that their round trips overlap.
	chunkErrs := make([]error, len(chunks))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(watchParallel, len(chunks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				idx := chunks[c]
				cc := make([]dedupe.Completion, len(idx))
				cn := make([]string, len(idx))
				for j, i := range idx {
					cc[j], cn[j] = comps[i], names[i]
				}
				ce, err := s.completeChunk(ctx, node, cc, cn, watched[c])
				if errors.Is(err, redis.TxFailedErr) {
					ce, err = s.completeScripted(ctx, cc, cn)
				}
				if chunkErrs[c] = err; err == nil {
					for j, i := range idx {
						errs[i] = ce[j]
					}
				}
			}
		}()
	}
	for c := range chunks {
		next <- c
	}
	close(next)
	wg.Wait()
	if err := firstErr(chunkErrs); err != nil {
		return nil, err
	}
	return errs, nil
}

// watchParallel bounds the transactions of one Complete call in flight.
const watchParallel = 3

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// completeChunk is one transaction of completeWatched, over the distinct
// names in watch, on a connection of its own (node.Watch with no keys:
// completeInTx sends the WATCH itself). It returns redis.TxFailedErr, and
// changes nothing, when EXEC found a watched entry changed; any other
// error is already classified.
func (s *Store) completeChunk(ctx context.Context, node *redis.Client, comps []dedupe.Completion, names, watch []string) ([]error, error) {
	errs := make([]error, len(comps))
	if err := node.Watch(ctx, func(tx *redis.Tx) error {
		return s.completeInTx(ctx, tx, comps, names, watch, errs)
	}); err != nil {
		return nil, err
	}
	return errs, nil
}

// beforeExec, when set (by a test), runs between a transaction's read and
// its EXEC.
var beforeExec func(names []string)

// afterDecideRead, when set (by a test), runs after Decide's reads, before
// the later records of a key are decided.
var afterDecideRead func()

// completeScripted finishes comps with complete.lua.
func (s *Store) completeScripted(ctx context.Context, comps []dedupe.Completion, names []string) ([]error, error) {
	args := make([][]any, len(comps))
	for i, c := range comps {
		args[i] = []any{c.Key, c.Owner.Holder, c.Owner.Source, string(c.State),
			int64(c.Result.Partition), c.Result.Offset, ms(c.FailedTTL), ms(c.KeepAtLeast)}
	}
	errs := make([]error, len(comps))
	err := s.runGroups(ctx, "complete", completeScript, names, args, nil, nil, func(idx []int, rep []any) error {
		if len(rep) != len(idx) {
			return fmt.Errorf("complete: %d replies for %d completions", len(rep), len(idx))
		}
		for j, i := range idx {
			switch r := str(rep[j]); {
			case r == "ok":
			case r == "fenced:":
				errs[i] = fmt.Errorf("complete %q: %w (entry expired)", comps[i].Key, dedupe.ErrFenced)
			default:
				errs[i] = fmt.Errorf("complete %q as %s: %w (%s)", comps[i].Key, comps[i].Owner.Token(),
					dedupe.ErrFenced, strings.Replace(strings.TrimPrefix(r, "fenced:"), ":", " by ", 1))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// completeInTx is completeWatched's transaction on tx's connection: the
// WATCH of the distinct names in watch travels with the reads, in one
// round trip, and MULTI/EXEC is the second. It fills errs and returns
// redis.TxFailedErr when EXEC found a watched entry changed.
func (s *Store) completeInTx(ctx context.Context, tx *redis.Tx, comps []dedupe.Completion, names, watch []string, errs []error) error {
	// Until an EXEC runs (it unwatches, committed or not), the WATCH must
	// not stay on a connection that goes back to the pool: another
	// transaction on it would fail for keys it never read.
	armed := true
	defer func() {
		if armed {
			_ = tx.Unwatch(ctx).Err()
		}
	}()
	// Each name becomes an interface value once, for WATCH, MGET and SET
	// alike: the conversion allocates.
	watchArgs := make([]any, 1+len(watch))
	watchArgs[0] = "WATCH"
	for i, name := range watch {
		watchArgs[1+i] = name
	}
	// watch lists the distinct names in the order they first appear in
	// names, so one walk pairs them; a repeated name is looked up.
	mget := make([]any, 1+len(names))
	mget[0] = "MGET"
	w := 0
	for i, name := range names {
		if w < len(watch) && watch[w] == name {
			mget[1+i] = watchArgs[1+w]
			w++
		} else if j := slices.Index(watch[:w], name); j >= 0 {
			mget[1+i] = watchArgs[1+j]
		} else {
			mget[1+i] = name
		}
	}
	var clock *redis.TimeCmd
	var read *redis.Cmd
	if _, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, watchArgs...)
		clock = p.Time(ctx)
		read = p.Do(ctx, mget...)
		return nil
	}); err != nil {
		return classify("complete", err)
	}
	now := time.UnixMilli(clock.Val().UnixMilli())
	vals, err := read.Slice()
	if err != nil {
		return classify("complete", err)
	}
	if len(vals) != len(names) {
		return fmt.Errorf("complete: %d entries read for %d completions", len(vals), len(names))
	}
	order, latest := planCompletions(comps, names, vals, now, errs)
	if len(order) == 0 {
		return nil
	}
	bp := valueBuffers.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() {
		*bp = buf[:0]
		valueBuffers.Put(bp)
	}()
	if beforeExec != nil {
		beforeExec(names)
	}
	marker, want := s.markerGet(ctx)
	cmds, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range order {
			e := latest[names[i]]
			start := len(buf)
			buf = appendEntry(buf, e)
			p.Do(ctx, "SET", mget[1+i], buf[start:len(buf):len(buf)], "PXAT", e.RetainUntil().UnixMilli())
		}
		_ = p.Process(ctx, marker)
		return nil
	})
	if err == nil {
		// The writes are made; a marker that does not read the armed
		// value makes them no completion.
		if merr := s.checkMarkers(ctx, want, []*redis.StringCmd{marker}); merr != nil {
			return merr
		}
	}
	if err == nil || errors.Is(err, redis.TxFailedErr) || redis.IsExecAbortError(err) {
		armed = false
	}
	if err != nil {
		if errors.Is(err, redis.TxFailedErr) {
			return err
		}
		// A command refused when it was queued makes EXEC answer
		// EXECABORT: the refusal (NOPERM, OOM, READONLY) is the cause,
		// and what decides between pausing and stopping.
		for _, c := range cmds {
			if cerr := c.Err(); cerr != nil && !strings.HasPrefix(cerr.Error(), "EXECABORT") {
				return classify("complete", cerr)
			}
		}
		return classify("complete", err)
	}
	return nil
}

// planCompletions applies decide.Complete, on the store's clock now, to
// comps against the entries read (vals, one per completion, as MGET
// answers, or an entry Decide wrote: a *writtenEntry), filling errs. It
// returns the first completion of each name whose entry changes, in
// order, and each name's entry as the call leaves it.
func planCompletions(comps []dedupe.Completion, names []string, vals []any, now time.Time, errs []error) ([]int, map[string]*dedupe.Entry) {
	// latest is each entry as this batch leaves it, for a key
	// completed twice in one call.
	stored := make([]dedupe.Entry, len(comps))
	latest := make(map[string]*dedupe.Entry, len(comps))
	changed := make(map[string]bool, len(comps))
	var order []int // the first completion of each name to write
	for i, c := range comps {
		cur, seen := latest[names[i]]
		if !seen {
			switch v := vals[i].(type) {
			case string:
				if e, err := decodeEntry(now.UnixMilli(), v); err == nil {
					stored[i] = e
					cur = &stored[i]
				}
			case *writtenEntry:
				stored[i] = v.entry
				stored[i].Now = now
				cur = &stored[i]
			}
			latest[names[i]] = cur
		}
		if cur != nil && cur.Key != c.Key {
			// Another key under the same name (namespaces that contain
			// ':'): fenced, as in complete.lua; the entry stays as it is.
			_, errs[i] = decide.Complete(nil, c, now)
			continue
		}
		next, err := decide.Complete(cur, c, now)
		if err != nil {
			errs[i] = err
			continue
		}
		if *next != *cur {
			if !changed[names[i]] {
				order = append(order, i)
			}
			changed[names[i]] = true
		}
		latest[names[i]] = next
	}
	return order, latest
}

// Lookup implements dedupe.Store.
func (s *Store) Lookup(ctx context.Context, namespace, key string) (dedupe.Entry, bool, error) {
	var e dedupe.Entry
	var found bool
	err := s.runGroups(ctx, "lookup", lookupScript, []string{s.redisKey(namespace, key)}, [][]any{nil}, nil, nil, func(_ []int, rep []any) error {
		if len(rep) < 2 {
			return nil
		}
		var err error
		e, err = parseEntry(rep[0], rep[1])
		found = err == nil && e.Key == key && e.Now.Before(e.RetainUntil())
		return err
	})
	if err != nil || !found {
		return dedupe.Entry{}, false, err
	}
	return e, true, nil
}

// runGroups decides how items travel: on one node, in groups of up to
// maxGroup per script call; on a cluster, one group per hash slot (a
// script may only touch one slot). All groups go in one pipelined round
// trip. Groups that a server answers NOSCRIPT (it restarted, or a failover
// moved the slot) are sent again after loading the script; the others are
// not, so no item runs twice.
//
// shared, when set, gives the arguments that precede a group's items (taken
// from its first item); class tells which items may share them.
func (s *Store) runGroups(ctx context.Context, op string, script *redis.Script, names []string, args [][]any,
	shared func(i int) []any, class func(i int) string, handle func(idx []int, rep []any) error) error {
	groups := s.group(names, class)
	for attempt := 0; ; attempt++ {
		cmds := make([]*redis.Cmd, len(groups))
		sent := make([]redis.Cmder, len(groups))
		routes := make([]string, len(groups))
		for g, idx := range groups {
			keys := make([]string, len(idx))
			var flat []any
			if shared != nil {
				flat = append(flat, shared(idx[0])...)
			}
			for j, i := range idx {
				keys[j] = names[i]
				flat = append(flat, args[i]...)
			}
			cmds[g] = evalSha(ctx, script, keys, flat)
			sent[g], routes[g] = cmds[g], keys[0]
		}
		execErr, ackErr := s.roundTrip(ctx, op, routes, sent)
		if isMarkerFailure(execErr) {
			return execErr
		}
		if ackErr != nil && (execErr == nil || redis.HasErrorPrefix(execErr, "NOSCRIPT")) {
			// Made but not acknowledged: no item of the call is decided.
			return ackErr
		}
		var missing [][]int
		for g, idx := range groups {
			err := cmds[g].Err()
			switch {
			case err == nil:
				rep, ok := cmds[g].Val().([]any)
				if !ok {
					return fmt.Errorf("%s: unexpected reply %T", op, cmds[g].Val())
				}
				if err := handle(idx, rep); err != nil {
					return err
				}
			case redis.HasErrorPrefix(err, "NOSCRIPT"):
				missing = append(missing, idx)
			default:
				return classify(op, err)
			}
		}
		if len(missing) == 0 {
			if execErr != nil && !redis.HasErrorPrefix(execErr, "NOSCRIPT") {
				return classify(op, execErr)
			}
			return nil
		}
		if attempt > 0 {
			return fmt.Errorf("%s: %w: script still missing after loading it", op, dedupe.ErrStoreUnavailable)
		}
		if err := s.loadScript(ctx, script); err != nil {
			return classify(op, err)
		}
		groups = missing
	}
}

// group splits items into script calls. Items of one slot keep their
// order: each joins the newest group of its slot, and a full group or a
// change of class opens a new one behind it.
func (s *Store) group(names []string, class func(i int) string) [][]int {
	_, cluster := s.client.(*redis.ClusterClient)
	var groups [][]int
	var classes []string
	newest := map[uint16]int{}
	for i, n := range names {
		var slot uint16
		if cluster {
			slot = hashSlot(n)
		}
		c := ""
		if class != nil {
			c = class(i)
		}
		g, ok := newest[slot]
		if !ok || len(groups[g]) == maxGroup || classes[g] != c {
			g = len(groups)
			newest[slot] = g
			groups = append(groups, nil)
			classes = append(classes, c)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

func (s *Store) loadScript(ctx context.Context, script *redis.Script) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return script.Load(ctx, c).Err()
		})
	}
	return script.Load(ctx, s.client).Err()
}

// classify keeps the one rule of the package: anything that is not a
// definite answer from the server leaves the records undecided.
func classify(op string, err error) error {
	var netErr net.Error
	switch {
	case isMarkerFailure(err), errors.Is(err, dedupe.ErrStoreForgot):
		return err
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr),
		errors.Is(err, redis.ErrClosed), isTransient(err):
		return fmt.Errorf("%s: %w: %w", op, dedupe.ErrStoreUnavailable, err)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		if refusedForGood(err) {
			return fmt.Errorf("%s: redis refused: %w", op, err)
		}
		// Anything else the server says may pass (a full client table,
		// NOREPLICAS, MISCONF, a failover in progress): pause, not stop.
		return fmt.Errorf("%s: %w: %w", op, dedupe.ErrStoreUnavailable, err)
	}
	// An I/O error that is not a net.Error (EOF on a cut connection).
	return fmt.Errorf("%s: %w: %w", op, dedupe.ErrStoreUnavailable, err)
}

// refusedForGood: answers that an operator must act on (credentials,
// permissions, a key of another type, a command or script the server does
// not take). Retrying them would loop for ever.
func refusedForGood(err error) bool {
	msg := err.Error()
	for _, p := range []string{"NOPERM", "NOAUTH", "WRONGPASS", "WRONGTYPE", "ERR unknown command", "ERR wrong number of arguments",
		"ERR syntax error", "ERR Error running script", "ERR user_script", "ERR unknown subcommand"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func isTransient(err error) bool {
	msg := err.Error()
	// OOM: maxmemory reached under noeviction; entries expire, so the
	// pause ends by itself once the window moves on.
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "MOVED", "ASK", "OOM", "EOF", "connection reset", "broken pipe", "i/o timeout"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return fmt.Sprint(v)
}

func num(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("not a number: %v", v)
}

func parseDecision(now any, rep []any) (dedupe.Decision, error) {
	var d dedupe.Decision
	switch v := str(rep[0]); v {
	case "first":
		d.Verdict = dedupe.VerdictFirst
	case "replay":
		d.Verdict = dedupe.VerdictReplay
	case "conflict":
		d.Verdict = dedupe.VerdictConflict
	case "pending":
		d.Verdict = dedupe.VerdictPending
	case "error":
		return d, errors.New(str(rep[2]))
	default:
		return d, fmt.Errorf("unknown verdict %q", v)
	}
	flags := str(rep[1])
	if str(rep[2]) == "" {
		nowMs, err := num(now)
		d.Entry.Now = time.UnixMilli(nowMs)
		d.Resumed, d.Rerun, d.Mismatch, d.RulesChanged = false, false, false, false
		return d, err
	}
	if len(flags) != 4 {
		return d, fmt.Errorf("bad flags %q", flags)
	}
	d.Resumed, d.Rerun, d.Mismatch, d.RulesChanged = flags[0] == '1', flags[1] == '1', flags[2] == '1', flags[3] == '1'
	e, err := parseEntry(now, rep[2])
	if err != nil {
		return d, err
	}
	d.Entry = e
	return d, nil
}

const sep = "\x1f"

// parseEntry decodes an entry and the server's clock from a script's
// reply.
func parseEntry(now, raw any) (dedupe.Entry, error) {
	nowMs, err := num(now)
	if err != nil {
		return dedupe.Entry{}, err
	}
	return decodeEntry(nowMs, str(raw))
}

// decodeEntry decodes a stored entry read at nowMs on the server's clock.
func decodeEntry(nowMs int64, raw string) (dedupe.Entry, error) {
	var e dedupe.Entry
	var err error
	e.Now = time.UnixMilli(nowMs)
	// The fields, split on the stack: an entry is read for every
	// completion and for most decisions of a known key.
	var f [14]string
	rest, n := raw, 0
	for ; n < 13; n++ {
		field, more, ok := strings.Cut(rest, sep)
		if !ok {
			break
		}
		f[n], rest = field, more
	}
	if n != 13 {
		return e, fmt.Errorf("stored entry is not an idemstream entry: %.80q", raw)
	}
	f[13] = rest
	var ints [13]int64
	for i := 6; i < 13; i++ {
		if ints[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return e, fmt.Errorf("stored entry field %d: %w", i+1, err)
		}
	}
	e.State, e.Fingerprint, e.RulesDigest = dedupe.State(f[0]), f[1], f[2]
	e.Owner = dedupe.Owner{Holder: f[3], Source: f[4]}
	e.FirstSource = f[5]
	e.Intent = dedupe.Intent{Partition: int32(ints[6]), Floor: ints[7]}
	e.Result = dedupe.ResultRef{Partition: int32(ints[8]), Offset: ints[9]}
	e.WindowStart = time.UnixMilli(ints[10])
	if ints[11] > 0 {
		e.LeaseUntil = time.UnixMilli(ints[11])
	}
	e.ExpiresAt = time.UnixMilli(ints[12])
	e.Key = f[13]
	return e, nil
}

// newEntry rebuilds the entry that decide.lua created for r at now, as
// decide.Decide does; the script does not send it back.
func newEntry(r dedupe.DecideRequest, now time.Time) dedupe.Entry {
	clock := now
	if !r.EventTime.IsZero() {
		clock = time.UnixMilli(r.EventTime.UnixMilli())
	}
	return dedupe.Entry{
		Key: r.Key, State: dedupe.Pending, Fingerprint: r.Fingerprint, RulesDigest: r.RulesDigest,
		Owner: r.Owner, FirstSource: r.Owner.Source, Intent: r.Intent,
		Result:      dedupe.ResultRef{Partition: -1, Offset: dedupe.NoPosition},
		WindowStart: clock,
		LeaseUntil:  now.Add(time.Duration(r.Lease.Milliseconds()) * time.Millisecond),
		ExpiresAt:   now.Add(time.Duration(r.Window.Milliseconds()) * time.Millisecond),
		Now:         now,
	}
}

// appendEntry is entry.lua's save() in Go: both must write the same bytes.
func appendEntry(b []byte, e *dedupe.Entry) []byte {
	var lease int64
	if !e.LeaseUntil.IsZero() {
		lease = e.LeaseUntil.UnixMilli()
	}
	b = append(b, e.State...)
	for _, f := range [...]string{e.Fingerprint, e.RulesDigest, e.Owner.Holder, e.Owner.Source, e.FirstSource} {
		b = append(append(b, sep...), f...)
	}
	for _, n := range [...]int64{int64(e.Intent.Partition), e.Intent.Floor, int64(e.Result.Partition), e.Result.Offset,
		e.WindowStart.UnixMilli(), lease, e.ExpiresAt.UnixMilli()} {
		b = strconv.AppendInt(append(b, sep...), n, 10)
	}
	return append(append(b, sep...), e.Key...)
}

// checkFields refuses values that would corrupt the entry encoding.
func checkFields(r dedupe.DecideRequest) error {
	for _, v := range [...]string{r.Fingerprint, r.RulesDigest, r.Owner.Holder, r.Owner.Source} {
		if strings.Contains(v, sep) {
			return fmt.Errorf("decide %q: fingerprint, rules digest, holder and source must not contain \\x1f", r.Key)
		}
	}
	return nil
}
