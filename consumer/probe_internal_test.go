package consumer

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
)

// lookupAnswers is a store whose Lookup answers err.
type lookupAnswers struct {
	*memstore.Store
	err error
}

func (s lookupAnswers) Lookup(context.Context, string, string) (dedupe.Entry, bool, error) {
	return dedupe.Entry{}, false, s.err
}

// The service's readiness takes a stray value at the probe's name for an
// answer, and a store that does not answer for not ready.
func TestStoreProbeOverAnUnreadableValue(t *testing.T) {
	for _, c := range []struct {
		err   error
		ready bool
	}{
		{fmt.Errorf("entry x: %w", dedupe.ErrEntryUnreadable), true},
		{fmt.Errorf("lookup: %w", dedupe.ErrStoreUnavailable), false},
	} {
		p := storeProbe{store: lookupAnswers{memstore.New(), c.err}}
		if err := p.check(context.Background()); (err == nil) != c.ready {
			t.Errorf("Lookup answering %v: check = %v, want ready %v", c.err, err, c.ready)
		}
	}
}
