package redisstore

import (
	"context"
	"fmt"
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
	if err := dedupe.CheckCompletions(comps); err != nil {
		return nil, err
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

// redoScripted finishes with complete.lua the completions comps[i] for i
// in redo, which a compare found changed, into errs[i].
func (s *Store) redoScripted(ctx context.Context, comps []dedupe.Completion, names []string, redo []int, errs []error) error {
	if len(redo) == 0 {
		return nil
	}
	cc := make([]dedupe.Completion, len(redo))
	cn := make([]string, len(redo))
	for j, i := range redo {
		cc[j], cn[j] = comps[i], names[i]
	}
	ce, err := s.completeScripted(ctx, cc, cn)
	if err != nil {
		return err
	}
	for j, i := range redo {
		errs[i] = ce[j]
	}
	return nil
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

// planCompletions applies decide.Complete, on the store's clock now, to
// comps against the entries read (vals, one per completion, as MGET
// answers, or an entry Decide wrote: a *writtenEntry), filling errs. It
// returns the first completion of each name whose entry changes, in
// order, and each name's entry as the call leaves it.
func (s *Store) planCompletions(comps []dedupe.Completion, names []string, vals []any, now time.Time, errs []error) ([]int, map[string]*dedupe.Entry) {
	// latest is each entry as this batch leaves it, for a key
	// completed twice in one call: the entry read, in stored, changed in
	// place.
	stored := make([]dedupe.Entry, len(comps))
	latest := make(map[string]*dedupe.Entry, len(comps))
	changed := make(map[string]bool, len(comps))
	// rules is the last rules digest read in the unresolved form (the 8
	// bytes a compact entry keeps, as text): a batch's entries mostly
	// share one, which is then not made again for each. Never a full
	// digest read from a text entry: it would resolve the compact entries
	// after it, which would then be written back as text.
	var rules string
	var order []int // the first completion of each name to write
	for i, c := range comps {
		cur, seen := latest[names[i]]
		if !seen {
			switch v := vals[i].(type) {
			case string:
				if e, err := decodeEntry(now.UnixMilli(), v, s.readContext(names[i], c.Owner.Holder, rules, c.Owner.Source)); err == nil {
					stored[i] = e
					if unresolvedRules(e.RulesDigest) {
						rules = e.RulesDigest
					}
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
		if next != *cur {
			if !changed[names[i]] {
				order = append(order, i)
			}
			changed[names[i]] = true
			*cur = next
		}
	}
	return order, latest
}
