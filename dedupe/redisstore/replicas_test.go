package redisstore_test

import (
	"context"
	"errors"
	"strconv"
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
}
