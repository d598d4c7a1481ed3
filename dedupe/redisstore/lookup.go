package redisstore

import (
	"context"

	"github.com/idemstream/idemstream/dedupe"
)

// Lookup implements dedupe.Store.
func (s *Store) Lookup(ctx context.Context, namespace, key string) (dedupe.Entry, bool, error) {
	var e dedupe.Entry
	var found bool
	err := s.runGroups(ctx, "lookup", lookupScript, []string{s.redisKey(namespace, key)}, [][]any{nil}, nil, nil, func(_ []int, rep []any) error {
		if len(rep) < 2 {
			return nil
		}
		var err error
		name := s.redisKey(namespace, key)
		e, err = parseEntry(rep[0], rep[1], readContext{name: name, topics: s.topics, digests: s.digests})
		if err != nil {
			return unreadableEntry(name, err)
		}
		found = e.Key == key && e.Now.Before(e.RetainUntil())
		return nil
	})
	if err != nil || !found {
		return dedupe.Entry{}, false, err
	}
	return e, true, nil
}
