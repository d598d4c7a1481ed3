package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/dedupe/storetest"
	"github.com/idemstream/idemstream/internal/testenv"
)

// masterWithReplica starts a master and one replica that reaches it
// through a proxy able to cut the replication link.
func masterWithReplica(t *testing.T) (*testenv.RedisServer, *testenv.ReplicationProxy, *testenv.RedisServer) {
	t.Helper()
	master := testenv.StartRedis(t, testenv.RedisConfig{})
	proxy := testenv.StartReplicationProxy(t, master.Addr)
	replica := testenv.StartRedisReplica(t, proxy.Addr, testenv.RedisConfig{})
	// The replica sees its link up a moment before the master counts it
	// as an online replica: wait for the master's view too.
	testenv.WaitRedisInfo(t, master.Addr, "state=online", 20*time.Second)
	return master, proxy, replica
}

// The conformance suite, unchanged, with and without waiting for a
// replica: the wait changes when a call returns, never what it decides.
func TestConformanceWithReplica(t *testing.T) {
	master, _, _ := masterWithReplica(t)
	c := client(t, master.Addr)
	for _, n := range []int{0, 1} {
		t.Run("min_replicas="+strconv.Itoa(n), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				return storetest.Harness{Store: redisstore.New(c, freshPrefix(), redisstore.WithReplicas(n, time.Second)), Advance: time.Sleep}
			})
		})
	}
}

// A write the replica does not acknowledge in time is an error wrapping
// ErrNotReplicated (retryable); once the link is back the same call,
// retried under the same owner, succeeds and resumes the key.
func TestUnacknowledgedWriteIsNotADecision(t *testing.T) {
	master, proxy, replica := masterWithReplica(t)
	c := client(t, master.Addr)
	s := redisstore.New(c, freshPrefix(), redisstore.WithReplicas(1, 300*time.Millisecond))
	ctx := context.Background()

	small := []dedupe.DecideRequest{decideReq("acked", "h")}
	if d, err := s.Decide(ctx, small); err != nil || d[0].Verdict != dedupe.VerdictFirst {
		t.Fatalf("decide with the replica up: %v %v", d, err)
	}
	if err := s.ReplicaAckError(); err != nil {
		t.Fatalf("ReplicaAckError after an acknowledged write: %v", err)
	}
	if v, err := testenv.RedisCommand(replica.Addr, "EXISTS", s.RedisKey("p", "acked")); err != nil || v != "1" {
		t.Fatalf("replica lacks an acknowledged decision: EXISTS = %q %v", v, err)
	}

	proxy.Partition()
	big := make([]dedupe.DecideRequest, 20) // the SET NX path
	for i := range big {
		big[i] = decideReq("partitioned-"+strconv.Itoa(i), "h")
	}
	for name, call := range map[string]func() error{
		"decide (script)": func() error {
			_, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("partitioned-small", "h")})
			return err
		},
		"decide (SET NX)": func() error { _, err := s.Decide(ctx, big); return err },
		"complete": func() error {
			_, err := s.Complete(ctx, []dedupe.Completion{{Namespace: "p", Key: "acked", Owner: small[0].Owner, State: dedupe.Success}})
			return err
		},
	} {
		err := call()
		if !errors.Is(err, dedupe.ErrNotReplicated) || !errors.Is(err, dedupe.ErrStoreUnavailable) || !dedupe.IsRetryable(err) {
			t.Errorf("%s under a partition: %v; want a retryable ErrNotReplicated", name, err)
		}
	}
	if err := s.ReplicaAckError(); !errors.Is(err, dedupe.ErrNotReplicated) {
		t.Errorf("ReplicaAckError under a partition: %v", err)
	}
	// Reads do not wait.
	if _, _, err := s.Lookup(ctx, "p", "acked"); err != nil {
		t.Errorf("lookup under a partition: %v", err)
	}

	proxy.Heal()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := s.Decide(ctx, big)
		if err == nil {
			for i, x := range d {
				if x.Verdict != dedupe.VerdictFirst || !x.Resumed {
					t.Errorf("retry of %s after the partition: %v resumed=%v, want first resumed", big[i].Key, x.Verdict, x.Resumed)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition healed but decide still fails: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := s.ReplicaAckError(); err != nil {
		t.Errorf("ReplicaAckError after the heal: %v", err)
	}

	// A master that does not answer is a store error, not a replica's.
	master.Stop()
	_, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("master-down", "h")})
	if !errors.Is(err, dedupe.ErrStoreUnavailable) || errors.Is(err, dedupe.ErrNotReplicated) {
		t.Errorf("decide with the master down: %v; want ErrStoreUnavailable, not ErrNotReplicated", err)
	}
	if err := s.ReplicaAckError(); err != nil {
		t.Errorf("ReplicaAckError with the master down: %v", err)
	}
}

// With maxmemory-policy noeviction a full server refuses writes (OOM)
// instead of evicting decisions: a retryable store error, so that the
// partition pauses until entries expire, never a fatal one.
func TestFullServerPausesInsteadOfEvicting(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{Args: []string{"--maxmemory", "3mb", "--maxmemory-policy", "noeviction"}})
	s := redisstore.New(client(t, srv.Addr), "idem")
	ctx := context.Background()
	for n := 0; ; n += 100 {
		reqs := make([]dedupe.DecideRequest, 100)
		for i := range reqs {
			reqs[i] = decideReq("fill-"+strconv.Itoa(n+i), "h")
			reqs[i].Fingerprint = benchFingerprint
		}
		_, err := s.Decide(ctx, reqs)
		if err == nil {
			if n > 100000 {
				t.Fatal("3 MB held 100000 entries: maxmemory did not apply")
			}
			continue
		}
		if !strings.Contains(err.Error(), "OOM") || !errors.Is(err, dedupe.ErrStoreUnavailable) || !dedupe.IsRetryable(err) {
			t.Fatalf("decide on a full server: %v; want a retryable store error", err)
		}
		if e, ok, err := s.Lookup(ctx, "p", "fill-0"); err != nil || !ok || e.State != dedupe.Pending {
			t.Errorf("the first entry after the server filled up: %+v %v %v; want it kept", e, ok, err)
		}
		return
	}
}

// BenchmarkDecideWithReplica measures what waiting for a replica costs: the
// same batches on a master with one replica, with min_replicas 0 and 1
// (one WAIT per round trip).
func BenchmarkDecideWithReplica(b *testing.B) {
	master := testenv.StartRedis(b, testenv.RedisConfig{})
	testenv.StartRedisReplica(b, master.Addr, testenv.RedisConfig{})
	c, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + master.Addr + "/0", Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, n := range []int{0, 1} {
		for _, batch := range []int{1, 100} {
			b.Run(fmt.Sprintf("min_replicas=%d/batch=%d", n, batch), func(b *testing.B) {
				s := redisstore.New(c, freshPrefix(), redisstore.WithReplicas(n, time.Second))
				var seq atomic.Int64
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					reqs := make([]dedupe.DecideRequest, batch)
					ctx := context.Background()
					for pb.Next() {
						for i := range reqs {
							reqs[i] = decideReq("9f8a2c1d-3e4f-4a5b-8c6d-"+strconv.FormatInt(1e11+seq.Add(1), 10), "host-7f9c-4411-1a2b3c4d/g12/coupon.claim.commands/3")
							reqs[i].Fingerprint, reqs[i].RulesDigest = benchFingerprint, benchDigest
							reqs[i].Window = 30 * time.Second
						}
						if _, err := s.Decide(ctx, reqs); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
	}
}

// The conformance suite on a Cluster of three masters with a replica
// each, waiting for one replica: every round trip becomes one pipeline per
// master, each with its own WAIT.
func TestConformanceReplicatedCluster(t *testing.T) {
	rc := testenv.StartReplicatedCluster(t)
	c, err := redisstore.NewClient(redisstore.Options{Addrs: rc.Addrs(), Timeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{Store: redisstore.New(c, freshPrefix(), redisstore.WithReplicas(1, time.Second)), Advance: time.Sleep}
	})
	// A batch large enough for the SET NX path, over every master.
	s := redisstore.New(c, freshPrefix(), redisstore.WithReplicas(1, time.Second))
	reqs := make([]dedupe.DecideRequest, 300)
	for i := range reqs {
		reqs[i] = decideReq("cluster-"+strconv.Itoa(i%150), "h-"+strconv.Itoa(i/150))
	}
	decs, err := s.Decide(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	firsts := 0
	for _, d := range decs {
		if d.Verdict == dedupe.VerdictFirst {
			firsts++
		}
	}
	if firsts != 150 {
		t.Errorf("%d first decisions for 150 keys sent twice, want 150", firsts)
	}
	for _, r := range rc.Replicas {
		if n, err := testenv.RedisCommand(r.Addr, "DBSIZE"); err != nil || n == "0" {
			t.Errorf("replica %s holds %s keys (%v): the writes were acknowledged without it", r.Addr, n, err)
		}
	}
}

// On Redis 7.2 and later with appendonly yes the store waits with
// WAITAOF, which also waits for the fsyncs on the master and the
// replicas. Debian 12's redis-server is 7.0: the test skips there.
func TestWaitAOFWhereTheServerHasIt(t *testing.T) {
	aof := testenv.RedisConfig{AppendOnly: true}
	master := testenv.StartRedis(t, aof)
	if info, err := testenv.RedisCommand(master.Addr, "INFO", "server"); err != nil || !strings.Contains(info, "redis_version:7.2") && !strings.Contains(info, "redis_version:7.4") && !strings.Contains(info, "redis_version:8.") {
		t.Skipf("redis-server before 7.2 has no WAITAOF (%v)", err)
	}
	proxy := testenv.StartReplicationProxy(t, master.Addr)
	replica := testenv.StartRedisReplica(t, proxy.Addr, aof)
	// A replica acknowledges fsyncs once it has rewritten its AOF after
	// the sync; the store probes WAITAOF on its first write.
	testenv.WaitRedisInfo(t, replica.Addr, "aof_rewrites:1", 20*time.Second)
	// fsyncs on a busy disk take their time.
	s := redisstore.New(client(t, master.Addr), freshPrefix(), redisstore.WithReplicas(1, 2*time.Second))
	ctx := context.Background()
	if w, err := s.CheckServer(ctx); err != nil || len(w) > 0 {
		t.Fatalf("CheckServer = %q, %v", w, err)
	}
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("aof", "h")}); err != nil {
		t.Fatalf("decide: %v", err)
	}
	stats, err := testenv.RedisCommand(master.Addr, "INFO", "commandstats")
	if err != nil || !strings.Contains(stats, "cmdstat_waitaof:calls=") || strings.Contains(stats, "cmdstat_wait:") {
		t.Errorf("the store did not wait with WAITAOF alone: %v\n%s", err, stats)
	}
	proxy.Partition()
	_, err = s.Decide(ctx, []dedupe.DecideRequest{decideReq("aof-cut", "h")})
	proxy.Heal()
	if !errors.Is(err, dedupe.ErrNotReplicated) || !strings.Contains(err.Error(), "WAITAOF: 0 of 1 replicas acknowledged within 2s") {
		t.Errorf("decide with the link cut: %v; want a WAITAOF shortfall", err)
	}
}

// A replica without appendonly never acknowledges an fsync: the store
// finds that out at start, waits with WAIT instead of pausing every write
// for good, and CheckServer says so.
func TestWaitAOFFallsBackToWaitForReplicasWithoutAOF(t *testing.T) {
	master := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true})
	if info, err := testenv.RedisCommand(master.Addr, "INFO", "server"); err != nil || !strings.Contains(info, "redis_version:7.2") && !strings.Contains(info, "redis_version:7.4") && !strings.Contains(info, "redis_version:8.") {
		t.Skipf("redis-server before 7.2 has no WAITAOF (%v)", err)
	}
	testenv.StartRedisReplica(t, master.Addr, testenv.RedisConfig{})
	s := redisstore.New(client(t, master.Addr), freshPrefix(), redisstore.WithReplicas(1, 300*time.Millisecond))
	ctx := context.Background()
	warnings, err := s.CheckServer(ctx)
	if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], "writes wait with WAIT") || !strings.Contains(warnings[0], "set appendonly yes on the replicas") {
		t.Fatalf("CheckServer = %q, %v; want one warning about the replicas' appendonly", warnings, err)
	}
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("no-aof", "h")}); err != nil {
		t.Fatalf("decide: %v", err)
	}
	stats, err := testenv.RedisCommand(master.Addr, "INFO", "commandstats")
	if err != nil || !strings.Contains(stats, "cmdstat_wait:calls=") {
		t.Errorf("the store did not wait with WAIT: %v\n%s", err, stats)
	}
}
