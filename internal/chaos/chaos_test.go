package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// variant sizes a chaos run.
type variant struct {
	name        string
	backlogKeys int           // keys produced before the group starts
	streamKeys  int           // keys planned for the stream (it stops after the rolling restart)
	stream      time.Duration // the span they are planned over
	load        time.Duration // the span the faults are planned over
	loadCap     time.Duration // the faults run one at a time and may run late: none starts after this
	kills       int           // SIGKILLs of members, spread over the load
	zombies     int           // SIGSTOPs longer than the lease, spread over the load
	brokerKills int           // SIGKILLs of the leader of an output partition
	brokerDown  time.Duration // how long a killed broker stays down
	stayMin     time.Duration // the joining member stays this long (to stayMax)
	stayMax     time.Duration
	awayMin     time.Duration // and is away this long (to awayMax) before it joins again
	awayMax     time.Duration
	drain       time.Duration // bound on the final catch-up
	produceMax  time.Duration // bound on one produce batch, retries included
}

var (
	ciVariant = variant{name: "ci", backlogKeys: 12000, streamKeys: 36000, stream: 15 * time.Minute, load: 5 * time.Minute, loadCap: 12 * time.Minute,
		kills: 3, zombies: 1, brokerKills: 1, brokerDown: 8 * time.Second,
		stayMin: 3 * time.Second, stayMax: 6 * time.Second, awayMin: 2 * time.Second, awayMax: 4 * time.Second,
		drain: 4 * time.Minute, produceMax: 90 * time.Second}
	fullVariant = variant{name: "full", backlogKeys: 30000, streamKeys: 72000, stream: 30 * time.Minute, load: 14 * time.Minute, loadCap: 25 * time.Minute,
		kills: 8, zombies: 2, brokerKills: 3, brokerDown: 10 * time.Second,
		stayMin: 3 * time.Second, stayMax: 8 * time.Second, awayMin: 2 * time.Second, awayMax: 5 * time.Second,
		drain: 8 * time.Minute, produceMax: 2 * time.Minute}
)

const (
	members      = 3 // always in the group (restarted after a kill)
	partitions   = 6
	pipelineName = "chaos"
	redisPause   = 3 * time.Second
	restartAfter = time.Second // a killed member comes back after about this

	// The defaults of `idemstream run` that the faults are sized against:
	// pending_timeout 30s makes a lease of 60s; the session timeout is 10s;
	// --settle-wait is 45s, 1.5 × the cluster's replica.lag.time.max.ms.
	lease          = 60 * time.Second
	sessionTimeout = 10 * time.Second
	settleWait     = consumer.DefaultSettleWait
	// A zombie is frozen for longer than its lease: its successor has
	// taken its keys over by the time it runs again.
	zombiePause = lease + 8*time.Second
	// A member that leaves gracefully must be gone within this.
	leaveBound = 30 * time.Second
	// During the rolling restart (graceful only, no crash) no partition
	// may stall for longer than this.
	rollingStallMax = 15 * time.Second
	// No partition may ever stall for longer than a crash can explain:
	// the lease, the settle wait after an ambiguous write, a session
	// timeout, and a margin for two loaded cores.
	stallMax = lease + settleWait + sessionTimeout + 30*time.Second
	// Before a kill, a freeze or a leave, wait up to this for a target
	// that holds records in flight, so that the fault lands mid-batch:
	// long enough to outlast the rebalance that follows a kill (a
	// session timeout, the join, the lease of the killed member's keys).
	midBatchWait = 45 * time.Second
	// The rolling restart does not wait as long: under the stream alone
	// a member may hold nothing for a while, and a graceful stop of an
	// idle member is part of what a deploy does.
	rollingMidWait = 5 * time.Second
)

func chosenVariant(t *testing.T) variant {
	switch v := os.Getenv("IDEMSTREAM_CHAOS"); v {
	case "", "ci":
		return ciVariant
	case "full":
		return fullVariant
	default:
		t.Fatalf("IDEMSTREAM_CHAOS=%q: want ci or full", v)
		return variant{}
	}
}

// injected counts what the faults did, for the summary.
type injected struct {
	mu                 sync.Mutex
	kills, killsMid    int
	joins, leaves      int
	leavesMid          int
	longestLeave       time.Duration
	longestJoin        time.Duration
	zombies, zombieMid int
	brokerKills        int
	brokerMid          int
	brokerNodes        []string
	redisPauses        int
	rolling            int
	rollingStall       stall
}

func (in *injected) add(f func(*injected)) {
	in.mu.Lock()
	defer in.mu.Unlock()
	f(in)
}

// TestChaos: three `idemstream run` members with every timing at its
// default drain a backlog on a three-node Kafka cluster while more keeps
// coming; a fourth member joins and leaves gracefully all along; members
// are SIGKILLed mid-batch, one is frozen for longer than its lease, the
// leader of an output partition is killed, Redis is frozen once; then all
// three members are restarted one by one (a rolling deploy). Every outcome
// is judged from the topics. See doc.go.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test: not with -short")
	}
	began := time.Now()
	v := chosenVariant(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("IDEMSTREAM_CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("IDEMSTREAM_CHAOS_SEED=%q: %v", s, err)
		}
		seed = n
	}
	t.Logf("chaos variant %s, seed %d (IDEMSTREAM_CHAOS_SEED=%d replays the choices)", v.name, seed, seed)

	root := moduleRoot(t)
	cluster := testenv.StartKafkaCluster(t)
	brokers := cluster.Brokers
	t.Logf("three-node Kafka cluster %v up in %v (state in %s)", brokers, cluster.StartedIn.Round(100*time.Millisecond), cluster.Dir())
	// IDEMSTREAM_CHAOS_STORE=valkey runs the store on Valkey 8.1, whose
	// completions are SET … IFEQ instead of a WATCHed transaction.
	valkey := false
	switch s := os.Getenv("IDEMSTREAM_CHAOS_STORE"); s {
	case "", "redis":
	case "valkey":
		valkey = true
	default:
		t.Fatalf("IDEMSTREAM_CHAOS_STORE=%q: want redis or valkey", s)
	}
	redisSrv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true, Valkey: valkey})
	t.Logf("store: %s", map[bool]string{false: "redis-server", true: "valkey-server"}[valkey])

	buildStart := time.Now()
	bin := buildBinary(t, root)
	t.Logf("built %s in %v", bin, time.Since(buildStart).Round(time.Millisecond))

	logDir := os.Getenv("IDEMSTREAM_CHAOS_LOGS")
	if logDir == "" {
		logDir = t.TempDir()
	} else {
		logDir = filepath.Join(logDir, fmt.Sprintf("%s-%d", time.Now().Format("20060102-150405"), seed))
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run := testenv.UniqueName(t, "chaos")
	inTopic, outTopic, dlqTopic := run+".in", run+".out", run+".dlq"
	cluster.CreateTopics(t, partitions, inTopic, outTopic, dlqTopic)
	group := run + "." + pipelineName
	config := filepath.Join(logDir, "idemstream.yaml")
	// No timing is set: pending_timeout, the session timeout and
	// --settle-wait are the defaults every user runs with.
	yaml := fmt.Sprintf(`kafka: {brokers: [%s], group: %s}
store: {kind: redis, redis: {url: 'redis://%s/0', prefix: %s}}
pipelines:
  - name: %s
    input: %s
    output: %s
    dlq: %s
    key: {from: header, name: %s, format: uuid}
    semantics: strict
    window: 10m
    volatile: [/client_time]
`, strings.Join(brokers, ","), run, redisSrv.Addr, run, pipelineName, inTopic, outTopic, dlqTopic, keyHeader)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("topics %s.{in,out,dlq} (RF 3, min.insync.replicas=2), group %s, redis %s, logs in %s", run, group, redisSrv.Addr, logDir)

	rng := rand.New(rand.NewPCG(seed, 1))
	work := newWorkload(rng, v, partitions)
	t.Logf("workload: %d keys, %d records planned, %d of them in the backlog (%v); the stream stops after the rolling restart", work.keys, len(work.records), work.backlog, work.byKind)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	producer := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	// The commands arrive uncompressed, as from most producers of small
	// commands; idemstream writes its results and dead letters with its
	// default compression.
	producer.Compression = 0
	stats := &producerStats{acked: map[int]bool{}}

	// The backlog first: the group starts on a full input.
	backlogStart := time.Now()
	if err := produce(ctx, work, 0, work.backlog, backlogEnd, inTopic, producer, v.produceMax, stats); err != nil {
		t.Fatalf("backlog: %v", err)
	}
	t.Logf("backlog of %d records produced in %v", work.backlog, time.Since(backlogStart).Round(time.Millisecond))

	fl := newFleet(t, bin, config, logDir, members, 1)
	if prev := os.Getenv("IDEMSTREAM_CHAOS_PREVIOUS"); prev != "" {
		fl.previous = prev
		t.Logf("odd-numbered instances run the previous release's binary %s", prev)
	}
	fl.format = chaosEntryFormat(t, fl.previous != "")
	joiner := members // the slot of the member that joins and leaves
	fl.startAll()
	readyBy := time.Now().Add(90 * time.Second)
	for !fl.ready() {
		if crashes := fl.crashList(); len(crashes) > 0 {
			t.Fatalf("an instance exited at start: %v\n%s", crashes, fl.tail(30))
		}
		if time.Now().After(readyBy) {
			t.Fatalf("the instances were not all ready within 90s\n%s", fl.tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d members ready after %v", members, time.Since(began).Round(time.Millisecond))

	var (
		loadDone = make(chan struct{})
		wg       sync.WaitGroup
		errMu    sync.Mutex
		bgErrors []string
		events   []string
		inj      = &injected{}
	)
	loadStart := time.Now()
	prog := newProgress(loadStart)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go prog.watch(watchCtx, client, group, inTopic, partitions)
	event := func(format string, args ...any) {
		errMu.Lock()
		defer errMu.Unlock()
		events = append(events, fmt.Sprintf("%6.1fs ", time.Since(loadStart).Seconds())+fmt.Sprintf(format, args...))
	}
	fail := func(format string, args ...any) {
		errMu.Lock()
		defer errMu.Unlock()
		bgErrors = append(bgErrors, fmt.Sprintf(format, args...))
	}
	// at waits until d into the load; false when the load is over.
	at := func(d time.Duration) bool {
		select {
		case <-loadDone:
			return false
		default:
		}
		select {
		case <-loadDone:
			return false
		case <-time.After(time.Until(loadStart.Add(d))):
			return true
		}
	}
	// spread returns n moments spread over the load, a little jittered.
	spread := func(n int, salt uint64, from, to float64) []time.Duration {
		r := rand.New(rand.NewPCG(seed, salt))
		var out []time.Duration
		for i := range n {
			f := from + (to-from)*(float64(i)+0.5)/float64(n)
			f += (r.Float64() - 0.5) * (to - from) / float64(2*n)
			out = append(out, time.Duration(f*float64(v.load)))
		}
		return out
	}
	// chooseBusy picks a running member that holds records in flight,
	// polling every member in a random order until one does or timeout
	// passes (a rebalance after a kill can leave the whole group idle
	// for a session timeout and more); at the timeout it falls back to a
	// random member and reports that the fault did not land mid-batch.
	chooseBusy := func(r *rand.Rand, timeout time.Duration) (i int, mid, ok bool) {
		deadline := time.Now().Add(timeout)
		for {
			run := fl.running()
			if len(run) < 2 { // leave the group at least one member
				return 0, false, false
			}
			r.Shuffle(len(run), func(a, b int) { run[a], run[b] = run[b], run[a] })
			for _, i := range run {
				if n, ok := fl.inflight(i); ok && n > 0 {
					return i, true, true
				}
			}
			if time.Now().After(deadline) {
				return run[0], false, true
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// The stream: more keys while the group works through the backlog,
	// the faults and the rolling restart (about 40 keys a second); it
	// stops after the rolling restart.
	streamCtx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	producerErr := make(chan error, 1)
	go func() {
		producerErr <- produce(streamCtx, work, work.backlog, len(work.records), backlogEnd, inTopic, producer, v.produceMax, stats)
	}()

	// A fourth member joins and leaves gracefully (SIGTERM) all along: a
	// rolling deploy, an autoscaler.
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, 3))
		between := func(a, b time.Duration) time.Duration { return a + time.Duration(r.Int64N(int64(b-a)+1)) }
		for {
			select {
			case <-loadDone:
				return
			case <-time.After(between(v.awayMin, v.awayMax)):
			}
			joinAt := time.Now()
			fl.restart(joiner)
			if !fl.waitReady(joiner, 60*time.Second) {
				event("member %d did not join within 60s", joiner)
			} else {
				took := time.Since(joinAt)
				inj.add(func(in *injected) { in.joins++; in.longestJoin = max(in.longestJoin, took) })
			}
			stay := time.Now().Add(between(v.stayMin, v.stayMax))
			mid := fl.waitInflight(joiner, time.Until(stay))
			time.Sleep(time.Until(stay))
			if !mid {
				mid = fl.waitInflight(joiner, 0)
			}
			took, problem := fl.term(joiner, leaveBound)
			if problem != "" {
				fail("LEAVE: %s", problem)
			}
			inj.add(func(in *injected) {
				in.leaves++
				if mid {
					in.leavesMid++
				}
				in.longestLeave = max(in.longestLeave, took)
			})
			event("member %d left (SIGTERM, mid-batch %v) and was gone after %v", joiner, mid, took.Round(time.Millisecond))
		}
	}()

	// The faults: SIGKILLs of members, zombies (a member frozen for longer
	// than its lease, then let go on), SIGKILLs of the broker that leads
	// an output partition while results are written to it, and one Redis
	// freeze. Each can leave keys PENDING for a lease: a kill or a freeze
	// directly; a broker kill or the Redis freeze through a write or a
	// completion of unknown outcome, whose keys wait out their lease when
	// a rebalance (the joiner's, every few seconds) revokes the batch
	// during its settle wait. A second fault before the group has
	// recovered from the first chains the lease waits (a kill of the
	// member that waits out a killed member's keys leaves its own keys for
	// a lease of their own): a full run with independent schedules had
	// every partition stalled for 2m after a freeze and three kills within
	// 70s. So the faults come one at a time, in the order planned, each
	// when its time has come and every partition has committed since the
	// last one ended; then stallMax holds for every stall. The load phase
	// lasts until the last fault is over; none starts after loadCap.
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		type plannedFault struct {
			at   time.Duration
			kind string
		}
		var plan []plannedFault
		for _, when := range spread(v.kills, 4, 0.05, 0.95) {
			plan = append(plan, plannedFault{when, "member kill"})
		}
		for _, when := range spread(v.zombies, 6, 0.1, 0.55) {
			plan = append(plan, plannedFault{when, "member freeze"})
		}
		for _, when := range spread(v.brokerKills, 8, 0.3, 0.8) {
			plan = append(plan, plannedFault{when, "broker kill"})
		}
		plan = append(plan, plannedFault{time.Duration(0.7 * float64(v.load)), "redis freeze"})
		slices.SortStableFunc(plan, func(a, b plannedFault) int { return cmp.Compare(a.at, b.at) })
		kills := rand.New(rand.NewPCG(seed, 2))
		zombies := rand.New(rand.NewPCG(seed, 5))
		brokers := rand.New(rand.NewPCG(seed, 7))
		for n, f := range plan {
			if !at(f.at) {
				event("%d faults not injected (the next: a %s): no fault starts after the cap of %v", len(plan)-n, f.kind, v.loadCap)
				return
			}
			switch f.kind {
			case "member kill":
				i, mid, ok := chooseBusy(kills, midBatchWait)
				if !ok {
					event("SIGKILL skipped: fewer than two members running")
					continue
				}
				fl.kill(i)
				inj.add(func(in *injected) {
					in.kills++
					if mid {
						in.killsMid++
					}
				})
				event("SIGKILL member %d (mid-batch %v)", i, mid)
				time.Sleep(restartAfter/2 + time.Duration(kills.Int64N(int64(restartAfter))))
				fl.restart(i)
			case "member freeze":
				i, mid, ok := chooseBusy(zombies, midBatchWait)
				if !ok {
					event("SIGSTOP skipped: fewer than two members running")
					continue
				}
				fl.freeze(i)
				event("SIGSTOP member %d for %v (mid-batch %v)", i, zombiePause, mid)
				time.Sleep(zombiePause) // not cut short by the end of the load
				fl.thaw(i)
				inj.add(func(in *injected) {
					in.zombies++
					if mid {
						in.zombieMid++
					}
				})
				event("SIGCONT member %d", i)
			case "broker kill":
				// The partition to hit: one whose results are being
				// written right now (its end offset moves between two
				// looks), so that the kill cuts writes in flight.
				q, mid := writtenNow(ctx, client, outTopic, partitions, 30*time.Second)
				if q < 0 {
					q = brokers.IntN(partitions)
				}
				lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
				leader, err := cluster.Leader(lctx, outTopic, q)
				lcancel()
				if err != nil {
					fail("broker kill: leader of %s/%d: %v", outTopic, q, err)
					continue
				}
				if err := cluster.Kill(leader); err != nil {
					fail("broker kill: %v: no more faults", err)
					return
				}
				inj.add(func(in *injected) {
					in.brokerKills++
					if mid {
						in.brokerMid++
					}
					in.brokerNodes = append(in.brokerNodes, fmt.Sprintf("node %d (leader of out/%d)", leader, q))
				})
				event("SIGKILL broker node %d, leader of output partition %d (results being written %v)", leader, q, mid)
				time.Sleep(v.brokerDown)
				if err := cluster.Start(leader); err != nil {
					fail("broker restart: %v: no more faults", err)
					return
				}
				back := time.Now()
				for {
					ictx, icancel := context.WithTimeout(ctx, 5*time.Second)
					err := cluster.InSync(ictx, inTopic, outTopic, dlqTopic)
					icancel()
					if err == nil {
						event("broker node %d up again, every replica in sync after %v", leader, time.Since(back).Round(time.Millisecond))
						break
					}
					if time.Since(back) > 2*time.Minute {
						fail("broker node %d up again, replicas not in sync after 2m: %v", leader, err)
						break
					}
					time.Sleep(250 * time.Millisecond)
				}
			case "redis freeze":
				event("redis SIGSTOP for %v", redisPause)
				redisSrv.Pause()
				time.Sleep(redisPause)
				redisSrv.Resume()
				inj.add(func(in *injected) { in.redisPauses++ })
				event("redis SIGCONT")
			}
			ended := time.Now()
			took, ok := prog.waitAdvanced(ctx, ended, stallMax)
			if !ok {
				// The liveness check below fails the run; more faults
				// would only blur what it reports.
				event("not every partition committed within %v after that %s: no more faults", stallMax, f.kind)
				return
			}
			event("every partition committed %v after that %s", took.Round(time.Millisecond), f.kind)
		}
	}()

	select {
	case <-faultsDone:
	case <-time.After(time.Until(loadStart.Add(v.loadCap))):
	}
	close(loadDone)
	<-faultsDone
	wg.Wait()
	fl.ensureRunning()
	event("faults over")

	// Recovery: everything produced before the faults ended is committed
	// within what a crash can explain.
	for i := range members {
		if !fl.waitReady(i, 90*time.Second) {
			event("member %d not ready 90s after the faults", i)
		}
	}
	qctx, qcancel := context.WithTimeout(ctx, 30*time.Second)
	target, _, err := groupProgress(qctx, client, group, inTopic, partitions)
	qcancel()
	if err != nil {
		fail("after the faults: end offsets: %v", err)
	} else if took, err := waitCommitted(ctx, client, group, inTopic, partitions, target, stallMax); err != nil {
		fail("LIVENESS after the faults: %v", err)
		event("NOT caught up with the faults after %v", took.Round(time.Millisecond))
	} else {
		event("caught up with everything produced during the faults in %v", took.Round(time.Millisecond))
	}

	// A rolling restart under load, graceful only: each member in turn
	// gets SIGTERM and a successor that joins before the next one goes.
	rollFrom := time.Since(loadStart)
	event("rolling restart begins")
	for i := range members {
		mid := fl.waitInflight(i, rollingMidWait)
		took, problem := fl.term(i, leaveBound)
		if problem != "" {
			fail("ROLLING RESTART: %s", problem)
		}
		fl.restart(i)
		joinAt := time.Now()
		ok := fl.waitReady(i, 60*time.Second)
		event("rolling restart: member %d stopped in %v (mid-batch %v), successor ready %v after %v", i, took.Round(time.Millisecond), mid, ok, time.Since(joinAt).Round(time.Millisecond))
		inj.add(func(in *injected) { in.rolling++ })
	}
	rollTo := time.Since(loadStart)
	// The successors' first batches belong to the restart too.
	time.Sleep(rollingStallMax)
	rollStall := prog.longest(rollFrom, rollTo+rollingStallMax)
	inj.add(func(in *injected) { in.rollingStall = rollStall })
	if rollStall.length() > rollingStallMax {
		fail("STALL during the rolling restart (graceful leaves and joins only): partition %d committed nothing from %.1fs to %.1fs (%v), bound %v",
			rollStall.partition, rollStall.from.Seconds(), rollStall.to.Seconds(), rollStall.length().Round(100*time.Millisecond), rollingStallMax)
	}

	stopStream()
	var perr error
	select {
	case perr = <-producerErr:
		if errors.Is(perr, context.Canceled) && ctx.Err() == nil {
			perr = nil // stopped on purpose
		}
	case <-time.After(v.produceMax):
		perr = fmt.Errorf("the producer did not stop")
	}
	loadTook := time.Since(loadStart)
	if perr != nil {
		cancel()
		t.Fatalf("producer: %v (acknowledged writes %d, failed %d, last error %s)\n%s", perr, stats.writes, stats.failures, stats.lastErr, fl.tail(20))
	}
	kills, starts := fl.counts()
	t.Logf("load over after %v: %d kills, %d starts; produce: %d writes, %d failed (%d records sent again), longest wait for an ack %v; last produce error: %s",
		loadTook.Round(time.Millisecond), kills, starts, stats.writes, stats.failures, stats.retried, stats.maxStall.Round(time.Millisecond), stats.lastErr)

	// Drain: the group commits the end of every input partition.
	drainTook, drainErr := waitCommitted(ctx, client, group, inTopic, partitions, nil, v.drain)
	if drainErr != nil {
		t.Errorf("DRAIN: %v\n%s", drainErr, fl.tail(40))
	} else {
		t.Logf("group committed the end of every input partition %v after the load", drainTook.Round(time.Millisecond))
	}
	stopWatch()
	worst := prog.longest(0, time.Since(loadStart))
	if worst.length() > stallMax {
		t.Errorf("LIVENESS: partition %d committed nothing from %.1fs to %.1fs (%v): longer than a crash can explain (%v)",
			worst.partition, worst.from.Seconds(), worst.to.Seconds(), worst.length().Round(100*time.Millisecond), stallMax)
	}
	if !fl.waitServing(30 * time.Second) {
		t.Errorf("STOP: an instance does not answer /healthz 30s after its start\n%s", fl.tail(20))
	}
	for _, p := range fl.stopAll(30 * time.Second) {
		t.Errorf("STOP: %s", p)
	}
	for _, c := range fl.crashList() {
		t.Errorf("CRASH: %s", c)
	}
	errMu.Lock()
	for _, e := range events {
		t.Logf("event %s", e)
	}
	for _, e := range bgErrors {
		t.Errorf("%s", e)
	}
	errMu.Unlock()
	for _, s := range prog.over(15 * time.Second) {
		t.Logf("stall: partition %d committed nothing from %.1fs to %.1fs (%v)", s.partition, s.from.Seconds(), s.to.Seconds(), s.length().Round(100*time.Millisecond))
	}

	// Every fault must have landed where it hurts, or the run proves less
	// than it claims.
	inj.mu.Lock()
	for _, c := range []struct {
		what      string
		done, mid int
	}{
		{"SIGKILL of a member", inj.kills, inj.killsMid},
		{"graceful leave", inj.leaves, inj.leavesMid},
		{"SIGSTOP of a member", inj.zombies, inj.zombieMid},
		{"SIGKILL of a broker", inj.brokerKills, inj.brokerMid}, // mid: while results were written
	} {
		if c.mid == 0 {
			t.Errorf("INJECTION: no %s landed mid-batch (%d injected): the run does not prove what it claims", c.what, c.done)
		}
	}
	if inj.kills < v.kills || inj.zombies < v.zombies || inj.brokerKills < v.brokerKills || inj.redisPauses < 1 {
		t.Errorf("INJECTION: %d of %d member kills, %d of %d freezes, %d of %d broker kills and %d of 1 Redis freeze ran (see the events for why the rest did not: the cap of %v, a skip, or a recovery that took too long): the run does not prove what it claims",
			inj.kills, v.kills, inj.zombies, v.zombies, inj.brokerKills, v.brokerKills, inj.redisPauses, v.loadCap)
	}
	inj.mu.Unlock()

	// Judge from the topics.
	rctx, rcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer rcancel()
	// A transport of its own: kafka-go's default one is shared by every
	// client of this process, and its pooled connections and metadata
	// have seen the broker kills.
	reader := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second,
		Transport: &kafka.Transport{DialTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second}})
	input, err := readTopic(rctx, reader, inTopic)
	if err != nil {
		t.Fatalf("read input: %v", err)
	}
	output, err := readTopic(rctx, reader, outTopic)
	if err != nil {
		t.Fatalf("read output: %v", err)
	}
	dlq, err := readTopic(rctx, reader, dlqTopic)
	if err != nil {
		t.Fatalf("read dlq: %v", err)
	}
	canon, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{Volatile: []string{"/client_time"}})
	if err != nil {
		t.Fatal(err)
	}
	stats.mu.Lock()
	acked := stats.acked
	stats.mu.Unlock()
	vd := judge(canon, input, output, dlq, acked)
	const show = 40
	for i, p := range vd.problems {
		if i == show {
			t.Errorf("... and %d more problems", len(vd.problems)-show)
			break
		}
		t.Errorf("%s", p)
	}
	if len(vd.badKeys) > 0 {
		inspectKeys(t, bin, config, fl, vd.badKeys, 5)
	}

	markers := fl.countLines(logMarkers...)
	var seen []string
	for _, m := range logMarkers {
		if markers[m] > 0 {
			seen = append(seen, fmt.Sprintf("%q=%d", m, markers[m]))
		}
	}
	t.Logf("instance log lines: %s", strings.Join(seen, " "))

	inj.mu.Lock()
	injectedLine := fmt.Sprintf("injected: member SIGKILLs %d of %d planned (mid-batch %d); graceful joins %d, leaves %d (mid-batch %d, longest exit %v, longest join %v); "+
		"zombie SIGSTOPs %d of %d planned, each %v (mid-batch %d); broker SIGKILLs %d of %d planned (during result writes %d: %s); redis pauses %d; rolling restart of %d members (longest stall %v)",
		inj.kills, v.kills, inj.killsMid, inj.joins, inj.leaves, inj.leavesMid, inj.longestLeave.Round(time.Millisecond), inj.longestJoin.Round(time.Millisecond),
		inj.zombies, v.zombies, zombiePause, inj.zombieMid, inj.brokerKills, v.brokerKills, inj.brokerMid, strings.Join(inj.brokerNodes, ", "), inj.redisPauses,
		inj.rolling, inj.rollingStall.length().Round(100*time.Millisecond))
	inj.mu.Unlock()
	verdictWord := "PASS"
	if t.Failed() {
		verdictWord = "FAIL"
	}
	summary := fmt.Sprintf("CHAOS %s: %s\nCHAOS %s verdict %s: keys=%d lost=%d duplicated=%d input=%d (dup %d) results=%d first=%d replay=%d conflict=%d invalid=%d failed=%d "+
		"dlq=%d (dup %d) cross-partition-results=%d longest-stall=%v load=%v drain=%v total=%v problems=%d seed=%d",
		v.name, injectedLine, v.name, verdictWord, vd.keys, vd.lost, vd.duplicated, vd.inputs, vd.inputDups, vd.results, vd.first, vd.replay, vd.conflict, vd.invalid, vd.failed,
		vd.dlqRecords, vd.dlqDups, vd.crossResults, worst.length().Round(100*time.Millisecond), loadTook.Round(time.Second), drainTook.Round(time.Second),
		time.Since(began).Round(time.Second), len(vd.problems), seed)
	t.Log(summary)
	if os.Getenv("IDEMSTREAM_CHAOS_LOGS") != "" {
		report := summary + "\n" + strings.Join(vd.problems, "\n") + "\n"
		_ = os.WriteFile(filepath.Join(logDir, "report.txt"), []byte(report), 0o644)
	}
	if t.Failed() {
		t.Logf("instance logs: %s\n%s", logDir, fl.tail(15))
	}
}

// logMarkers are the instance log lines worth counting: what the faults
// made the instances do.
var logMarkers = []string{
	"rebalance: generation joined", "paused: decide", "paused: complete", "paused: write", "paused: scan", "paused: fetch",
	"outcome unknown", "batch abandoned", "revoked:", "batch dropped without commit", "fenced", "offset commit failed",
	"committed offset out of range", "level=ERROR", "panic",
}

// writtenNow polls the end offsets of topic until one partition's end
// moves between two looks (records are being appended to it now) and
// returns it, or -1 and false after timeout.
func writtenNow(ctx context.Context, client *kafka.Client, topic string, partitions int, timeout time.Duration) (int, bool) {
	deadline := time.Now().Add(timeout)
	var prev map[int]int64
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var reqs []kafka.OffsetRequest
		for p := range partitions {
			reqs = append(reqs, kafka.LastOffsetOf(p))
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lo, err := client.ListOffsets(qctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
		cancel()
		if err == nil {
			cur := map[int]int64{}
			for _, po := range lo.Topics[topic] {
				if po.Error == nil {
					cur[po.Partition] = po.LastOffset
				}
			}
			for p, end := range cur {
				if old, ok := prev[p]; ok && end > old {
					return p, true
				}
			}
			prev = cur
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1, false
}

// inspectKeys logs the stored state and the log lines of a few keys the
// verification flagged, as evidence.
func inspectKeys(t *testing.T, bin, config string, fl *fleet, keys map[string]bool, n int) {
	t.Helper()
	for key := range keys {
		if n == 0 {
			return
		}
		n--
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, bin, "inspect", "--config", config, "--pipeline", pipelineName, key)
		cmd.Env = childEnv()
		out, err := cmd.CombinedOutput()
		cancel()
		t.Logf("idemstream inspect %s (err %v):\n%s", key, err, out)
		for _, line := range fl.logLines(20, key) {
			t.Logf("  %s", line)
		}
	}
}
