package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
)

// lookupStore answers every Lookup with err, and records what it was
// asked.
type lookupStore struct {
	dedupe.Store
	err   error
	asked []string
}

func (s *lookupStore) Lookup(_ context.Context, namespace, key string) (dedupe.Entry, bool, error) {
	s.asked = append(s.asked, namespace+"/"+key)
	return dedupe.Entry{}, false, s.err
}

func TestProbe(t *testing.T) {
	down := fmt.Errorf("lookup: %w: connection refused", dedupe.ErrStoreUnavailable)
	for _, tc := range []struct {
		name      string
		err, want error
	}{
		{"answers", nil, nil},
		{"an unreadable value is an answer", fmt.Errorf("entry x: %w", dedupe.ErrEntryUnreadable), nil},
		{"down", down, down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &lookupStore{err: tc.err}
			if err := dedupe.Probe(context.Background(), s); !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Errorf("Probe = %v, want %v", err, tc.want)
			}
			if len(s.asked) != 1 || s.asked[0] != "idemstream-readyz/probe" {
				t.Errorf("asked %q, want one lookup of idemstream-readyz/probe", s.asked)
			}
		})
	}
}
