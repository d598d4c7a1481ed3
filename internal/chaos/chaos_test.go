package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// variant sizes a chaos run.
type variant struct {
	name       string
	keys       int
	load       time.Duration // how long records are produced and instances killed
	killMin    time.Duration // between two kills
	killMax    time.Duration
	recovery   time.Duration // liveness bound after the Redis pause and the broker restart
	drain      time.Duration // bound on the final catch-up
	produceMax time.Duration // bound on one produce batch, retries included
}

var (
	ciVariant = variant{name: "ci", keys: 2000, load: 75 * time.Second,
		killMin: 3 * time.Second, killMax: 5 * time.Second,
		recovery: 60 * time.Second, drain: 120 * time.Second, produceMax: 90 * time.Second}
	fullVariant = variant{name: "full", keys: 10000, load: 4 * time.Minute,
		killMin: 2 * time.Second, killMax: 5 * time.Second,
		recovery: 90 * time.Second, drain: 5 * time.Minute, produceMax: 2 * time.Minute}
)

const (
	instances    = 3
	partitions   = 6
	pipelineName = "chaos"
	redisPause   = 3 * time.Second
	restartAfter = time.Second // a killed instance comes back after about this
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

// TestChaos: three `idemstream run` processes in one group over six
// partitions, a steady stream of keys with volatile-only retries and
// conflicting copies, SIGKILL of a random instance every few seconds,
// Redis frozen once, the broker restarted once; then every outcome is
// checked from the topics. See doc.go.
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
	brokers, script, noRestart := chaosBroker(t, root)
	if script == nil {
		t.Logf("broker restart will be SKIPPED: %s", noRestart)
	} else {
		t.Logf("private broker %v (state in %s), restartable", brokers, script.dir)
	}
	redisSrv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true})

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
	testenv.CreateTopics(t, brokers, partitions, inTopic, outTopic, dlqTopic)
	group := run + "." + pipelineName
	config := filepath.Join(logDir, "idemstream.yaml")
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
    pending_timeout: 8s
`, strings.Join(brokers, ","), run, redisSrv.Addr, run, pipelineName, inTopic, outTopic, dlqTopic, keyHeader)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("topics %s.{in,out,dlq}, group %s, redis %s, logs in %s", run, group, redisSrv.Addr, logDir)

	rng := rand.New(rand.NewPCG(seed, 1))
	work := newWorkload(rng, v, partitions)
	t.Logf("workload: %d keys, %d records planned (%v)", work.keys, len(work.records), work.byKind)

	fl := newFleet(t, bin, config, logDir, instances)
	fl.startAll()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
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
	t.Logf("3 instances ready after %v", time.Since(began).Round(time.Millisecond))

	// The load, the kills and the faults run together. gate serializes a
	// kill with the Redis pause and the broker restart: before each of
	// those the group must be Stable (so that the fault hits a running
	// generation, not a rebalance), and after it the kills are held until
	// the group has committed everything produced before the fault ended.
	var (
		gate      sync.Mutex
		loadDone  = make(chan struct{})
		wg        sync.WaitGroup
		errMu     sync.Mutex
		bgErrors  []string
		events    []string
		restarted bool
		paused    bool
		targeted  int // kills of an instance of a Stable group, mid-batch
		recovered = map[string]time.Duration{}
	)
	loadStart := time.Now()
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
	sleepUntil := func(d time.Duration) bool {
		select {
		case <-loadDone:
			return false
		case <-time.After(time.Until(loadStart.Add(d))):
			return true
		}
	}

	// The producer.
	stats := &producerStats{acked: map[int]bool{}}
	producerErr := make(chan error, 1)
	go func() {
		out := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
		producerErr <- produce(ctx, work, inTopic, out, v.produceMax, stats)
	}()

	// The kills: a random instance every killMin..killMax. Every other kill
	// (at random) first waits for a Stable group and a moment more, so that
	// it lands in the middle of batches; the others land wherever they fall,
	// often in the rebalance the previous kill started.
	killRng := rand.New(rand.NewPCG(seed, 2))
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			pause := v.killMin + time.Duration(killRng.Int64N(int64(v.killMax-v.killMin)+1))
			select {
			case <-loadDone:
				return
			case <-time.After(pause):
			}
			gate.Lock()
			select {
			case <-loadDone:
				gate.Unlock()
				return
			default:
			}
			i := killRng.IntN(instances)
			how := "during a rebalance or wherever it fell"
			if killRng.IntN(2) == 0 && waitSettled(ctx, fl, client, group, 12*time.Second) {
				time.Sleep(time.Duration(killRng.Int64N(int64(1500 * time.Millisecond))))
				how = "of a Stable group"
				errMu.Lock()
				targeted++
				errMu.Unlock()
			}
			fl.kill(i)
			event("SIGKILL instance %d (%s)", i, how)
			time.Sleep(restartAfter/2 + time.Duration(killRng.Int64N(int64(restartAfter)))) // 0.5–1.5 s
			fl.restart(i)
			fl.ensureRunning()
			gate.Unlock()
		}
	}()

	// settle waits, with the kills held, for a running generation.
	settle := func(fault string) {
		if !waitSettled(ctx, fl, client, group, v.recovery) {
			event("%s: the group did not settle within %v; injecting anyway", fault, v.recovery)
		}
	}
	// recoverFrom waits, with the kills held, until the group has
	// committed everything produced before the fault ended.
	recoverFrom := func(fault string) {
		target, err := endOffsets(ctx, client, inTopic, partitions, v.recovery)
		if err != nil {
			fail("after the %s: end offsets: %v", fault, err)
			return
		}
		took, err := waitCommitted(ctx, client, group, inTopic, partitions, target, v.recovery)
		errMu.Lock()
		recovered[fault] = took
		errMu.Unlock()
		if err != nil {
			fail("LIVENESS after the %s (no kill meanwhile): %v", fault, err)
			event("%s: NOT recovered: %v", fault, err)
			return
		}
		event("%s: group caught up in %v", fault, took.Round(time.Millisecond))
	}

	// The Redis pause and the broker restart.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if !sleepUntil(v.load / 5) {
			return
		}
		gate.Lock()
		settle("redis pause")
		event("redis SIGSTOP for %v", redisPause)
		redisSrv.Pause()
		time.Sleep(redisPause)
		redisSrv.Resume()
		errMu.Lock()
		paused = true
		errMu.Unlock()
		event("redis SIGCONT")
		recoverFrom("redis pause")
		gate.Unlock()

		if !sleepUntil(v.load / 2) {
			return
		}
		if script == nil {
			event("broker restart skipped: %s", noRestart)
			return
		}
		gate.Lock()
		defer gate.Unlock()
		settle("broker restart")
		event("broker stop")
		if out, err := script.run(90*time.Second, "stop"); err != nil {
			fail("kafka.sh stop: %v: %s", err, out)
		}
		time.Sleep(2 * time.Second) // the broker stays down a moment
		event("broker start")
		if out, err := script.run(150*time.Second, "start"); err != nil {
			fail("kafka.sh start: %v: %s", err, out)
			return
		}
		errMu.Lock()
		restarted = true
		errMu.Unlock()
		event("broker up")
		recoverFrom("broker restart")
	}()
	// The load ends when the producer is done and the load time is over.
	var perr error
	select {
	case perr = <-producerErr:
	case <-time.After(v.load + v.produceMax + 3*time.Minute):
		perr = fmt.Errorf("the producer did not finish")
	}
	if rest := time.Until(loadStart.Add(v.load)); rest > 0 {
		time.Sleep(rest)
	}
	close(loadDone)
	wg.Wait()
	loadTook := time.Since(loadStart)
	if perr != nil {
		cancel()
		t.Fatalf("producer: %v (acknowledged writes %d, failed %d, last error %s)\n%s", perr, stats.writes, stats.failures, stats.lastErr, fl.tail(20))
	}
	fl.ensureRunning()
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
	if !fl.waitServing(30 * time.Second) {
		t.Errorf("STOP: an instance does not answer /healthz 30s after its start\n%s", fl.tail(20))
	}
	stopProblems := fl.stopAll(30 * time.Second)
	for _, p := range stopProblems {
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

	// Judge from the topics.
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer rcancel()
	reader := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
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
	summary := fmt.Sprintf("CHAOS %s: keys=%d input=%d (dup %d) results=%d first=%d replay=%d conflict=%d invalid=%d failed=%d "+
		"dlq=%d (dup %d) cross-partition-results=%d kills=%d (mid-batch %d) redis-pause=%v broker-restart=%v recovery=%v load=%v drain=%v total=%v problems=%d seed=%d",
		v.name, vd.keys, vd.inputs, vd.inputDups, vd.results, vd.first, vd.replay, vd.conflict, vd.invalid, vd.failed,
		vd.dlqRecords, vd.dlqDups, vd.crossResults, kills, targeted, paused, restartedOr(restarted, noRestart), fmtRecovered(recovered),
		loadTook.Round(time.Second), drainTook.Round(time.Second), time.Since(began).Round(time.Second), len(vd.problems), seed)
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
	"batch dropped without commit", "fenced", "offset commit failed", "committed offset out of range", "level=ERROR", "panic",
}

func restartedOr(done bool, why string) string {
	if done {
		return "true"
	}
	if why != "" {
		return "skipped"
	}
	return "false"
}

func fmtRecovered(m map[string]time.Duration) string {
	var parts []string
	for _, k := range []string{"redis pause", "broker restart"} {
		if d, ok := m[k]; ok {
			parts = append(parts, strings.ReplaceAll(k, " ", "-")+":"+d.Round(100*time.Millisecond).String())
		}
	}
	return "[" + strings.Join(parts, ",") + "]"
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
