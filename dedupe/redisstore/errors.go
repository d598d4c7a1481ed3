package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
)

// classify keeps the one rule of the package: anything that is not a
// definite answer from the server leaves the records undecided.
func classify(op string, err error) error {
	var netErr net.Error
	switch {
	case isMarkerFailure(err), errors.Is(err, dedupe.ErrStoreForgot):
		return err
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr),
		errors.Is(err, redis.ErrClosed), isTransient(err):
		return fmt.Errorf("%s: %w: %w", op, dedupe.ErrStoreUnavailable, err)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		if refusedForGood(err) {
			return fmt.Errorf("%s: redis refused: %w", op, err)
		}
		// Anything else the server says may pass (a full client table,
		// NOREPLICAS, MISCONF, a failover in progress): pause, not stop.
		return fmt.Errorf("%s: %w: %w", op, dedupe.ErrStoreUnavailable, err)
	}
	// An I/O error that is not a net.Error (EOF on a cut connection).
	return fmt.Errorf("%s: %w: %w", op, dedupe.ErrStoreUnavailable, err)
}

// refusedForGood: answers that an operator must act on (credentials,
// permissions, a key of another type, a command or script the server does
// not take). Retrying them would loop for ever.
func refusedForGood(err error) bool {
	msg := err.Error()
	for _, p := range []string{"NOPERM", "NOAUTH", "WRONGPASS", "WRONGTYPE", "ERR unknown command", "ERR wrong number of arguments",
		"ERR syntax error", "ERR Error running script", "ERR user_script", "ERR unknown subcommand",
		// An ACL's refusal of a command a script runs: Redis 7.0's
		// words, then 7.2's.
		"can't run this command or subcommand", "ACL failure in script"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func isTransient(err error) bool {
	msg := err.Error()
	// OOM: maxmemory reached under noeviction; entries expire, so the
	// pause ends by itself once the window moves on.
	for _, p := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "MOVED", "ASK", "OOM", "EOF", "connection reset", "broken pipe", "i/o timeout"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}
