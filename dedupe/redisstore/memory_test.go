package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/internal/testenv"
)

// What a window's keys cost in Redis: the growth of INFO used_memory per
// SUCCESS entry, which is what sizing maxmemory needs (MEMORY USAGE
// leaves out the key's slots in the keyspace and expiry tables). The
// entries are the load run's: UUID keys under the default prefix, real
// digests, a pod's holder, sources on a topic of a realistic name.

// usedMemory reads INFO used_memory.
func usedMemory(tb testing.TB, addr string) int64 {
	tb.Helper()
	info, err := testenv.RedisCommand(addr, "INFO", "memory")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	tb.Fatal("no used_memory in INFO memory")
	return 0
}

// fillSuccesses decides and completes n keys as SUCCESS entries and
// returns used_memory's growth per key.
func fillSuccesses(tb testing.TB, addr string, s *redisstore.Store, n int) float64 {
	tb.Helper()
	ctx := context.Background()
	const batch = 500
	before := usedMemory(tb, addr)
	for start := 0; start < n; start += batch {
		reqs := make([]dedupe.DecideRequest, batch)
		comps := make([]dedupe.Completion, batch)
		for i := range reqs {
			k := start + i
			reqs[i] = dedupe.DecideRequest{
				Namespace: "coupon-claims", Key: fmt.Sprintf("9f8a2c1d-3e4f-4a5b-8c6d-%012x", k),
				Fingerprint: fmt.Sprintf("sha256:%064x", k*7919), RulesDigest: benchDigest,
				Semantics: dedupe.Strict, Window: 10 * time.Minute, Lease: 30 * time.Second,
				Owner: dedupe.Owner{Holder: "idemstream-5d8f7c9b4-x2x7q-3fa9/g12r3/coupon.claim.commands/3",
					Source: "coupon.claim.commands/3/" + strconv.Itoa(184467440+k)},
				Intent: dedupe.Intent{Partition: 3, Floor: int64(123456789 + k)},
			}
			comps[i] = dedupe.Completion{Namespace: reqs[i].Namespace, Key: reqs[i].Key, Owner: reqs[i].Owner, State: dedupe.Success,
				Result: dedupe.ResultRef{Partition: 3, Offset: int64(123456790 + k)}}
		}
		if _, err := s.Decide(ctx, reqs); err != nil {
			tb.Fatal(err)
		}
		if errs, err := s.Complete(ctx, comps); err != nil || firstError(errs) != nil {
			tb.Fatal(err, firstError(errs))
		}
	}
	return float64(usedMemory(tb, addr)-before) / float64(n)
}

func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// docs/operations.md sizes maxmemory with these figures; the bounds leave
// room for the allocator's rounding at other key counts.
func TestMemoryPerKeyInUsedMemory(t *testing.T) {
	for _, f := range []struct {
		name  string
		opts  []redisstore.Option
		bound float64
	}{{"text", nil, 700}, {"compact", []redisstore.Option{redisstore.WithCompactEntries()}, 270}} {
		t.Run(f.name, func(t *testing.T) {
			srv := testenv.StartRedis(t, testenv.RedisConfig{})
			per := fillSuccesses(t, srv.Addr, redisstore.New(client(t, srv.Addr), "idem", f.opts...), 50000)
			t.Logf("used_memory grew by %.0f bytes per SUCCESS entry over 50,000 keys", per)
			if per > f.bound {
				t.Errorf("%.0f bytes per %s entry; docs/operations.md sizes maxmemory with less than %.0f", per, f.name, f.bound)
			}
		})
	}
}

// BenchmarkUsedMemoryPerKey is the figure of docs/benchmarks.md: used_memory's
// growth per SUCCESS entry over a million keys (MEMORY_KEYS), each format
// on a server of its own.
func BenchmarkUsedMemoryPerKey(b *testing.B) {
	keys := 1000000
	if v, err := strconv.Atoi(os.Getenv("MEMORY_KEYS")); err == nil && v > 0 {
		keys = v
	}
	for _, f := range []struct {
		name string
		opts []redisstore.Option
	}{{"text", nil}, {"compact", []redisstore.Option{redisstore.WithCompactEntries()}}} {
		b.Run(f.name, func(b *testing.B) {
			var per float64
			for range b.N {
				srv := testenv.StartRedis(b, testenv.RedisConfig{})
				per = fillSuccesses(b, srv.Addr, redisstore.New(client(b, srv.Addr), "idem", f.opts...), keys)
			}
			b.ReportMetric(per, "used_B/key")
		})
	}
}
