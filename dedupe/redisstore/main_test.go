package redisstore_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// The outage tests make go-redis log every failed dial; the tests
	// assert the errors themselves.
	redis.SetLogger(quiet{})
	if code := m.Run(); code != 0 {
		os.Exit(code)
	}
	if err := goleak.Find(goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper")); err != nil {
		os.Stderr.WriteString("goroutine leak: " + err.Error() + "\n")
		os.Exit(1)
	}
}
