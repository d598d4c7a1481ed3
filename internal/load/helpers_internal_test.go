package load

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	s := sortedDurations(d)
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := percentile(s, c.q); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v", got)
	}
}

func TestParseInfoAndDiff(t *testing.T) {
	before := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\n# Commandstats\r\n" +
		"cmdstat_evalsha:calls=10,usec=1000,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_set:calls=5,usec=10,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n"
	after := "# CPU\r\nused_cpu_sys:2.000000\r\nused_cpu_user:3.000000\r\n# Commandstats\r\n" +
		"cmdstat_evalsha:calls=30,usec=5000,usec_per_call=166.67,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_set:calls=5,usec=10,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=100,usec=200,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n"
	fb, cb := parseInfo(before)
	fa, ca := parseInfo(after)
	if got := serverCPU(fa) - serverCPU(fb); got < 1.2499 || got > 1.2501 {
		t.Errorf("cpu delta %v, want 1.25", got)
	}
	d := diffCommands(cb, ca)
	if len(d) != 2 || d[0].name != "evalsha" || d[0].calls != 20 || d[0].usec != 4000 || d[1].name != "get" || d[1].calls != 100 {
		t.Errorf("diff %+v: want evalsha (20 calls, 4000 usec) then get; set unchanged and left out", d)
	}
}

func TestLagCountsUncommittedPartitionsFromZero(t *testing.T) {
	end := map[int]int64{0: 10, 1: 5, 2: 0}
	if got := lag(end, map[int]int64{0: 10, 1: -1}); got != 5 {
		t.Errorf("lag %d, want 5", got)
	}
	if got := lag(end, map[int]int64{0: 10, 1: 5, 2: -1}); got != 0 {
		t.Errorf("lag %d, want 0", got)
	}
}
