package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/decide"
)

// Complete implements dedupe.Store.
//
// How a call is finished is the store's completion way (completionWay),
// chosen once: SET … IFEQ where the server has it (completeCAS),
// otherwise plain commands under WATCH (completeWatched), on a single
// node or a Sentinel master; complete.lua (completeScripted) on a
// Cluster, with replica acknowledgement, and for calls too small to be
// worth a round trip more. The first two fall back to complete.lua for
// the entries another client changed meanwhile. All apply
// decide.Complete's rules atomically per entry.
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
	way, node := wayScript, (*redis.Client)(nil)
	if len(comps) >= fastPathMin {
		way, node = s.completionWay(ctx)
	}
	switch way {
	case wayCAS:
		return s.completeCAS(ctx, node, comps, names)
	case wayWatch:
		s.written.forget(names)
		return s.completeWatched(ctx, node, comps, names)
	}
	s.written.forget(names)
	return s.completeScripted(ctx, comps, names)
}

// completionWay is how the store finishes its completions.
type completionWay int

const (
	wayScript completionWay = iota
	wayWatch
	wayCAS
)

// completionWay returns the store's way and, for the ways of a single
// node, the node. It is fixed by what the store was opened on (a single
// node or a Sentinel master, without replica acknowledgement: with it,
// every call goes to the script, one WAIT per node behind it, and a retry
// rewrites what it finds already done so that its WAIT covers the write a
// failed attempt made), and by whether the server takes SET … IFEQ, asked
// once (hasCAS; a server away is asked again at the next call, and a
// refusal after a failover to an older node moves the store to WATCH for
// good).
func (s *Store) completionWay(ctx context.Context) (completionWay, *redis.Client) {
	node, ok := s.client.(*redis.Client)
	switch {
	case !ok || s.waits("complete"):
		return wayScript, nil
	case s.hasCAS(ctx, node):
		return wayCAS, node
	}
	return wayWatch, node
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
	// Chunks hold distinct keys, so that their transactions may overlap.
	chunkErrs := make([]error, len(chunks))
	inParallel(len(chunks), func(c int) {
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
	})
	if err := firstErr(chunkErrs); err != nil {
		return nil, err
	}
	return errs, nil
}

// watchParallel bounds the round trips of one Complete call in flight.
const watchParallel = 3

// inParallel runs chunk(0) to chunk(n-1), up to watchParallel at once and
// each on a goroutine of its own, so that each takes a connection of its
// own and their round trips overlap. It returns when all have returned.
func inParallel(n int, chunk func(c int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(watchParallel, n) {
		wg.Go(func() {
			for c := range next {
				chunk(c)
			}
		})
	}
	for c := range n {
		next <- c
	}
	close(next)
	wg.Wait()
}

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

// completeScripted finishes comps with complete.lua.
func (s *Store) completeScripted(ctx context.Context, comps []dedupe.Completion, names []string) ([]error, error) {
	args := make([][]any, len(comps))
	for i, c := range comps {
		args[i] = []any{c.Key, c.Owner.Holder, c.Owner.Source, string(c.State),
			int64(c.Result.Partition), c.Result.Offset, ms(c.FailedTTL), ms(c.KeepAtLeast)}
	}
	errs := make([]error, len(comps))
	shared := func(int) []any { return []any{ms(dedupe.PendingRetention), s.scriptFormat()} }
	err := s.runGroups(ctx, "complete", completeScript, names, args, shared, nil, func(idx []int, rep []any) error {
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
	mget, now, vals, err := watchAndRead(ctx, tx, names, watch)
	if err != nil {
		return err
	}
	order, latest := s.planCompletions(comps, names, vals, now, errs)
	if len(order) == 0 {
		return nil
	}
	bp := valueBuffers.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() {
		*bp = buf[:0]
		valueBuffers.Put(bp)
	}()
	if s.hooks.beforeExec != nil {
		s.hooks.beforeExec(names)
	}
	marker, want := s.markerGet(ctx)
	cmds, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range order {
			e := latest[names[i]]
			start := len(buf)
			buf = s.appendEntryOver(buf, e, vals[i])
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

// watchAndRead WATCHes the distinct names in watch and reads the server's
// clock and the entries of names, in one round trip. mget holds the
// names as the interface values MGET took, for the SETs to take too.
func watchAndRead(ctx context.Context, tx *redis.Tx, names, watch []string) (mget []any, now time.Time, vals []any, err error) {
	// Each name becomes an interface value once, for WATCH, MGET and SET
	// alike: the conversion allocates.
	watchArgs := make([]any, 1+len(watch))
	watchArgs[0] = "WATCH"
	for i, name := range watch {
		watchArgs[1+i] = name
	}
	// watch lists the distinct names in the order they first appear in
	// names, so one walk pairs them; a repeated name is looked up.
	mget = make([]any, 1+len(names))
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
		return nil, time.Time{}, nil, classify("complete", err)
	}
	now = time.UnixMilli(clock.Val().UnixMilli())
	if vals, err = read.Slice(); err != nil {
		return nil, time.Time{}, nil, classify("complete", err)
	}
	if len(vals) != len(names) {
		return nil, time.Time{}, nil, fmt.Errorf("complete: %d entries read for %d completions", len(vals), len(names))
	}
	return mget, now, vals, nil
}

// planCompletions applies decide.Complete, on the store's clock now, to
// comps against the entries read (vals, one per completion, as MGET
// answers, or an entry Decide wrote: a *writtenEntry), filling errs. It
// returns the first completion of each name whose entry changes, in
// order, and each name's entry as the call leaves it.
func (s *Store) planCompletions(comps []dedupe.Completion, names []string, vals []any, now time.Time, errs []error) ([]int, map[string]*dedupe.Entry) {
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
				if e, err := decodeEntry(now.UnixMilli(), v, s.readContext(names[i], c.Owner.Holder, "", c.Owner.Source)); err == nil {
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
