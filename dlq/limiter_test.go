package dlq_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dlq"
)

// fakeClock moves only when the limiter sleeps: the test runs in no
// time, whatever the rate.
type fakeClock struct {
	now    time.Time
	slept  time.Duration
	cancel func() // called on the first sleep, when set
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if c.cancel != nil {
		c.cancel()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	c.now = c.now.Add(d)
	c.slept += d
	return nil
}

// The limiter grants at most Burst + Rate×T permits in any time T from
// its start, and no fewer than it may: sending N records takes
// (N - Burst)/Rate, not more.
func TestLimiterPace(t *testing.T) {
	for _, rate := range []float64{1, 7, 100, 2500, 1e6} {
		clock := &fakeClock{now: t0}
		l, err := dlq.NewLimiter(rate, clock)
		if err != nil {
			t.Fatal(err)
		}
		burst := l.Burst()
		if want := int(min(max(rate/10, 1), 500)); burst != want {
			t.Errorf("rate %v: burst %d, want %d", rate, burst, want)
		}
		const n = 5000
		granted := 0
		for granted < n {
			got, err := l.Take(context.Background(), n-granted)
			if err != nil {
				t.Fatal(err)
			}
			if got < 1 || got > burst {
				t.Fatalf("rate %v: took %d, want 1 to %d", rate, got, burst)
			}
			granted += got
			elapsed := clock.now.Sub(t0).Seconds()
			if float64(granted) > float64(burst)+rate*elapsed+1e-6 {
				t.Fatalf("rate %v: %d granted after %.6fs, more than burst %d + rate × time", rate, granted, elapsed, burst)
			}
		}
		// The last grant waited for its permits, so the time taken is
		// (n - burst)/rate to within one sleep's rounding up.
		least := time.Duration(float64(n-burst) / rate * float64(time.Second))
		if clock.slept < least || clock.slept > least+time.Duration(float64(n)/rate*float64(time.Millisecond)) {
			t.Errorf("rate %v: %d permits took %v, want about %v", rate, n, clock.slept, least)
		}
	}
}

// Permits not used while nothing is sent do not pile up beyond a burst.
func TestLimiterIdleKeepsOneBurst(t *testing.T) {
	clock := &fakeClock{now: t0}
	l, _ := dlq.NewLimiter(100, clock)
	clock.now = clock.now.Add(time.Hour)
	total := 0
	for total < 30 {
		n, _ := l.Take(context.Background(), 30-total)
		total += n
	}
	if want := time.Duration(float64(30-l.Burst()) / 100 * float64(time.Second)); clock.slept < want {
		t.Errorf("30 permits after an hour idle took %v, want at least %v (one burst, then the rate)", clock.slept, want)
	}
}

// A wait that the context ends takes nothing and returns its error.
func TestLimiterCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	clock := &fakeClock{now: t0, cancel: cancel}
	l, _ := dlq.NewLimiter(1, clock)
	if n, err := l.Take(ctx, 1); n != 1 || err != nil {
		t.Fatalf("first permit: %d %v", n, err)
	}
	if n, err := l.Take(ctx, 1); n != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled wait took %d, %v", n, err)
	}
	for _, bad := range []float64{0, -1} {
		if _, err := dlq.NewLimiter(bad, nil); err == nil {
			t.Errorf("rate %v accepted", bad)
		}
	}
}

// What docs/dlq.md says of any one second: fewer than rate plus one
// write's worth (a burst), so at most 1.1 × rate from 10 a second up, but
// not below, where a write is one record: 3 in a second at 2.5 a second,
// 1 at 0.5.
func TestLimiterAnyOneSecond(t *testing.T) {
	for _, rate := range []float64{0.5, 2.5, 7, 10, 15, 100, 2500} {
		clock := &fakeClock{now: t0}
		l, _ := dlq.NewLimiter(rate, clock)
		var at []time.Time // the time of each permit
		for len(at) < int(max(10*rate, 5)) {
			n, err := l.Take(context.Background(), l.Burst())
			if err != nil {
				t.Fatal(err)
			}
			for range n {
				at = append(at, clock.now)
			}
		}
		most, j := 0, 0 // the most permits in a second [at[i], at[i]+1s)
		for i := range at {
			for j < len(at) && at[j].Before(at[i].Add(time.Second)) {
				j++
			}
			most = max(most, j-i)
		}
		if float64(most) >= rate+float64(l.Burst()) || rate >= 10 && float64(most) > 1.1*rate {
			t.Errorf("rate %v: %d permits in one second, want fewer than %v and, from 10 a second up, at most 1.1 × rate", rate, most, rate+float64(l.Burst()))
		}
		if (rate == 0.5 || rate == 2.5) && float64(most) <= 1.1*rate {
			t.Errorf("rate %v: %d permits in one second at most; docs/dlq.md says %v", rate, most, math.Ceil(rate))
		}
	}
}
