package testenv

import (
	"context"
	"testing"
	"time"
)

// RunUntilEnd runs run (a service's Run) in a goroutine until the test
// ends, then ends its context and fails the test if it does not return
// nil within 30 seconds. A Close registered with t.Cleanup before it runs
// after Run has returned.
func RunUntilEnd(t testing.TB, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of its context's end")
		}
	})
}
