package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/decide"
)

// Store keeps entries in a map guarded by one mutex, which makes every
// call atomic, as dedupe.Store requires.
type Store struct {
	mu      sync.Mutex
	now     func() time.Time
	entries map[entryKey]*dedupe.Entry
	kept    map[entryKey]keptValue
	ops     int
}

type entryKey struct{ namespace, key string }

// Option configures a Store.
type Option func(*Store)

// WithClock replaces the store's clock, so that tests move windows and
// leases forward without sleeping.
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// New returns an empty store. It starts no goroutine: expired entries are
// removed as they are met and by a sweep every few thousand calls.
func New(opts ...Option) *Store {
	s := &Store{now: time.Now, entries: make(map[entryKey]*dedupe.Entry)}
	for _, o := range opts {
		o(s)
	}
	return s
}

const sweepEvery = 4096

// Decide implements dedupe.Store.
func (s *Store) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.maybeSweep(now)
	out := make([]dedupe.Decision, len(reqs))
	for i, req := range reqs {
		k := entryKey{req.Namespace, req.Key}
		dec, next := decide.Decide(s.entries[k], req, now)
		if next != nil {
			s.entries[k] = next
		}
		dec.Entry.Now = now
		out[i] = dec
	}
	return out, nil
}

// Complete implements dedupe.Store.
func (s *Store) Complete(ctx context.Context, comps []dedupe.Completion) ([]error, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := dedupe.CheckCompletions(comps); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	errs := make([]error, len(comps))
	for i, c := range comps {
		k := entryKey{c.Namespace, c.Key}
		next, err := decide.Complete(s.entries[k], c, now)
		if err != nil {
			errs[i] = err
			continue
		}
		s.entries[k] = &next
	}
	return errs, nil
}

// Lookup implements dedupe.Store.
func (s *Store) Lookup(ctx context.Context, namespace, key string) (dedupe.Entry, bool, error) {
	if err := ctx.Err(); err != nil {
		return dedupe.Entry{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e, ok := s.entries[entryKey{namespace, key}]
	if !ok || !now.Before(e.RetainUntil()) {
		return dedupe.Entry{}, false, nil
	}
	out := *e
	out.Now = now
	return out, true, nil
}

// Len returns the number of entries held, expired ones included until
// they are swept.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

func (s *Store) maybeSweep(now time.Time) {
	s.ops++
	if s.ops%sweepEvery != 0 {
		return
	}
	for k, e := range s.entries {
		if !now.Before(e.RetainUntil()) {
			delete(s.entries, k)
		}
	}
	for k, v := range s.kept {
		if !now.Before(v.until) {
			delete(s.kept, k)
		}
	}
}
