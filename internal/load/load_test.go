package load

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

// TestThroughput is make load: passthrough runs that warm the broker up
// (IDEMSTREAM_LOAD_WARMUPS, 6), then rounds (IDEMSTREAM_LOAD_ROUNDS, 3) of `idemstream run` with a passthrough run before the first
// and after each (P I P I P ... P; with the floor runs, on unless
// IDEMSTREAM_LOAD_FLOOR=0, P I P F F P I P F F P ...), one after the other over the same
// backlog, on the same broker and Redis, each timed from its process start
// to lag 0. Each idemstream run has its own group, output topics and
// Redis prefix, and its entries are deleted after it. It prints each round's rate and its ratio to the
// passthrough runs around it, the median of those ratios, the Redis
// server's CPU per decided record with the commands that spent it, and
// the peak RSS of each process; it fails only when a key has not exactly
// one result in a round, a record went to the dead-letter topic, or a run
// does not finish in time.
//
// Rounds, because one ratio says as much about the machine as about the
// code: on these shared two-core machines the passthrough's broker moves
// between about 11 and 24 µs of CPU per record within minutes, and the
// passthrough's rate with it (57,000 to 91,000 records/s over one day),
// while idemstream's moves far less.
//
// IDEMSTREAM_LOAD_PAYLOAD=avro (make load LOAD_PAYLOAD=avro) adds a real
// schema registry and a second backlog of the same records in Avro, and
// after each round's JSON run an idemstream run over it with `payload:
// avro` and the same rules (J A J A ...); it prints each Avro run's rate
// and CPU per record beside the JSON run's, their ratio and its median
// (the goal: at least 0.9), and checks the Avro runs' topics as the JSON
// runs' are checked.
func TestThroughput(t *testing.T) {
	if os.Getenv("IDEMSTREAM_LOAD") == "" {
		t.Skip("a load run: make load (IDEMSTREAM_LOAD=1)")
	}
	profileKind(t)
	set := readLoadSettings(t)
	n, rounds, warmups, prefill, bound := set.records, set.rounds, set.warmups, set.prefill, set.bound
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	if os.Getenv("IDEMSTREAM_LOAD_REDIS_AOF") == "1" {
		redisAddr = testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true}).Addr
	}
	idemBin, passBin := binaries(t)
	floors := set.floors
	run := testenv.UniqueName(t, "load")
	in := run + ".in"
	topics := []string{in, run + ".warm"}
	// With the floors each round has a passthrough run of its own after
	// it, and its floors are bracketed by that one and the next round's
	// first: P I P F F P I P F F P ...
	step := 1
	if floors {
		step = 2
	}
	passes := step*rounds + 1
	for r := range passes {
		topics = append(topics, passTopic(run, r))
	}
	for r := range rounds {
		topics = append(topics, roundName(run, r)+".out", roundName(run, r)+".dlq")
		if floors {
			topics = append(topics, floorName(run, "fp", r), floorName(run, "set", r))
		}
	}
	testenv.CreateTopics(t, brokers, partitions, topics...)
	runs := warmups + passes + rounds
	if floors {
		runs += 2 * rounds
	}
	avro := set.payload == "avro"
	if avro {
		runs += rounds
	}
	ctx, cancel := runContext(t, time.Duration(runs+2)*bound)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	input := offsets{client: client, topic: in}

	seed := uint64(time.Now().UnixNano())
	w := newWorkload(seed, run)
	began := time.Now()
	if err := produce(ctx, brokers, in, w, n); err != nil {
		t.Fatal(err)
	}
	produced := time.Since(began)
	end, err := input.end(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(end); got != int64(n) {
		t.Fatalf("the input holds %d records, want %d", got, n)
	}
	t.Logf("machine: %d CPUs, load average %s", runtime.NumCPU(), loadAverage())
	t.Logf("backlog: %d records on %d partitions (%d keys, %d of them sent twice), produced in %v",
		n, partitions, w.keys, w.retries, produced.Round(time.Millisecond))
	// With LOAD_PAYLOAD=avro the same commands in Avro, and after each
	// round's JSON run a run over them: J A J A ... in one run.
	var av *avroBacklog
	if avro {
		av = produceAvroBacklog(ctx, t, brokers, client, run, seed, n, rounds)
	}

	// Passthrough runs that are not counted first: the broker's CPU per
	// record falls to about a third over the first six or seven runs on a
	// fresh broker (most likely its JIT warming up: 27.6, 19.5, 17.6,
	// 16.5, 13.2, 8.9 µs in six runs, then 6.0 to 8.6), and the
	// passthrough, which is mostly the broker's work, gains more from that
	// than idemstream: with one warm-up run it made 63,000 and 68,000
	// records/s around the first idemstream run and 100,000 and 117,000
	// around the third. A broker in service has long been warm. Each
	// idemstream run is compared with the two passthrough runs around it
	// (the time over both, so a drift between them cancels).
	broker := brokerPID()
	passArgs := strings.Fields(os.Getenv("IDEMSTREAM_LOAD_PASSTHROUGH_ARGS"))
	for i := range warmups {
		group := run + ".warm" + strconv.Itoa(i)
		warm := runPassthrough(ctx, t, passBin, brokers, passArgs, input, end, bound, broker, group, run+".warm")
		t.Logf("warm-up %d (not counted): passthrough %.0f records/s, CPU per record: %s", i+1, float64(n)/warm.time.Seconds(), warm.cpu.perRecord(n, -1))
	}

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	persistence, err := rdb.Info(ctx, "persistence").Result()
	if err != nil {
		t.Fatalf("redis INFO: %v", err)
	}
	if prefill > 0 {
		// Other keys in the store, as a window of a busy pipeline holds:
		// Redis's cost per command grows with its keyspace.
		began := time.Now()
		fillStore(ctx, t, rdb, run+"-fill", prefill)
		t.Logf("store: %d other entries of 500 bytes with an expiry, written in %v", prefill, time.Since(began).Round(time.Millisecond))
		defer dropKeys(context.Background(), t, rdb, run+"-fill")
	}
	passRuns := make([]passRun, passes)
	idemRuns := make([]idemRun, rounds)
	var baselineCPU float64
	var entryBytes int
	floorFP, floorSet := make([]passRun, rounds), make([]passRun, rounds)
	floorSetRedis := make([]float64, rounds)
	passRuns[0] = runPassthrough(ctx, t, passBin, brokers, passArgs, input, end, bound, broker, passTopic(run, 0), passTopic(run, 0))
	for r := range rounds {
		idemRuns[r] = runIdemstream(ctx, t, idemBin, brokers, redisAddr, roundName(run, r), input, end, bound, broker, rdb, "")
		// Every round starts on the store the first had: Redis spent more
		// per record as its keyspace grew (8.4 µs in the first of five
		// rounds that kept their keys, 14.8 in the last, with 1.25 million
		// keys; most likely its hash table doubling and rehashing, since
		// with 2 million entries written beforehand it spent 21.9 µs in the
		// round that took the keyspace past 2^21 and 9 in the next two),
		// which made later rounds no match for earlier ones.
		size := entrySize(ctx, t, rdb, roundName(run, r))
		dropKeys(ctx, t, rdb, roundName(run, r))
		if avro {
			name := avroRoundName(run, r)
			av.runs[r] = runIdemstream(ctx, t, idemBin, brokers, redisAddr, name, av.input, av.end, bound, broker, rdb, av.registry)
			dropKeys(ctx, t, rdb, name)
		}
		if r == rounds-1 {
			// After the round's keys are deleted: with them still there
			// the baseline wrote into a keyspace it took past 2^19, which
			// no round does. (Its n keys still grow the table once more
			// than a round's keys do.)
			baselineCPU, entryBytes = setNXBaseline(ctx, t, rdb, size, run+"-setnx", n), size
		}
		p := step*r + 1
		passRuns[p] = runPassthrough(ctx, t, passBin, brokers, passArgs, input, end, bound, broker, passTopic(run, p), passTopic(run, p))
		if floors {
			fp := floorName(run, "fp", r)
			floorFP[r] = runPassthrough(ctx, t, passBin, brokers, append(floorArgs(), passArgs...), input, end, bound, broker, fp, fp)
			set := floorName(run, "set", r)
			before := redisCPUNow(ctx, t, rdb)
			floorSet[r] = runPassthrough(ctx, t, passBin, brokers,
				append(floorArgs("--redis", redisAddr, "--redis-prefix", set, "--entry-bytes", strconv.Itoa(max(size, 71))), passArgs...),
				input, end, bound, broker, set, set)
			floorSetRedis[r] = redisCPUNow(ctx, t, rdb) - before
			dropKeys(ctx, t, rdb, set)
			passRuns[p+1] = runPassthrough(ctx, t, passBin, brokers, passArgs, input, end, bound, broker, passTopic(run, p+1), passTopic(run, p+1))
		}
	}

	// The Kafka Streams peer, when asked for (LOAD_STREAMS=1): its own
	// output topics, its application.id as the group.
	var streamsTime time.Duration
	var streamsPeak int64
	var streamsCPU cpus
	if os.Getenv("IDEMSTREAM_LOAD_STREAMS") == "1" {
		app := run + ".streams"
		sOut, sDLQ := run+".streams-out", run+".streams-dlq"
		testenv.CreateTopics(t, brokers, partitions, sOut, sDLQ)
		script := filepath.Join(moduleRoot(t), "internal/load/streams/streams.sh")
		// Fetching the jars and compiling are no part of the run.
		// (In the environment the run gets, so that both use one cache.)
		prep := exec.Command(script, "prepare")
		prep.Env = childEnv()
		if out, err := prep.CombinedOutput(); err != nil {
			t.Fatalf("streams.sh prepare: %v\n%s", err, out)
		}
		brokerCPU := cpuSeconds(broker)
		st := startProcess(t, "streams", script,
			strings.Join(brokers, ","), app, in, sOut, sDLQ, strings.Join(volatilePaths, ","), strings.Join(unorderedPaths, ","), keyHeader)
		streamsDone := waitCaughtUp(ctx, t, st, input, app, end, bound, nil)
		streamsTime = streamsDone.Sub(st.started)
		_, streamsPeak = st.memory()
		streamsCPU = cpus{consumer: cpuSeconds(st.cmd.Process.Pid), broker: since(cpuSeconds(broker), brokerCPU)}
		// The JVM exits with 128+SIGTERM once its shutdown hook (which
		// closes the Streams client) has run.
		var exit *exec.ExitError
		if !st.stop(30*time.Second) && !(errors.As(st.err, &exit) && exit.ExitCode() == 143) {
			t.Errorf("the Streams peer did not stop cleanly: %v\n%s", st.err, st.tail(10))
		}
	}

	// The figures.
	rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
	var fastestPass float64
	for i, pr := range passRuns {
		fastestPass = max(fastestPass, rate(pr.time))
		t.Logf("passthrough%s run %d (fetch and write overlapped, batches of 1000, Writer BatchSize 2000, acks=all, commit per batch): %.0f records/s (%v from process start to lag 0), peak RSS %.0f MB; CPU per record: %s",
			strings.Join(append([]string{""}, passArgs...), " "), i, rate(pr.time), pr.time.Round(time.Millisecond), mb(pr.peak), pr.cpu.perRecord(n, -1))
	}
	ratios, cpuRatios := make([]float64, rounds), make([]float64, rounds)
	var floorRatios, floorCPURatios [2][]float64
	var idemRates []float64
	for r, ir := range idemRuns {
		p := step * r
		bracket := 2 * float64(n) / (passRuns[p].time + passRuns[p+1].time).Seconds()
		ratios[r] = rate(ir.time) / bracket
		cpuRatios[r] = cpuRatio(ir.cpu.consumer, passRuns[p], passRuns[p+1])
		idemRates = append(idemRates, rate(ir.time))
		t.Logf("round %d: idemstream run (strict, volatile fields, unordered array, Redis %s): %.0f records/s (%v from process start to lag 0), %.2f of passthrough runs %d and %d around it; CPU per record: %s; consumer CPU %.2f × the passthrough's; peak RSS %.0f MB (%.0f / %.0f / %.0f / %.0f MB at 25/50/75/100%% of the backlog)",
			r+1, redisAddr, rate(ir.time), ir.time.Round(time.Millisecond), ratios[r], p, p+1, ir.cpu.perRecord(n, ir.redisCPU), cpuRatios[r], mb(ir.peak),
			mb(ir.rssAt[0]), mb(ir.rssAt[1]), mb(ir.rssAt[2]), mb(ir.rssAt[3]))
		reportStore(t, ir.metrics, n)
		if !floors {
			continue
		}
		p++
		bracket = 2 * float64(n) / (passRuns[p].time + passRuns[p+1].time).Seconds()
		for i, f := range []struct {
			what  string
			run   passRun
			redis float64
		}{
			{"the passthrough with a fingerprint of each record", floorFP[r], -1},
			{"the passthrough with a fingerprint and a pipelined SET NX of an entry per key, forwarding first copies only", floorSet[r], floorSetRedis[r]},
		} {
			floorRatios[i] = append(floorRatios[i], rate(f.run.time)/bracket)
			floorCPURatios[i] = append(floorCPURatios[i], cpuRatio(f.run.cpu.consumer, passRuns[p], passRuns[p+1]))
			t.Logf("round %d: floor %d, %s: %.0f records/s (%v from process start to lag 0), %.2f of passthrough runs %d and %d around it; CPU per record: %s; consumer CPU %.2f × the passthrough's",
				r+1, i+1, f.what, rate(f.run.time), f.run.time.Round(time.Millisecond), floorRatios[i][r], p, p+1, f.run.cpu.perRecord(n, f.redis), floorCPURatios[i][r])
		}
	}
	t.Logf("ratio idemstream / passthrough: median %.2f over %d rounds, each to the passthrough runs around it (goal >= 0.70); consumer CPU median %.2f × the passthrough's (goal <= 1.8); median idemstream %.0f records/s; %.2f to the fastest passthrough run",
		median(ratios), rounds, median(cpuRatios), median(idemRates), median(idemRates)/fastestPass)
	if floors {
		// The floors promise nothing: no comparison of a replay's
		// fingerprint, no outcome, no completion, and a crash between a
		// batch's SET NX and its write loses it. What the second cannot
		// reach, no design with one entry per key reaches here.
		t.Logf("floors / passthrough: fingerprint only median %.2f, consumer CPU %.2f ×; fingerprint and SET NX median %.2f, consumer CPU %.2f ×",
			median(floorRatios[0]), median(floorCPURatios[0]), median(floorRatios[1]), median(floorCPURatios[1]))
	}
	var redisCPU float64
	redisCommands := map[string]commandStat{}
	for _, ir := range idemRuns {
		redisCPU += ir.redisCPU
		for _, d := range ir.redisCommands {
			c := redisCommands[d.name]
			c.calls, c.usec = c.calls+d.calls, c.usec+d.usec
			redisCommands[d.name] = c
		}
	}
	reportRedis(t, persistence, fsyncPolicy(ctx, rdb), redisCPU, diffCommands(nil, redisCommands), rounds*n)
	if baselineCPU > 0 {
		per := redisCPU * 1e6 / float64(rounds*n)
		base := baselineCPU * 1e6 / float64(n)
		t.Logf("redis baseline: a pipelined SET NX PX of a %d-byte entry per record (batches of 1000, the same server, after the last round): %.1f µs per record; idemstream / SET NX: %.2f (goal <= 1.3)",
			entryBytes, base, per/base)
	}
	if streamsTime > 0 {
		streamsRate := rate(streamsTime)
		t.Logf("Kafka Streams peer (processor with a RocksDB store, exactly_once_v2, 2 stream threads, commit every 1s, the same canonical rules; internal/load/streams): %.0f records/s (%v from process start to lag 0, JVM start and group join included), peak RSS %.0f MB",
			streamsRate, streamsTime.Round(time.Millisecond), mb(streamsPeak))
		t.Logf("CPU per record, Streams run: %s", streamsCPU.perRecord(n, -1))
		t.Logf("ratio idemstream / Kafka Streams: %.2f (goal >= 2), idemstream's median rate", median(idemRates)/streamsRate)
	}
	if avro {
		av.report(t, n, idemRuns, passRuns, step, redisAddr)
	}

	t.Logf("machine: load average %s", loadAverage())

	// One result per key in every round, from the output topics themselves.
	for r, ir := range idemRuns {
		name := roundName(run, r)
		t.Logf("round %d:", r+1)
		verifyResults(ctx, t, brokers, client, name+".out", name+".dlq", w, sumBy(ir.metrics, "idemstream_records_total", "outcome"))
	}
	if avro {
		av.verify(ctx, t, brokers, client, run)
	}
	for r := range passRuns {
		passEnd, err := offsets{client: client, topic: passTopic(run, r)}.end(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := sum(passEnd); got < int64(n) {
			t.Errorf("passthrough wrote %d records of %d to %s", got, n, passTopic(run, r))
		}
	}
	for r := range rounds {
		if !floors {
			break
		}
		// The first floor forwards every record, the second a key's first
		// copy only (a run that nobody restarted writes each once).
		fpEnd, err := offsets{client: client, topic: floorName(run, "fp", r)}.end(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := sum(fpEnd); got < int64(n) {
			t.Errorf("floor 1 of round %d wrote %d records of %d", r+1, got, n)
		}
		setEnd, err := offsets{client: client, topic: floorName(run, "set", r)}.end(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := sum(setEnd); got != int64(w.keys) {
			t.Errorf("floor 2 of round %d wrote %d records, want one for each of the %d keys", r+1, got, w.keys)
		}
	}
}

// runContext bounds a whole run by d, and ends it a minute before go
// test's -timeout would, so that a run too slow fails with its own error
// and the processes' logs instead of go test's panic.
func runContext(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(d)
	if td, ok := t.Deadline(); ok && td.Add(-time.Minute).Before(deadline) {
		deadline = td.Add(-time.Minute)
	}
	return context.WithDeadline(context.Background(), deadline)
}

// roundName names what the idemstream run of round r owns: its group, its
// Redis prefix and, with .out and .dlq, its topics.
func roundName(run string, r int) string { return run + "-r" + strconv.Itoa(r+1) }

// passTopic is the output, and the group, of passthrough run r.
func passTopic(run string, r int) string { return run + ".pass" + strconv.Itoa(r) }

// idemRun is one run of `idemstream run` over the backlog.
type idemRun struct {
	time          time.Duration // from process start to lag 0
	peak          int64         // peak RSS
	rssAt         [4]int64      // RSS at each quarter of the backlog
	cpu           cpus
	redisCPU      float64 // the Redis server's CPU seconds over the run
	machineCPU    float64 // the whole machine's busy CPU seconds over the run (-1: not known)
	redisCommands []commandDelta
	metrics       []series
}

// runIdemstream runs `idemstream run` over input until lag 0, on JSON
// payloads, or on Avro ones through registry when it is not "".
func runIdemstream(ctx context.Context, t *testing.T, bin string, brokers []string, redisAddr, name string, input offsets, end map[int]int64, bound time.Duration, broker int, rdb *redis.Client, registry string) idemRun {
	t.Helper()
	var r idemRun
	before, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		t.Fatalf("redis INFO: %v", err)
	}
	metricsAddr := testenv.FreeAddr(t)
	config := filepath.Join(t.TempDir(), "idemstream.yaml")
	writeConfig(t, config, brokers, redisAddr, name, input.topic, name+".out", name+".dlq", registry)
	brokerCPU, machine := cpuSeconds(broker), machineCPU()
	idem := startProcess(t, "idemstream", bin, "run", "--config", config, "--metrics-addr", metricsAddr, "--log-format", "text")
	prof := startProfiler(ctx, metricsAddr, profileDir(), profileKind(t), name)
	done := waitCaughtUp(ctx, t, idem, input, name+".load", end, bound, &r.rssAt)
	r.time = done.Sub(idem.started)
	r.cpu = cpus{consumer: cpuSeconds(idem.cmd.Process.Pid), broker: since(cpuSeconds(broker), brokerCPU)}
	r.machineCPU = since(machineCPU(), machine)
	prof.stop(t)
	after, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		t.Fatalf("redis INFO: %v", err)
	}
	fb, cb := parseInfo(before)
	fa, ca := parseInfo(after)
	r.redisCPU = serverCPU(fa) - serverCPU(fb)
	r.redisCommands = diffCommands(cb, ca)
	_, r.peak = idem.memory()
	if r.metrics, err = scrape(metricsAddr); err != nil {
		t.Errorf("scrape %s/metrics: %v", metricsAddr, err)
	}
	if !idem.stop(15 * time.Second) {
		t.Errorf("idemstream did not stop cleanly: %v\n%s", idem.err, idem.tail(10))
	}
	return r
}

// dropKeys deletes the entries under a run's prefix (no FLUSHDB: the
// server may be one the caller shares).
func dropKeys(ctx context.Context, t *testing.T, rdb *redis.Client, prefix string) {
	t.Helper()
	iter := rdb.Scan(ctx, 0, prefix+":*", 5000).Iterator()
	var batch []string
	flush := func() {
		if len(batch) > 0 {
			if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
				t.Fatalf("redis UNLINK: %v", err)
			}
			batch = batch[:0]
		}
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 5000 {
			flush()
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("redis SCAN: %v", err)
	}
	flush()
}

// entrySize is the size of one of the entries under prefix, 0 when there
// is none.
func entrySize(ctx context.Context, t *testing.T, rdb *redis.Client, prefix string) int {
	t.Helper()
	keys, _, err := rdb.Scan(ctx, 0, prefix+":*", 100).Result()
	if err != nil || len(keys) == 0 {
		t.Logf("redis: no entry of %s to size one by (%v)", prefix, err)
		return 0
	}
	sample, err := rdb.Get(ctx, keys[0]).Result()
	if err != nil {
		t.Fatalf("redis GET: %v", err)
	}
	return len(sample)
}

// setNXBaseline writes n entries of size bytes with a pipelined SET NX PX
// each, as the cheapest decision a store could make, and returns the Redis
// server's CPU seconds for them (0 when size is); it removes them again.
func setNXBaseline(ctx context.Context, t *testing.T, rdb *redis.Client, size int, prefix string, n int) float64 {
	t.Helper()
	if size == 0 {
		return 0
	}
	value := strings.Repeat("x", size)
	before := redisCPUNow(ctx, t, rdb)
	for start := 0; start < n; start += 1000 {
		pipe := rdb.Pipeline()
		for i := start; i < min(start+1000, n); i++ {
			pipe.SetNX(ctx, prefix+":{k"+strconv.Itoa(i)+"}", value, 10*time.Minute)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("redis: SET NX baseline: %v", err)
		}
	}
	spent := redisCPUNow(ctx, t, rdb) - before
	dropKeys(ctx, t, rdb, prefix)
	return spent
}

// redisCPUNow is the Redis server's CPU seconds so far.
func redisCPUNow(ctx context.Context, t *testing.T, rdb *redis.Client) float64 {
	t.Helper()
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		t.Fatalf("redis INFO: %v", err)
	}
	fields, _ := parseInfo(info)
	return serverCPU(fields)
}

// cpuRatio is consumer CPU seconds against the mean of the passthrough
// runs a and b, NaN when one of them is unknown.
func cpuRatio(consumer float64, a, b passRun) float64 {
	if consumer < 0 || a.cpu.consumer < 0 || b.cpu.consumer < 0 {
		return math.NaN()
	}
	return consumer / ((a.cpu.consumer + b.cpu.consumer) / 2)
}

// floorName is the output, the group and the Redis prefix of a floor run.
func floorName(run, kind string, r int) string {
	return run + ".floor-" + kind + strconv.Itoa(r)
}

// floorArgs are the passthrough's flags for a floor run: idemstream's
// canonical rules, and extra.
func floorArgs(extra ...string) []string {
	return append([]string{"--volatile", strings.Join(volatilePaths, ","), "--unordered", strings.Join(unorderedPaths, ","), "--key-header", keyHeader}, extra...)
}

// fillStore writes n entries of 500 bytes, each with an hour's expiry,
// under prefix.
func fillStore(ctx context.Context, t *testing.T, rdb *redis.Client, prefix string, n int) {
	t.Helper()
	value := strings.Repeat("x", 500)
	for start := 0; start < n; start += 1000 {
		pipe := rdb.Pipeline()
		for i := start; i < min(start+1000, n); i++ {
			pipe.Set(ctx, prefix+":{fill:"+strconv.Itoa(i)+"}", value, time.Hour)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("redis: filling the store: %v", err)
		}
	}
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// passRun is one run of the passthrough over the backlog.
type passRun struct {
	time time.Duration // from process start to lag 0
	peak int64         // peak RSS
	cpu  cpus
}

func runPassthrough(ctx context.Context, t *testing.T, bin string, brokers, extra []string, input offsets, end map[int]int64, bound time.Duration, broker int, group, out string) passRun {
	t.Helper()
	args := append([]string{"--brokers", strings.Join(brokers, ","), "--input", input.topic, "--output", out, "--group", group}, extra...)
	brokerCPU := cpuSeconds(broker)
	pass := startProcess(t, "passthrough", bin, args...)
	done := waitCaughtUp(ctx, t, pass, input, group, end, bound, nil)
	var r passRun
	r.time = done.Sub(pass.started)
	_, r.peak = pass.memory()
	r.cpu = cpus{consumer: cpuSeconds(pass.cmd.Process.Pid), broker: since(cpuSeconds(broker), brokerCPU)}
	if !pass.stop(15 * time.Second) {
		t.Errorf("passthrough did not stop cleanly: %v\n%s", pass.err, pass.tail(10))
	}
	return r
}

// fsyncPolicy is the server's appendfsync setting, or "?".
func fsyncPolicy(ctx context.Context, rdb *redis.Client) string {
	v, err := rdb.ConfigGet(ctx, "appendfsync").Result()
	if err != nil || v["appendfsync"] == "" {
		return "?"
	}
	return v["appendfsync"]
}

// since is now - before for CPU readings, -1 when either is unknown.
func since(now, before float64) float64 {
	if now < 0 || before < 0 {
		return -1
	}
	return now - before
}

func sum(m map[int]int64) int64 {
	var s int64
	for _, v := range m {
		s += v
	}
	return s
}

// writeConfig writes the run's configuration. The servers of the test
// suite keep Redis without persistence, which `run` refuses by default:
// the load runs measure speed (LOAD_REDIS_AOF=1 measures it with
// appendfsync always), so the check is off. With a registry (its
// Confluent API's URL) the payloads are Avro, read through it, with the
// reader schema under the input's subject (<input>-value, the default).
func writeConfig(t *testing.T, path string, brokers []string, redisAddr, run, in, out, dlq, registry string) {
	t.Helper()
	yaml := fmt.Sprintf(`kafka: {brokers: [%s], group: %s}
store: {kind: redis, redis: {url: 'redis://%s/0', prefix: %s, check_server: false%s}}
pipelines:
  - name: load
    input: %s
    output: %s
    dlq: %s
    key: {from: header, name: %s, format: uuid}
    semantics: strict
    window: 10m
    volatile: [%s]
    unordered: [%s]
`, strings.Join(brokers, ","), run, redisAddr, run, entryFormat(), in, out, dlq, keyHeader,
		strings.Join(volatilePaths, ", "), strings.Join(unorderedPaths, ", "))
	if registry != "" {
		yaml += "    payload: avro\nschema_registry: {url: '" + registry + "'}\n"
	}
	yaml += metricsConfig()
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
}

// entryFormat is the store.redis setting of IDEMSTREAM_LOAD_ENTRY_FORMAT
// (make load LOAD_ENTRY_FORMAT=compact): the format the measured
// processes write their entries in.
func entryFormat() string {
	if f := os.Getenv("IDEMSTREAM_LOAD_ENTRY_FORMAT"); f != "" {
		return ", entry_format: " + f
	}
	return ""
}

// cpus is the CPU time, in seconds, that the consumer process used from
// its start to lag 0, and the broker in the same span (-1: not known).
type cpus struct{ consumer, broker float64 }

func (c cpus) perRecord(records int, redis float64) string {
	us := func(s float64) string {
		if s < 0 {
			return "?"
		}
		return fmt.Sprintf("%.1f µs", s*1e6/float64(records))
	}
	out := "consumer " + us(c.consumer) + ", broker " + us(c.broker)
	if redis >= 0 {
		out += ", redis-server " + us(redis)
	}
	return out
}

// reportStore prints what idemstream's own metrics say about its batches
// and store calls.
func reportStore(t *testing.T, metrics []series, records int) {
	t.Helper()
	batches := sumBy(metrics, "idemstream_decision_duration_seconds_count", "pipeline")["load"]
	batchSecs := sumBy(metrics, "idemstream_decision_duration_seconds_sum", "pipeline")["load"]
	if batches > 0 {
		t.Logf("idemstream batches: %.0f (%.0f records each), mean fetch to commit-ready %.1f ms, p99 <= %s",
			batches, float64(records)/batches, batchSecs*1e3/batches, bucketQuantile(metrics, "idemstream_decision_duration_seconds", "pipeline", "load", 0.99))
	}
	counts := sumBy(metrics, "idemstream_store_duration_seconds_count", "op")
	secs := sumBy(metrics, "idemstream_store_duration_seconds_sum", "op")
	var ops []string
	for op := range counts {
		ops = append(ops, op)
	}
	slices.Sort(ops)
	var parts []string
	for _, op := range ops {
		if counts[op] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f calls, mean %.1f ms, p99 <= %s", op, counts[op], secs[op]*1e3/counts[op],
				bucketQuantile(metrics, "idemstream_store_duration_seconds", "op", op, 0.99)))
		}
	}
	t.Logf("idemstream store calls: %s", strings.Join(parts, "; "))
}

// reportRedis prints the server CPU per decided record and the commands
// that spent it, from the server's INFO persistence and the CPU and
// commands of the idemstream runs.
func reportRedis(t *testing.T, persistenceInfo, fsync string, cpu float64, deltas []commandDelta, records int) {
	t.Helper()
	fields, _ := parseInfo(persistenceInfo)
	persistence := "no persistence"
	if fields["aof_enabled"] == "1" {
		persistence = "appendonly yes, appendfsync " + fsync
	}
	t.Logf("redis (%s): server CPU %.2f s (used_cpu_sys+used_cpu_user) = %.1f µs per decided record over the idemstream runs (goal <= 3)",
		persistence, cpu, cpu*1e6/float64(records))
	// usec is the time inside each command as the server clocks it (wall
	// time: on a busy machine it can exceed the CPU above), and a command
	// that a script calls counts under its own name as well as under
	// EVALSHA: the lines do not add up, they rank.
	for i, d := range deltas {
		if i == 6 {
			break
		}
		t.Logf("redis   %-10s calls %8d  usec %10d  %8.1f µs/call  %6.2f µs/record",
			strings.ToUpper(d.name), d.calls, d.usec, float64(d.usec)/float64(d.calls), float64(d.usec)/float64(records))
	}
}

// verifyResults reads the output and the dead-letter topic: every key of
// the workload must have exactly one result, no record a dead letter, and
// the outcome counters must add up to the records sent.
func verifyResults(ctx context.Context, t *testing.T, brokers []string, client *kafka.Client, out, dlq string, w *workload, outcomes map[string]float64) {
	t.Helper()
	outEnd, err := offsets{client: client, topic: out}.end(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	perKey := make(map[string]int, w.keys)
	if err := readAll(ctx, brokers, out, outEnd, func(m kafka.Message) {
		k := header(m.Headers, "idemstream-key")
		mu.Lock()
		perKey[k]++
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	var dups, missing int
	var example string
	for k := range w.keys {
		switch c := perKey[w.key(k)]; {
		case c == 0:
			missing++
			example = w.key(k)
		case c > 1:
			dups++
			example = w.key(k)
		}
	}
	dlqEnd, err := offsets{client: client, topic: dlq}.end(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("results: %d records for %d keys: %d keys without a result, %d with more than one; %d dead letters; outcomes %v",
		sum(outEnd), w.keys, missing, dups, sum(dlqEnd), outcomes)
	if missing > 0 || dups > 0 || sum(outEnd) != int64(w.keys) {
		t.Errorf("not exactly one result per key (e.g. %s)", example)
	}
	if sum(dlqEnd) != 0 {
		t.Errorf("%d dead letters, want none", sum(dlqEnd))
	}
	if outcomes != nil && (outcomes["first"] != float64(w.keys) || outcomes["replay"] != float64(w.retries)) {
		t.Errorf("outcomes %v, want first=%d replay=%d", outcomes, w.keys, w.retries)
	}
}
