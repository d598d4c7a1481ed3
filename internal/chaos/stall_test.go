package chaos

import (
	"testing"
	"time"
)

func TestExplainedStalls(t *testing.T) {
	s := func(from, to time.Duration) stall { return stall{from: from, to: to} }
	for _, c := range []struct {
		name   string
		stall  stall
		faults []time.Duration
		ok     bool
		upTo   time.Duration
	}{
		{"short, no fault", s(10*time.Second, 10*time.Second+stallMax), nil, true, 10*time.Second + stallMax},
		{"longer than the bound, no fault", s(10*time.Second, 11*time.Second+stallMax), nil, false, 10*time.Second + stallMax},
		{"a fault before the stall extends nothing", s(100*time.Second, 101*time.Second+stallMax), []time.Duration{90 * time.Second}, false, 100*time.Second + stallMax},
		{"a fault during the stall extends it by the bound",
			s(100*time.Second, 150*time.Second+stallMax), []time.Duration{150 * time.Second}, true, 150*time.Second + stallMax},
		{"and no further",
			s(100*time.Second, 151*time.Second+stallMax), []time.Duration{150 * time.Second}, false, 150*time.Second + stallMax},
		{"a chain of faults, each inside the last one's bound",
			s(0, 100*time.Second+stallMax), []time.Duration{60 * time.Second, 100 * time.Second}, true, 100*time.Second + stallMax},
		{"a fault after the stall was already unexplained excuses nothing",
			s(0, 10*time.Second+2*stallMax), []time.Duration{stallMax + faultSlack + time.Second, stallMax + 10*time.Second}, false, stallMax},
		{"a fault just after the bound, within the slack, counts",
			s(0, 2*stallMax), []time.Duration{stallMax + faultSlack}, true, 2*stallMax + faultSlack},
		{"faults after the stall ended count for nothing",
			s(0, stallMax+time.Second), []time.Duration{stallMax + 2*time.Second}, false, stallMax},
	} {
		upTo, ok := explained(c.stall, c.faults)
		if ok != c.ok || upTo != c.upTo {
			t.Errorf("%s: explained(%v to %v, %v) = %v, %v; want %v, %v", c.name, c.stall.from, c.stall.to, c.faults, upTo, ok, c.upTo, c.ok)
		}
	}
}
