package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Formats counts a prefix's entries by the format they are written in.
// Other counts the values at entries' names that this release does not
// read (a later release's format, another program's value, an empty one
// or one of another type, an entry damaged past its first byte, a whole
// entry of another key): a record of such a key stops its pipeline.
type Formats struct {
	Text, Compact, Other int64
}

// scanPage is how many names one SCAN call asks for, and how many values
// one pipeline then reads.
const scanPage = 1000

// CountFormats walks every entry under the store's prefix (SCAN, on every
// master of a Cluster) and decodes each as the pipeline would: a compact
// entry starts with a byte below a space, a text one with its state, and
// a value that does not decode in full, is no string or holds another
// key's entry is counted as Other, whatever its first byte. A release
// before compact entries reads a compact one as no entry at all, so a
// rollback to it must wait until this finds none (docs/operations.md).
// It reads the keyspace once and changes nothing; entries written or
// expiring while it runs may or may not be counted.
func (s *Store) CountFormats(ctx context.Context) (Formats, error) {
	var total Formats
	var mu sync.Mutex
	count := func(ctx context.Context, node *redis.Client) error {
		f, err := s.countFormatsOn(ctx, node)
		mu.Lock()
		defer mu.Unlock()
		total.Text += f.Text
		total.Compact += f.Compact
		total.Other += f.Other
		return err
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, count)
	case *redis.Client:
		err = count(ctx, c)
	default:
		err = fmt.Errorf("count formats: a %T is no client this store opens", c)
	}
	if err != nil {
		return Formats{}, err
	}
	return total, nil
}

// countFormatsOn counts the entries of one node.
func (s *Store) countFormatsOn(ctx context.Context, node *redis.Client) (Formats, error) {
	var f Formats
	match := globEscape(s.prefix) + ":{*"
	var cursor uint64
	for {
		names, next, err := node.Scan(ctx, cursor, match, scanPage).Result()
		if err != nil {
			return f, classify("count formats", err)
		}
		if len(names) > 0 {
			if err := s.countValues(ctx, node, names, &f); err != nil {
				return f, err
			}
		}
		if cursor = next; cursor == 0 {
			return f, nil
		}
	}
}

// countValues reads the values at names and counts each by what it
// decodes as. The first byte alone counted a damaged entry (a compact
// state followed by too few bytes, a text state with missing fields) as
// one this release reads, while a record of its key stops the pipeline.
func (s *Store) countValues(ctx context.Context, node *redis.Client, names []string, f *Formats) error {
	values := make([]*redis.StringCmd, len(names))
	// Pipelined's own error is only the first command's that failed, and
	// a key that expired since the SCAN fails as redis.Nil: each command's
	// error is read below instead.
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range names {
			values[i] = p.Get(ctx, name)
		}
		return nil
	})
	for i, c := range values {
		v, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil): // expired since the SCAN
			continue
		case redis.HasErrorPrefix(err, "WRONGTYPE"):
			// Not a string at all (another program's): a record of its
			// key stops its pipeline.
			f.Other++
			continue
		case err != nil:
			return classify("count formats", err)
		}
		e, err := decodeEntry(0, v, readContext{name: names[i], topics: s.topics, digests: s.digests})
		if err != nil || !s.holdsItsKey(names[i], e.Key) {
			// Undecodable, or an entry of another key, which a decision
			// refuses too.
			f.Other++
		} else if isCompact(v) {
			f.Compact++
		} else {
			f.Text++
		}
	}
	return nil
}

// holdsItsKey reports whether the entry of key may stand at name: a
// name ends with its key (or the key's hash), after its namespace. With a
// ':' in a namespace two pairs share a name, and either passes.
func (s *Store) holdsItsKey(name, key string) bool {
	suffix := ":" + keyInName(key) + "}"
	return strings.HasSuffix(name, suffix) && len(name)-len(suffix) >= len(s.prefix)+len(":{")
}

// globEscape escapes the characters SCAN's MATCH reads as a pattern.
func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace(s)
}
