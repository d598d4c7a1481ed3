package dlq

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/idemstream/idemstream/internal/retry"
)

// Clock is the time a Limiter runs on: the wall clock (WallClock), or a
// clock of a test's that moves only when told to.
type Clock interface {
	Now() time.Time
	// Sleep waits d, or until ctx ends and then returns its error.
	Sleep(ctx context.Context, d time.Duration) error
}

// WallClock is the real time.
type WallClock struct{}

// Now is time.Now.
func (WallClock) Now() time.Time { return time.Now() }

// Sleep waits d or until ctx ends.
func (WallClock) Sleep(ctx context.Context, d time.Duration) error { return retry.Sleep(ctx, d) }

// Limiter hands out permits to send records, at most Rate a second on
// average: a token bucket that holds at most Burst permits and starts
// full. Over any interval of length T it grants at most Burst + Rate×T.
// It is not safe for concurrent use.
type Limiter struct {
	rate   float64
	burst  int
	clock  Clock
	tokens float64
	last   time.Time
}

// NewLimiter returns a limiter of rate permits a second, with a burst of
// a tenth of a second's worth (at least 1, at most 500): the records of
// one second go out in about ten writes (below 10 a second, one record
// each). A nil clock is the wall clock.
// It starts nothing.
func NewLimiter(rate float64, clock Clock) (*Limiter, error) {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return nil, errors.New("the rate must be a number of records a second above 0")
	}
	if clock == nil {
		clock = WallClock{}
	}
	burst := int(min(max(rate/10, 1), 500))
	return &Limiter{rate: rate, burst: burst, clock: clock, tokens: float64(burst)}, nil
}

// Rate is the permits a second.
func (l *Limiter) Rate() float64 { return l.rate }

// Burst is the most permits one Take grants.
func (l *Limiter) Burst() int { return l.burst }

// Take waits until min(n, Burst) permits are free, takes them and returns
// how many it took. It returns ctx's error, having taken none, when ctx
// ends first.
func (l *Limiter) Take(ctx context.Context, n int) (int, error) {
	n = min(max(n, 1), l.burst)
	for {
		l.refill()
		if l.tokens >= float64(n) {
			l.tokens -= float64(n)
			return n, nil
		}
		wait := time.Duration(math.Ceil((float64(n) - l.tokens) / l.rate * float64(time.Second)))
		if err := l.clock.Sleep(ctx, wait); err != nil {
			return 0, err
		}
	}
}

func (l *Limiter) refill() {
	now := l.clock.Now()
	if !l.last.IsZero() && now.After(l.last) {
		l.tokens = min(float64(l.burst), l.tokens+now.Sub(l.last).Seconds()*l.rate)
	}
	l.last = now
}
