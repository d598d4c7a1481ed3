package audit

import (
	"context"
	"fmt"

	"github.com/idemstream/idemstream/dedupe"
)

// Source is a range of records that can be read more than once, the same
// records in the same order each time: an audit without rules reads it
// twice, once to find the rules and once to decide under them.
type Source interface {
	// Scan calls fn for each record: in offset order within a partition,
	// and in roughly timestamp order across partitions, so that the gap
	// between two copies of a key is a gap in time. fn must not keep rec.
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

// Run audits the records of src: it finds the rules in a first pass, and
// decides the records under them. With Options.Configured the rules are
// known before reading, and one pass does both; without, the records are
// read a second time.
func Run(ctx context.Context, src Source, opts Options) (*Report, error) {
	a, err := NewAnalyzer(opts)
	if err != nil {
		return nil, err
	}
	opts = a.Options()
	var rp *Replayer
	if opts.Configured {
		if rp, err = NewReplayer(opts.Policy); err != nil {
			return nil, err
		}
	}
	err = src.Scan(ctx, func(rec *dedupe.Record) error {
		a.Add(rec)
		if rp != nil {
			rp.Add(rec)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rep := a.Report()
	if rp == nil {
		a = nil // its keys are not needed any more
		pol := opts.Policy
		pol.Rules.Volatile, pol.Rules.Unordered = rep.Suggested.Volatile, rep.Suggested.Unordered
		pol.Window = rep.Suggested.Window.D()
		if rp, err = NewReplayer(pol); err != nil {
			return nil, fmt.Errorf("the suggested rules: %w", err)
		}
		if err := src.Scan(ctx, func(rec *dedupe.Record) error { rp.Add(rec); return nil }); err != nil {
			return nil, err
		}
		if rp.Records() != rep.Records {
			return nil, fmt.Errorf("the second pass read %d records, the first %d: the topic changed while it was read (retention?)", rp.Records(), rep.Records)
		}
		rep.Passes = 2
		rep.DecisionWindow = Duration(pol.Window)
	} else {
		rep.DecisionWindow = Duration(opts.Policy.Window)
	}
	rep.Decisions = rp.Decisions()
	return rep, nil
}
