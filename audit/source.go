package audit

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"runtime"
	"strings"
	"sync"

	"github.com/idemstream/idemstream/dedupe"
)

// Source is a range of records that can be read more than once, the same
// records in the same order each time: an audit without rules reads it
// twice, once to find the rules and once to decide under them.
type Source interface {
	// Scan calls fn for each record: in offset order within a partition,
	// and in roughly timestamp order across partitions, so that the gap
	// between two copies of a key is a gap in time. fn may keep a copy
	// of *rec: its slices are not reused.
	Scan(ctx context.Context, fn func(rec *dedupe.Record) error) error
}

// Records is a Source held in memory, in the order given.
type Records []dedupe.Record

// Scan calls fn for each record.
func (rs Records) Scan(ctx context.Context, fn func(*dedupe.Record) error) error {
	for i := range rs {
		if i%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if err := fn(&rs[i]); err != nil {
			return err
		}
	}
	return nil
}

// maxShards bounds the goroutines an audit analyzes with.
const maxShards = 8

// Run audits the records of src: it finds the rules in a first pass, and
// decides the records under them. With Options.Configured the rules are
// known before reading, and one pass does both; without, the records are
// read a second time.
//
// Keys are independent of each other, so Run spreads them over one
// goroutine per processor (up to 8), each with an analyzer and a replayer
// of its own, and merges their reports: every key is seen by one of them,
// in the order read.
func Run(ctx context.Context, src Source, opts Options) (*Report, error) {
	opts = opts.withDefaults()
	n := min(runtime.GOMAXPROCS(0), maxShards)
	if opts.Policy.Key.From == dedupe.KeyFromField {
		n = 1 // the key is inside the payload: routing would parse it twice
	}
	route := router(opts.Policy.Key, n)
	analyzers := make([]*analyzer, n)
	replayers := make([]*replayer, n)
	for i := range n {
		a, err := newAnalyzer(opts)
		if err != nil {
			return nil, err
		}
		analyzers[i] = a
		if opts.Configured {
			if replayers[i], err = newReplayer(a.Options().Policy); err != nil {
				return nil, err
			}
		}
	}
	err := fanOut(ctx, src, n, route, func(shard int, rec *dedupe.Record) {
		analyzers[shard].Add(rec)
		if rp := replayers[shard]; rp != nil {
			rp.Add(rec)
		}
	})
	if err != nil {
		return nil, err
	}
	if err := notTheRecords(analyzers, replayers); err != nil {
		return nil, err
	}
	rep := report(analyzers)
	if pc, ok := src.(interface {
		Partitions(context.Context) (int, error)
	}); ok {
		// The topic's partitions, also those that held no record.
		if n, err := pc.Partitions(ctx); err == nil {
			rep.Partitions = n
		}
	}
	pol := analyzers[0].Options().Policy
	rep.DecisionWindow = Duration(pol.Window)
	if !opts.Configured {
		analyzers = nil // their keys are not needed any more
		pol.Rules.Volatile, pol.Rules.Unordered = rep.Suggested.Volatile, rep.Suggested.Unordered
		pol.Window = rep.Suggested.Window.D()
		for i := range n {
			if replayers[i], err = newReplayer(pol); err != nil {
				return nil, fmt.Errorf("the suggested rules: %w", err)
			}
		}
		if err := fanOut(ctx, src, n, route, func(shard int, rec *dedupe.Record) { replayers[shard].Add(rec) }); err != nil {
			return nil, err
		}
		if err := notTheRecords(nil, replayers); err != nil {
			return nil, err
		}
		rep.Passes = 2
		rep.DecisionWindow = Duration(pol.Window)
	}
	var records int64
	for _, rp := range replayers {
		records += rp.Records()
		d := rp.Decisions()
		rep.Decisions.Idemstream.addAll(d.Idemstream)
		rep.Decisions.RawBody.addAll(d.RawBody)
		rep.Decisions.KeyOnly.addAll(d.KeyOnly)
	}
	if records != rep.Records {
		return nil, fmt.Errorf("the second pass read %d records, the first %d: the topic changed while it was read (retention?)", records, rep.Records)
	}
	return rep, nil
}

func (c *Counts) addAll(o Counts) {
	c.First += o.First
	c.Replay += o.Replay
	c.Conflict += o.Conflict
	c.Invalid += o.Invalid
	c.Mismatch += o.Mismatch
}

// router sends every record of one key to one shard: by the raw key
// bytes, folded to lower case for UUIDs, which compare that way.
func router(spec dedupe.KeySpec, n int) func(*dedupe.Record) int {
	if n == 1 {
		return func(*dedupe.Record) int { return 0 }
	}
	seed := maphash.MakeSeed()
	fold := spec.Format.String() == "uuid"
	var lower []byte
	return func(rec *dedupe.Record) int {
		var raw []byte
		if spec.From == dedupe.KeyFromMessageKey {
			raw = rec.Key
		} else {
			for _, h := range rec.Headers {
				if strings.EqualFold(h.Key, spec.Name) {
					raw = h.Value
					break
				}
			}
		}
		if fold {
			lower = append(lower[:0], raw...)
			raw = bytes.ToLower(lower)
		}
		return int(maphash.Bytes(seed, raw) % uint64(n))
	}
}

// fanOut scans src and hands each record to work on the goroutine of its
// shard, in batches; records of one shard keep their order.
func fanOut(ctx context.Context, src Source, n int, route func(*dedupe.Record) int, work func(int, *dedupe.Record)) error {
	if n == 1 {
		return src.Scan(ctx, func(rec *dedupe.Record) error { work(0, rec); return nil })
	}
	const batch = 256
	chans := make([]chan []dedupe.Record, n)
	bufs := make([][]dedupe.Record, n)
	var wg sync.WaitGroup
	for i := range n {
		chans[i] = make(chan []dedupe.Record, 8)
		bufs[i] = make([]dedupe.Record, 0, batch)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for recs := range chans[i] {
				for j := range recs {
					work(i, &recs[j])
				}
			}
		}()
	}
	err := src.Scan(ctx, func(rec *dedupe.Record) error {
		i := route(rec)
		bufs[i] = append(bufs[i], *rec)
		if len(bufs[i]) == batch {
			select {
			case chans[i] <- bufs[i]:
			case <-ctx.Done():
				return ctx.Err()
			}
			bufs[i] = make([]dedupe.Record, 0, batch)
		}
		return nil
	})
	for i := range n {
		if err == nil && len(bufs[i]) > 0 {
			chans[i] <- bufs[i]
		}
		close(chans[i])
	}
	wg.Wait()
	return err
}

// notTheRecords is the first error a pass met that was no record's fault
// (a schema registry that did not answer): the report would count good
// records as invalid, so there is none.
func notTheRecords(analyzers []*analyzer, replayers []*replayer) error {
	for _, a := range analyzers {
		if a.err != nil {
			return fmt.Errorf("reading the records: %w", a.err)
		}
	}
	for _, r := range replayers {
		if r != nil && r.err != nil {
			return fmt.Errorf("reading the records: %w", r.err)
		}
	}
	return nil
}
