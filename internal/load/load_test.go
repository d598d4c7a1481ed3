package load

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

// TestThroughput is make load: a passthrough run that warms the broker up,
// then the passthrough, `idemstream run` and the passthrough again, one
// after the other over the same backlog, on the same broker and Redis,
// each timed from its process start to lag 0. It prints the rates and
// idemstream's ratio to the passthrough runs around it, the Redis
// server's CPU per decided record with the commands that spent it, and the peak RSS of each process; it fails only when a
// key has not exactly one result, a record went to the dead-letter topic,
// or a run does not finish in time.
func TestThroughput(t *testing.T) {
	if os.Getenv("IDEMSTREAM_LOAD") == "" {
		t.Skip("a load run: make load (IDEMSTREAM_LOAD=1)")
	}
	n := envInt(t, "IDEMSTREAM_LOAD_RECORDS", 325000)
	bound := envDuration(t, "IDEMSTREAM_LOAD_BOUND", 10*time.Minute)
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	if os.Getenv("IDEMSTREAM_LOAD_REDIS_AOF") == "1" {
		redisAddr = testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true}).Addr
	}
	idemBin, passBin := binaries(t)
	run := testenv.UniqueName(t, "load")
	in, out, dlq := run+".in", run+".out", run+".dlq"
	warmOut, passOut, pass2Out := run+".warm", run+".pass", run+".pass2"
	testenv.CreateTopics(t, brokers, partitions, in, warmOut, passOut, pass2Out, out, dlq)
	ctx, cancel := context.WithTimeout(context.Background(), 3*bound)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	input := offsets{client: client, topic: in}

	w := newWorkload(uint64(time.Now().UnixNano()), run)
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

	// The passthrough, before idemstream and again after it, after a run
	// that is not counted: the broker's CPU per record falls over the
	// first runs on a fresh broker (most likely its JIT warming up: 32,
	// 23, 19 µs in three runs in a row), so a passthrough run before
	// idemstream alone flatters the ratio and one after it alone flatters
	// the passthrough. idemstream is compared with the two runs around it
	// (the time over both, so a drift between them cancels) and with the
	// faster one.
	broker := brokerPID()
	passArgs := strings.Fields(os.Getenv("IDEMSTREAM_LOAD_PASSTHROUGH_ARGS"))
	warm := runPassthrough(ctx, t, passBin, brokers, passArgs, input, end, bound, broker, warmOut, warmOut)
	t.Logf("warm-up (not counted): passthrough %.0f records/s, CPU per record: %s", float64(n)/warm.time.Seconds(), warm.cpu.perRecord(n, -1))
	var passRuns [2]passRun
	passRuns[0] = runPassthrough(ctx, t, passBin, brokers, passArgs, input, end, bound, broker, run+".pass", passOut)

	// idemstream.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	infoBefore, err := rdb.Info(ctx, "cpu", "commandstats", "persistence").Result()
	if err != nil {
		t.Fatalf("redis INFO: %v", err)
	}
	metricsAddr := testenv.FreeAddr(t)
	config := filepath.Join(t.TempDir(), "idemstream.yaml")
	writeConfig(t, config, brokers, redisAddr, run, in, out, dlq)
	brokerCPU := cpuSeconds(broker)
	idem := startProcess(t, "idemstream", idemBin, "run", "--config", config, "--metrics-addr", metricsAddr, "--log-format", "text")
	var rssAt [4]int64
	idemDone := waitCaughtUp(ctx, t, idem, input, run+".load", end, bound, &rssAt)
	idemTime := idemDone.Sub(idem.started)
	idemCPU := cpus{consumer: cpuSeconds(idem.cmd.Process.Pid), broker: since(cpuSeconds(broker), brokerCPU)}
	infoAfter, err := rdb.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		t.Fatalf("redis INFO: %v", err)
	}
	_, idemPeak := idem.memory()
	metrics, err := scrape(metricsAddr)
	if err != nil {
		t.Errorf("scrape %s/metrics: %v", metricsAddr, err)
	}
	outcomes := sumBy(metrics, "idemstream_records_total", "outcome")
	if !idem.stop(15 * time.Second) {
		t.Errorf("idemstream did not stop cleanly: %v\n%s", idem.err, idem.tail(10))
	}

	passRuns[1] = runPassthrough(ctx, t, passBin, brokers, passArgs, input, end, bound, broker, pass2Out, pass2Out)

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
		brokerCPU = cpuSeconds(broker)
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
	idemRate := float64(n) / idemTime.Seconds()
	var passRate float64
	for i, pr := range passRuns {
		rate := float64(n) / pr.time.Seconds()
		passRate = max(passRate, rate)
		t.Logf("passthrough%s, %s idemstream (fetch and write overlapped, batches of 1000, Writer BatchSize 2000, acks=all, commit per batch): %.0f records/s (%v from process start to lag 0), peak RSS %.0f MB; CPU per record: %s",
			strings.Join(append([]string{""}, passArgs...), " "), [2]string{"before", "after"}[i], rate, pr.time.Round(time.Millisecond), mb(pr.peak), pr.cpu.perRecord(n, -1))
	}
	t.Logf("idemstream run (strict, volatile fields, unordered array, Redis %s): %.0f records/s (%v from process start to lag 0), peak RSS %.0f MB",
		redisAddr, idemRate, idemTime.Round(time.Millisecond), mb(idemPeak))
	t.Logf("idemstream RSS at 25/50/75/100%% of the backlog: %.0f / %.0f / %.0f / %.0f MB",
		mb(rssAt[0]), mb(rssAt[1]), mb(rssAt[2]), mb(rssAt[3]))
	bracket := 2 * float64(n) / (passRuns[0].time + passRuns[1].time).Seconds()
	t.Logf("ratio idemstream / passthrough: %.2f to the passthrough runs before and after it (goal >= 0.70); %.2f to the faster of them",
		idemRate/bracket, idemRate/passRate)
	redisCPU := reportRedis(t, infoBefore, infoAfter, fsyncPolicy(ctx, rdb), n)
	t.Logf("CPU per record, idemstream run: %s", idemCPU.perRecord(n, redisCPU))
	reportStore(t, metrics, n)
	if streamsTime > 0 {
		streamsRate := float64(n) / streamsTime.Seconds()
		t.Logf("Kafka Streams peer (processor with a RocksDB store, exactly_once_v2, 2 stream threads, commit every 1s, the same canonical rules; internal/load/streams): %.0f records/s (%v from process start to lag 0, JVM start and group join included), peak RSS %.0f MB",
			streamsRate, streamsTime.Round(time.Millisecond), mb(streamsPeak))
		t.Logf("CPU per record, Streams run: %s", streamsCPU.perRecord(n, -1))
		t.Logf("ratio idemstream / Kafka Streams: %.2f (goal >= 2)", idemRate/streamsRate)
	}

	t.Logf("machine: load average %s", loadAverage())

	// One result per key, from the output topic itself.
	verifyResults(ctx, t, brokers, client, out, dlq, w, outcomes)
	for _, topic := range []string{passOut, pass2Out} {
		passEnd, err := offsets{client: client, topic: topic}.end(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := sum(passEnd); got < int64(n) {
			t.Errorf("passthrough wrote %d records of %d to %s", got, n, topic)
		}
	}
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
// appendfsync always), so the check is off.
func writeConfig(t *testing.T, path string, brokers []string, redisAddr, run, in, out, dlq string) {
	t.Helper()
	yaml := fmt.Sprintf(`kafka: {brokers: [%s], group: %s}
store: {kind: redis, redis: {url: 'redis://%s/0', prefix: %s, check_server: false}}
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
`, strings.Join(brokers, ","), run, redisAddr, run, in, out, dlq, keyHeader,
		strings.Join(volatilePaths, ", "), strings.Join(unorderedPaths, ", "))
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
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
// that spent it, and returns that CPU in seconds.
func reportRedis(t *testing.T, before, after, fsync string, records int) float64 {
	t.Helper()
	fb, cb := parseInfo(before)
	fa, ca := parseInfo(after)
	cpu := serverCPU(fa) - serverCPU(fb)
	persistence := "no persistence"
	if fb["aof_enabled"] == "1" {
		persistence = "appendonly yes, appendfsync " + fsync
	}
	deltas := diffCommands(cb, ca)
	t.Logf("redis (%s): server CPU %.2f s (used_cpu_sys+used_cpu_user) = %.1f µs per decided record (goal <= 3)",
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
	return cpu
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
