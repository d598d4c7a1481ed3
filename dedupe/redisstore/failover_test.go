package redisstore_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/internal/testenv"
)

// The failover runs stream commands through the store as the consumer
// does (decide a batch, then complete it; a store error pauses and
// retries the same batch under the same owner), cut the replication link
// for two seconds, kill the master, let the replica take over, bring an
// empty host back, and then retry every key once. A retry decided first
// is a second result for a key that was already answered.
const (
	failoverKeys  = 6000
	failoverBatch = 30
	// failoverPace spaces batches: 600 commands a second.
	failoverPace      = 50 * time.Millisecond
	failoverPartition = 2 * time.Second
	// failoverAt is how many keys are done when the partition starts.
	failoverAt = 2400
)

// failoverRun is what one run saw.
type failoverRun struct {
	committed      int   // keys decided first and completed
	duringFault    int   // keys decided while the link was cut
	unacknowledged int64 // store calls refused for want of replicas
	fenced         int   // completions of keys the failover had lost
	second         int   // keys decided first again by the retry
	lost           []string
}

// streamAndRetry drives the store; fault is called once failoverAt keys
// are done, in its own goroutine, and must return when the store has a
// new master. It returns what the run saw.
func streamAndRetry(t *testing.T, s *redisstore.Store, fault func(partitioned *atomic.Bool)) failoverRun {
	t.Helper()
	ctx := context.Background()
	var run failoverRun
	var unacked atomic.Int64
	retry := func(what string, call func() error) {
		deadline := time.Now().Add(45 * time.Second)
		for {
			err := call()
			if err == nil {
				return
			}
			if errors.Is(err, dedupe.ErrStoreForgot) {
				// Deciding on would decide first again what the store
				// lost: the fault was not the one planned.
				t.Fatalf("%s: %v", what, err)
			}
			if errors.Is(err, dedupe.ErrNotReplicated) {
				unacked.Add(1)
			}
			if !dedupe.IsRetryable(err) || time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(failoverPace)
		}
	}
	faultDone := make(chan struct{})
	var partitioned atomic.Bool
	started := false
	for start := 0; start < failoverKeys; start += failoverBatch {
		if start >= failoverAt && !started {
			started = true
			partitioned.Store(true)
			go func() {
				defer close(faultDone)
				fault(&partitioned)
			}()
		}
		during := partitioned.Load()
		reqs := make([]dedupe.DecideRequest, failoverBatch)
		for i := range reqs {
			reqs[i] = decideReq("key-"+strconv.Itoa(start+i), "stream")
			reqs[i].Owner.Source = "commands/0/" + strconv.Itoa(start+i)
			reqs[i].Window, reqs[i].Lease = 10*time.Minute, time.Minute
		}
		var decs []dedupe.Decision
		retry("decide", func() (err error) { decs, err = s.Decide(ctx, reqs); return err })
		comps := make([]dedupe.Completion, len(reqs))
		for i, d := range decs {
			if d.Verdict != dedupe.VerdictFirst {
				t.Fatalf("%s decided %v in the stream, want first", reqs[i].Key, d.Verdict)
			}
			comps[i] = dedupe.Completion{Namespace: "p", Key: reqs[i].Key, Owner: reqs[i].Owner, State: dedupe.Success,
				Result: dedupe.ResultRef{Partition: 0, Offset: int64(start + i)}}
		}
		var errs []error
		retry("complete", func() (err error) { errs, err = s.Complete(ctx, comps); return err })
		for _, err := range errs {
			// The result is out: a completion the new master fences
			// (its entry is gone) is a key already answered.
			if errors.Is(err, dedupe.ErrFenced) {
				run.fenced++
			} else if err != nil {
				t.Fatalf("complete: %v", err)
			}
		}
		run.committed += len(reqs)
		if during {
			run.duringFault += len(reqs)
		}
		time.Sleep(failoverPace)
	}
	if started {
		<-faultDone
	}
	run.unacknowledged = unacked.Load()

	// Every key once more, from another consumer.
	for start := 0; start < failoverKeys; start += 500 {
		reqs := make([]dedupe.DecideRequest, 500)
		for i := range reqs {
			reqs[i] = decideReq("key-"+strconv.Itoa(start+i), "retry")
			reqs[i].Owner.Source = "commands/0/retry-" + strconv.Itoa(start+i)
			reqs[i].Window, reqs[i].Lease, reqs[i].Final = 10*time.Minute, time.Minute, true
		}
		var decs []dedupe.Decision
		retry("retry decide", func() (err error) { decs, err = s.Decide(ctx, reqs); return err })
		for i, d := range decs {
			if d.Verdict == dedupe.VerdictFirst {
				run.second++
				run.lost = append(run.lost, reqs[i].Key)
			}
		}
	}
	return run
}

// lostRange says which keys were lost, for the log: the stream numbers
// them in order, so a partition's losses are one run of numbers.
func (r failoverRun) lostRange() string {
	if len(r.lost) == 0 {
		return "none"
	}
	return r.lost[0] + " … " + r.lost[len(r.lost)-1]
}

// sentinelFailover is a master with one replica behind a proxy that can
// cut their link, watched by three Sentinels.
type sentinelFailover struct {
	master, replica *testenv.RedisServer
	proxy           *testenv.ReplicationProxy
	sentinels       []string
	watch           *testenv.RedisWatch
}

func startSentinelFailover(t *testing.T) *sentinelFailover {
	t.Helper()
	f := &sentinelFailover{}
	// The old master comes back empty (no persistence) and rejoins as a
	// replica: with replica-priority 0 no Sentinel ever promotes it. A
	// Sentinel that takes the promoted master for down (three seconds of
	// load are enough with down-after 3 s) would otherwise promote the
	// empty node and have the master resync from it (docs/operations.md).
	f.master = testenv.StartRedis(t, testenv.RedisConfig{Args: []string{"--replica-priority", "0"}})
	f.proxy = testenv.StartReplicationProxy(t, f.master.Addr)
	// Sentinel sets a replica's replicaof to the address it monitors:
	// both are the proxy.
	f.replica = testenv.StartRedisReplica(t, f.proxy.Addr, testenv.RedisConfig{})
	f.sentinels = testenv.StartRedisSentinels(t, f.proxy.Addr, 3, 2)
	f.waitReplicasSeen(t)
	f.watch = testenv.WatchRedis(t, "mymaster", f.sentinels, "master", f.master.Addr, "replica", f.replica.Addr)
	t.Cleanup(func() {
		if t.Failed() {
			f.watch.Stop()
			t.Log(f.watch.Report())
		}
	})
	return f
}

// waitReplicasSeen waits until every Sentinel knows the replica (it
// learns it from the master's INFO): one that does not cannot promote it.
func (f *sentinelFailover) waitReplicasSeen(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range f.sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: a})
		for {
			r, err := sc.Replicas(context.Background(), "mymaster").Result()
			n, _ := sc.Sentinels(context.Background(), "mymaster").Result()
			if err == nil && len(r) == 1 && len(n) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s does not see the replica and its peers: %v %v %v", a, r, n, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		sc.Close()
	}
}

// planned fails the test as "fault not injected" unless the run saw the
// one failover it planned: every Sentinel switched the master once, to
// the replica.
func (f *sentinelFailover) planned(t *testing.T) {
	t.Helper()
	for _, a := range f.sentinels {
		if n := testenv.Failovers(a); n != 1 {
			t.Fatalf("fault not injected as planned: Sentinel %s saw %d failovers, want 1", a, n)
		}
	}
	if info, err := testenv.RedisCommand(f.replica.Addr, "INFO", "replication"); err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("fault not injected as planned: the replica is not the master at the end: %.200s %v", info, err)
	}
}

// fault cuts the link, keeps deciding for two seconds, kills the master,
// waits for the promotion and brings an empty host back at the old
// address.
func (f *sentinelFailover) fault(t *testing.T) func(partitioned *atomic.Bool) {
	return func(partitioned *atomic.Bool) {
		f.proxy.Partition()
		f.watch.Mark("replication link partitioned")
		time.Sleep(failoverPartition)
		f.master.Kill()
		f.proxy.Cut()
		f.watch.Mark("master killed, link cut")
		partitioned.Store(false)
		// Every Sentinel must know of the promotion before the old
		// master's address answers again: one that does not still takes
		// the empty server there for the master and turns the promoted
		// replica back into its replica, which empties it.
		want := strconv.Itoa(f.replica.Port())
		deadline := time.Now().Add(30 * time.Second)
		for _, a := range f.sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: a})
			for {
				addr, err := sc.GetMasterAddrByName(context.Background(), "mymaster").Result()
				if err == nil && len(addr) == 2 && addr[1] == want {
					break
				}
				if time.Now().After(deadline) {
					sc.Close()
					t.Errorf("Sentinel %s did not learn of the promotion within 30s: %v %v", a, addr, err)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			sc.Close()
		}
		f.watch.Mark("every Sentinel names the replica master; restarting the old master empty")
		f.master.Start() // empty: no AOF, no snapshot
	}
}

func sentinelClient(t *testing.T, sentinels []string, replicaTimeout time.Duration) redis.UniversalClient {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.Options{Addrs: sentinels, MasterName: "mymaster", Timeout: 2*time.Second + replicaTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func failoverOn(t *testing.T) {
	t.Helper()
	if testing.Short() && os.Getenv("IDEMSTREAM_REQUIRE_SERVERS") != "1" {
		t.Skip("failover runs take half a minute each")
	}
}

// With min_replicas 0 a Sentinel failover forgets what the master
// acknowledged while its replica was cut off: those keys get a second
// result. The run prints how many.
func TestSentinelFailoverLosesDecisionsWithoutReplicaAcks(t *testing.T) {
	failoverOn(t)
	f := startSentinelFailover(t)
	s := redisstore.New(sentinelClient(t, f.sentinels, 0), freshPrefix())
	run := streamAndRetry(t, s, f.fault(t))
	f.planned(t)
	t.Logf("min_replicas 0, Sentinel failover after a %s partition: %d of %d keys decided first again (%d decided during the partition, %d completions fenced); lost: %s",
		failoverPartition, run.second, run.committed, run.duringFault, run.fenced, run.lostRange())
	if run.second == 0 {
		t.Errorf("no key was decided twice: the partition did not cost the decisions the test means to show lost")
	}
}

// With min_replicas 1 the same run gives no second result: the stream
// pauses while the replica is cut off (the writes are not acknowledged,
// so not decisions) and resumes on the promoted replica once it has a
// replica of its own.
func TestSentinelFailoverKeepsDecisionsWithReplicaAcks(t *testing.T) {
	failoverOn(t)
	f := startSentinelFailover(t)
	const timeout = 500 * time.Millisecond
	// Compact entries: the format a deployment moves to keeps the
	// guarantee through the failover (the runs without acknowledgement
	// keep text).
	s := redisstore.New(sentinelClient(t, f.sentinels, timeout), freshPrefix(), redisstore.WithReplicas(1, timeout), redisstore.WithCompactEntries())
	run := streamAndRetry(t, s, f.fault(t))
	f.planned(t)
	t.Logf("min_replicas 1, Sentinel failover after a %s partition: %d of %d keys decided first again; %d store calls refused as unacknowledged, %d completions fenced",
		failoverPartition, run.second, run.committed, run.unacknowledged, run.fenced)
	if run.second != 0 || run.fenced != 0 {
		t.Errorf("%d keys got a second result and %d completions were fenced, want none", run.second, run.fenced)
	}
	if run.unacknowledged == 0 {
		t.Errorf("no write was refused for want of a replica: the partition did not bite")
	}
	if run.committed != failoverKeys {
		t.Errorf("%d keys done, want %d", run.committed, failoverKeys)
	}
}

// clusterFault cuts the replication link of the first master for two
// seconds, kills it, waits until the cluster promoted its replica, and
// restarts it empty at the old address (it rejoins as a replica).
func clusterFault(t *testing.T, c *testenv.ReplicatedCluster) func(partitioned *atomic.Bool) {
	return func(partitioned *atomic.Bool) {
		c.Proxies[0].Partition()
		time.Sleep(failoverPartition)
		c.Masters[0].Kill()
		c.Proxies[0].Cut()
		partitioned.Store(false)
		deadline := time.Now().Add(30 * time.Second)
		for {
			info, err := testenv.RedisCommand(c.Replicas[0].Addr, "INFO", "replication")
			if err == nil && strings.Contains(info, "role:master") {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("the cluster did not promote the replica within 30s: %.200s %v", info, err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Masters[0].Start()
	}
}

func clusterClient(t *testing.T, c *testenv.ReplicatedCluster, replicaTimeout time.Duration) redis.UniversalClient {
	t.Helper()
	cc, err := redisstore.NewClient(redisstore.Options{Addrs: c.Addrs(), Timeout: 2*time.Second + replicaTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// The same run on a Cluster of three masters and three
// replicas: a master's link is cut, it dies, the cluster promotes its
// replica. Without acknowledgements the keys of its slots decided during
// the cut are decided again.
func TestClusterFailoverLosesDecisionsWithoutReplicaAcks(t *testing.T) {
	failoverOn(t)
	c := testenv.StartReplicatedCluster(t)
	s := redisstore.New(clusterClient(t, c, 0), freshPrefix())
	run := streamAndRetry(t, s, clusterFault(t, c))
	t.Logf("min_replicas 0, Cluster failover of one of three masters after a %s partition: %d of %d keys decided first again (%d decided during the partition, %d completions fenced); lost: %s",
		failoverPartition, run.second, run.committed, run.duringFault, run.fenced, run.lostRange())
	if run.second == 0 {
		t.Errorf("no key was decided twice: the partition did not cost the decisions the test means to show lost")
	}
}

// With min_replicas 1 the Cluster keeps every decision: one WAIT per
// master per round trip, and the cut master's writes are refused until
// its promoted replica has a replica again.
func TestClusterFailoverKeepsDecisionsWithReplicaAcks(t *testing.T) {
	failoverOn(t)
	c := testenv.StartReplicatedCluster(t)
	const timeout = 500 * time.Millisecond
	s := redisstore.New(clusterClient(t, c, timeout), freshPrefix(), redisstore.WithReplicas(1, timeout), redisstore.WithCompactEntries())
	run := streamAndRetry(t, s, clusterFault(t, c))
	t.Logf("min_replicas 1, Cluster failover of one of three masters after a %s partition: %d of %d keys decided first again; %d store calls refused as unacknowledged, %d completions fenced",
		failoverPartition, run.second, run.committed, run.unacknowledged, run.fenced)
	if run.second != 0 || run.fenced != 0 {
		t.Errorf("%d keys got a second result and %d completions were fenced, want none", run.second, run.fenced)
	}
	if run.unacknowledged == 0 {
		t.Errorf("no write was refused for want of a replica: the partition did not bite")
	}
	if run.committed != failoverKeys {
		t.Errorf("%d keys done, want %d", run.committed, failoverKeys)
	}
}
