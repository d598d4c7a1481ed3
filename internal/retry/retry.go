package retry

import (
	"context"
	"time"
)

// Backoff doubles from Min to Max; Reset starts it at Min again.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next is the wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	return b.cur
}

// Reset makes the next wait Min again, after an attempt that worked.
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep waits d, or until ctx ends, and then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
