package memstore

import (
	"context"
	"slices"
	"time"
)

type keptValue struct {
	value []byte
	until time.Time
}

// KeepFirst keeps value under name in namespace unless a value is kept
// there already, and returns the value kept: value itself, or the one
// that was there first; either way kept for at least ttl from now. The HTTP front door keeps a first request's
// answer with it, so that of two writers of one answer (an owner and the
// one that took its key over) every client sees the same one.
func (s *Store) KeepFirst(ctx context.Context, namespace, name string, value []byte, ttl time.Duration) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k := entryKey{namespace, name}
	if v, ok := s.kept[k]; ok && now.Before(v.until) {
		if until := now.Add(ttl); v.until.Before(until) {
			v.until = until
			s.kept[k] = v
		}
		return slices.Clone(v.value), nil
	}
	if s.kept == nil {
		s.kept = map[entryKey]keptValue{}
	}
	s.kept[k] = keptValue{value: slices.Clone(value), until: now.Add(ttl)}
	return value, nil
}

// Kept returns the value kept under name in namespace, and false when
// none is (or it expired).
func (s *Store) Kept(ctx context.Context, namespace, name string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.kept[entryKey{namespace, name}]
	if !ok || !s.now().Before(v.until) {
		return nil, false, nil
	}
	return slices.Clone(v.value), true, nil
}
