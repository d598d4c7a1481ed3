package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
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

// instance is one `idemstream run` in this process, as an operator starts
// it: a config file, flags, its own metrics port.
type instance struct {
	t       *testing.T
	addr    string
	cancel  context.CancelFunc
	done    chan int
	stderr  *syncBuffer
	stopped bool
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pipelineTopics names a test's run (its group and store prefix) and
// creates the run's input, output and dead-letter topics.
func pipelineTopics(t *testing.T, brokers []string, name string, partitions int) (run, in, out, dlq string) {
	t.Helper()
	run = testenv.UniqueName(t, name)
	in, out, dlq = run+".in", run+".out", run+".dlq"
	testenv.CreateTopics(t, brokers, partitions, in, out, dlq)
	return run, in, out, dlq
}

// writeRunConfig writes a config with one pipeline (a YAML flow mapping)
// on the test's broker and Redis, the group and Redis prefix named run,
// and returns its path. The test servers keep Redis without persistence,
// which run refuses by default, so the server check is off.
func writeRunConfig(t *testing.T, brokers []string, redisAddr, run, pipeline string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "c.yaml")
	yaml := fmt.Sprintf("kafka: {brokers: [%s], group: %s}\nstore: {redis: {url: 'redis://%s/0', prefix: %s, check_server: false}}\npipelines:\n  - %s\n",
		strings.Join(brokers, ","), run, redisAddr, run, pipeline)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}

func startInstance(t *testing.T, config string, env map[string]string, flags ...string) *instance {
	t.Helper()
	return startInstanceWith(t, config, env, append([]string{"--settle-wait", "200ms"}, flags...)...)
}

// startInstanceWith is startInstance with the default settle wait, unless
// flags set another.
func startInstanceWith(t *testing.T, config string, env map[string]string, flags ...string) *instance {
	t.Helper()
	in := &instance{t: t, addr: testenv.FreeAddr(t), done: make(chan int, 1), stderr: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	args := append([]string{"run", "--config", config, "--metrics-addr", in.addr, "--log-format", "text"}, flags...)
	go func() {
		in.done <- run(ctx, args, strings.NewReader(""), io.Discard, in.stderr, func(k string) string { return env[k] })
	}()
	t.Cleanup(in.stop)
	return in
}

func (in *instance) stop() {
	if in.stopped {
		return
	}
	in.stopped = true
	in.cancel()
	select {
	case code := <-in.done:
		if code != 0 {
			in.t.Errorf("run exited %d:\n%s", code, in.stderr.String())
		}
	case <-time.After(30 * time.Second):
		in.t.Errorf("run did not stop within 30s of SIGTERM")
	}
}

func (in *instance) get(path string) (int, string) {
	resp, err := http.Get("http://" + in.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of one series on /metrics, -1 when absent.
func (in *instance) metric(name string, labels ...string) float64 {
	_, body := in.get("/metrics")
	return metricIn(body, name, labels...)
}

func metricIn(body, name string, labels ...string) float64 {
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			if !strings.Contains(line, labels[i]+`="`+labels[i+1]+`"`) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type produced struct {
	topic     string
	partition int
	key       []byte
	headers   map[string]string
	body      string
}

func produce(t *testing.T, io *sinks.Kafka, recs ...produced) {
	t.Helper()
	msgs := make([]sinks.Message, len(recs))
	for i, r := range recs {
		var hs []dedupe.Header
		for k, v := range r.headers {
			hs = append(hs, dedupe.Header{Key: k, Value: []byte(v)})
		}
		msgs[i] = sinks.Message{Topic: r.topic, Partition: r.partition, Key: r.key, Value: []byte(r.body), Headers: hs}
	}
	if _, err := io.Write(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
}

func readTopic(t *testing.T, io *sinks.Kafka, topic string) []sinks.Fetched {
	t.Helper()
	n, err := io.Partitions(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []sinks.Fetched
	for p := range n {
		recs, err := io.Read(context.Background(), topic, p, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, recs...)
	}
	return out
}

func hv(f sinks.Fetched, k string) string { v, _ := sinks.HeaderValue(f.Headers, k); return v }

func uuidN(n int) string { return fmt.Sprintf("9f8a2c1d-3e4f-4a5b-8c6d-%012d", n) }

func key(k string) map[string]string { return map[string]string{"Idempotency-Key": k} }

// TestRunEveryOutcomeFourPipelines is the documented outcome table on a real broker
// and a real Redis: one instance, four pipelines (strict with a payload
// schema, lenient with replies, window of 2 s, key from a JSON field).
func TestRunEveryOutcomeFourPipelines(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	run := testenv.UniqueName(t, "e2e")
	topic := func(p, kind string) string { return run + "." + p + "." + kind }
	var topics []string
	for _, p := range []string{"strict", "lenient", "window", "field"} {
		topics = append(topics, topic(p, "in"), topic(p, "out"), topic(p, "dlq"))
	}
	topics = append(topics, topic("lenient", "replies"))
	testenv.CreateTopics(t, brokers, 2, topics...)

	dir := t.TempDir()
	schema := `{"type":"object","required":["coupon_id"],"properties":{"coupon_id":{"type":"integer"},"amount":{"type":"number"}}}`
	if err := os.WriteFile(filepath.Join(dir, "claim.schema.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "idemstream.yaml")
	yaml := fmt.Sprintf(`kafka: {brokers: [%s], group: %s}
store: {kind: redis, redis: {url: 'redis://%s/0', prefix: %s, check_server: false}}
pipelines:
  - {name: strict, input: %s, output: %s, dlq: %s, semantics: strict, volatile: [/client_time], schema: claim.schema.json, max_payload_bytes: 512}
  - {name: lenient, input: %s, output: %s, dlq: %s, replies: %s, semantics: lenient, key: {format: any}}
  - {name: window, input: %s, output: %s, dlq: %s, semantics: window, window: 2s, client_max_retry_interval: 1s, key: {format: any}}
  - {name: field, input: %s, output: %s, dlq: %s, key: {from: field, name: /request_id, format: 'regex:REQ-[0-9]+'}}
`, strings.Join(brokers, ","), run, redisAddr, run,
		topic("strict", "in"), topic("strict", "out"), topic("strict", "dlq"),
		topic("lenient", "in"), topic("lenient", "out"), topic("lenient", "dlq"), topic("lenient", "replies"),
		topic("window", "in"), topic("window", "out"), topic("window", "dlq"),
		topic("field", "in"), topic("field", "out"), topic("field", "dlq"))
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	a, b := uuidN(1), uuidN(2)
	in := func(p string) string { return topic(p, "in") }
	produce(t, io,
		produced{in("strict"), 0, nil, key(a), `{"coupon_id":1,"amount":50,"client_time":"10:00:00"}`},
		produced{in("strict"), 0, nil, key(strings.ToUpper(a)), `{"amount":5e1,"client_time":"10:00:03","coupon_id":1}`},
		produced{in("strict"), 0, nil, key(a), `{"coupon_id":1,"amount":100}`},
		produced{in("strict"), 1, nil, nil, `{"coupon_id":2}`},
		produced{in("strict"), 1, nil, key("not-a-uuid"), `{"coupon_id":3}`},
		produced{in("strict"), 1, nil, key(b), `{"coupon_id":`},
		produced{in("strict"), 1, nil, key(uuidN(3)), `{"coupon_id":4,"pad":"` + strings.Repeat("x", 600) + `"}`},
		produced{in("strict"), 1, nil, key(uuidN(4)), `{"coupon_id":"five"}`},
		produced{in("lenient"), 0, []byte("user-7"), key("L1"), `{"qty":1}`},
		produced{in("lenient"), 0, nil, key("L1"), `{"qty":2}`},
		produced{in("window"), 0, nil, key("W1"), `{"n":1}`},
		produced{in("window"), 0, nil, key("W1"), `{"n":2}`},
		produced{in("field"), 0, nil, nil, `{"request_id":"REQ-1","x":1}`},
		produced{in("field"), 1, nil, nil, `{"x":1,"request_id":"REQ-1"}`},
		produced{in("field"), 1, nil, nil, `{"request_id":"req-2"}`},
	)
	inst := startInstance(t, config, nil)
	total := func(p string) float64 {
		s := 0.0
		for _, o := range dedupe.Outcomes {
			if v := inst.metric("idemstream_records_total", "pipeline", p, "outcome", string(o)); v > 0 {
				s += v
			}
		}
		return s
	}
	waitUntil(t, 60*time.Second, "the first 15 records decided", func() bool {
		return total("strict") == 8 && total("lenient") == 2 && total("window") == 2 && total("field") == 3
	})
	// The window pipeline's key is new again once its 2 s window is over.
	waitUntil(t, 10*time.Second, "the 2s window to pass", func() bool {
		_, body := inst.get("/metrics")
		return metricIn(body, "idemstream_records_total", "pipeline", "window", "outcome", "first") == 1
	})
	time.Sleep(2100 * time.Millisecond) // the window is on the store's clock: let it run out
	produce(t, io, produced{in("window"), 0, nil, key("W1"), `{"n":3}`})
	waitUntil(t, 30*time.Second, "the key decided first again", func() bool { return total("window") == 3 })

	want := map[string]map[string]float64{
		"strict":  {"first": 1, "replay": 1, "conflict": 1, "invalid": 5, "failed": 0},
		"lenient": {"first": 1, "replay": 1, "conflict": 0, "invalid": 0, "failed": 0},
		"window":  {"first": 2, "replay": 1, "conflict": 0, "invalid": 0, "failed": 0},
		"field":   {"first": 1, "replay": 1, "conflict": 0, "invalid": 1, "failed": 0},
	}
	_, body := inst.get("/metrics")
	for p, outcomes := range want {
		for o, n := range outcomes {
			if got := metricIn(body, "idemstream_records_total", "pipeline", p, "outcome", o); got != n {
				t.Errorf("records_total{pipeline=%s,outcome=%s} = %v, want %v", p, o, got, n)
			}
		}
	}
	if got := metricIn(body, "idemstream_lenient_mismatch_total", "pipeline", "lenient"); got != 1 {
		t.Errorf("lenient_mismatch_total = %v, want 1", got)
	}
	for reason, n := range map[string]float64{"conflict": 1, "missing_key": 1, "invalid_key": 1, "malformed_payload": 1, "payload_too_large": 1, "invalid_schema": 1} {
		if got := metricIn(body, "idemstream_dlq_records_total", "pipeline", "strict", "reason", reason); got != n {
			t.Errorf("dlq_records_total{reason=%s} = %v, want %v", reason, got, n)
		}
	}

	// Results: one per key per window, with the documented headers.
	results := readTopic(t, io, topic("strict", "out"))
	if len(results) != 1 || hv(results[0], "idemstream-key") != a || hv(results[0], "idemstream-outcome") != "first" ||
		hv(results[0], "idemstream-source") != in("strict")+"/0/0" || hv(results[0], "Idempotency-Key") != a ||
		string(results[0].Value) != `{"coupon_id":1,"amount":50,"client_time":"10:00:00"}` || string(results[0].Key) != a {
		t.Errorf("strict results: %+v", results)
	}
	lenient := readTopic(t, io, topic("lenient", "out"))
	if len(lenient) != 1 || string(lenient[0].Key) != "user-7" {
		t.Errorf("lenient results: %+v (the input key must be kept)", lenient)
	}
	if got := readTopic(t, io, topic("window", "out")); len(got) != 2 {
		t.Errorf("window results: %d, want 2 (one per window)", len(got))
	}
	replies := readTopic(t, io, topic("lenient", "replies"))
	if len(replies) != 1 || string(replies[0].Value) != `{"qty":1}` || hv(replies[0], "idemstream-replayed") != "true" ||
		hv(replies[0], "idemstream-source") != in("lenient")+"/0/1" {
		t.Errorf("replies: %+v", replies)
	}

	// Dead letters: input bytes kept, reason and evidence added.
	dead := map[string]sinks.Fetched{}
	for _, d := range readTopic(t, io, topic("strict", "dlq")) {
		dead[hv(d, "idemstream-reason")] = d
	}
	c := dead["conflict"]
	if string(c.Value) != `{"coupon_id":1,"amount":100}` || hv(c, "idemstream-conflict-paths") != "/amount" ||
		hv(c, "idemstream-first-source") != in("strict")+"/0/0" || hv(c, "idemstream-first-fingerprint") != hv(results[0], "idemstream-fingerprint") {
		t.Errorf("conflict dead letter: %s %+v", c.Value, c.Headers)
	}
	if s := hv(dead["invalid_schema"], "idemstream-error"); !strings.Contains(s, "/coupon_id") {
		t.Errorf("invalid_schema error %q does not name /coupon_id", s)
	}
	if len(dead) != 6 {
		t.Errorf("dead-letter reasons: %v", keysOf(dead))
	}

	// Operations: lag reaches 0 and the instance is ready.
	waitUntil(t, 20*time.Second, "consumer_lag 0 on every partition", func() bool {
		_, body := inst.get("/metrics")
		re := regexp.MustCompile(`(?m)^idemstream_consumer_lag\{[^}]*\} (\S+)$`)
		m := re.FindAllStringSubmatch(body, -1)
		if len(m) != 8 {
			return false
		}
		for _, v := range m {
			if v[1] != "0" {
				return false
			}
		}
		return true
	})
	if code, body := inst.get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d %s", code, body)
	}
	if code, _ := inst.get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestRunThreeInstancesShareSixPartitions: three instances in one group,
// every key sent twice, once on another partition at the same time: one
// result per key, whoever decides it.
func TestRunThreeInstancesShareSixPartitions(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	run, inTopic, outTopic, dlqTopic := pipelineTopics(t, brokers, "group", 6)
	config := writeRunConfig(t, brokers, redisAddr, run,
		fmt.Sprintf("{name: claims, input: %s, output: %s, dlq: %s, volatile: [/attempt]}", inTopic, outTopic, dlqTopic))
	insts := []*instance{startInstance(t, config, nil), startInstance(t, config, nil), startInstance(t, config, nil)}
	waitUntil(t, 60*time.Second, "three members ready", func() bool {
		for _, in := range insts {
			if code, _ := in.get("/readyz"); code != 200 {
				return false
			}
		}
		return true
	})
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	const keys = 300
	var recs []produced
	for i := range keys {
		body := fmt.Sprintf(`{"user":%d,"attempt":%%d}`, i)
		recs = append(recs,
			produced{inTopic, i % 6, nil, key(uuidN(i)), fmt.Sprintf(body, 1)},
			produced{inTopic, (i + 1) % 6, nil, key(uuidN(i)), fmt.Sprintf(body, 2)})
	}
	produce(t, io, recs...)
	sum := func(outcome string) float64 {
		s := 0.0
		for _, in := range insts {
			if v := in.metric("idemstream_records_total", "pipeline", "claims", "outcome", outcome); v > 0 {
				s += v
			}
		}
		return s
	}
	waitUntil(t, 90*time.Second, "600 records decided", func() bool { return sum("first")+sum("replay") == 2*keys })
	if f, r := sum("first"), sum("replay"); f != keys || r != keys {
		t.Errorf("first %v replay %v across the group, want %d each", f, r, keys)
	}
	perKey := map[string]int{}
	for _, res := range readTopic(t, io, outTopic) {
		perKey[hv(res, "idemstream-key")]++
	}
	if len(perKey) != keys {
		t.Errorf("%d keys have results, want %d", len(perKey), keys)
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("key %s has %d results", k, n)
		}
	}
	busy := 0
	for _, in := range insts {
		if in.metric("idemstream_records_total", "pipeline", "claims", "outcome", "first") > 0 {
			busy++
		}
	}
	if busy < 2 {
		t.Errorf("only %d of 3 instances decided anything: the group did not share partitions", busy)
	}
}

// TestRunBatchSize: --batch-size reaches the pipelines. A backlog of 40
// records on one partition comes in one fetch, which the default size
// decides as one batch; batches of 5 make at least eight.
func TestRunBatchSize(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	run, inTopic, outTopic, dlqTopic := pipelineTopics(t, brokers, "batch", 1)
	config := writeRunConfig(t, brokers, redisAddr, run, fmt.Sprintf("{name: p, input: %s, output: %s, dlq: %s}", inTopic, outTopic, dlqTopic))
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	const records, size = 40, 5
	var recs []produced
	for i := range records {
		recs = append(recs, produced{inTopic, 0, nil, key(uuidN(i)), fmt.Sprintf(`{"n":%d}`, i)})
	}
	produce(t, io, recs...)
	in := startInstance(t, config, nil, "--batch-size", strconv.Itoa(size))
	waitUntil(t, 60*time.Second, "40 records decided", func() bool {
		return in.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == records
	})
	// A batch counts its records just before its duration.
	batches := in.metric("idemstream_decision_duration_seconds_count", "pipeline", "p")
	for deadline := time.Now().Add(10 * time.Second); batches < records/size && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		batches = in.metric("idemstream_decision_duration_seconds_count", "pipeline", "p")
	}
	if batches < records/size {
		t.Errorf("%v batches for %d records with --batch-size %d, want at least %d", batches, records, size, records/size)
	}
	if n := len(readTopic(t, io, outTopic)); n != records {
		t.Errorf("%d results, want %d", n, records)
	}
}

// TestRunPausesWhileRedisIsDown: with Redis stopped the instance reports
// not ready and decides nothing; it resumes by itself when Redis returns.
func TestRunPausesWhileRedisIsDown(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true})
	run, inTopic, outTopic, dlqTopic := pipelineTopics(t, brokers, "outage", 1)
	config := filepath.Join(t.TempDir(), "c.yaml")
	yaml := fmt.Sprintf("kafka: {brokers: [%s], group: %s}\nstore: {redis: {url: 'redis://%s/0'}}\npipelines:\n  - {name: p, input: %s, output: %s, dlq: %s, key: {format: any}}\n",
		strings.Join(brokers, ","), run, srv.Addr, inTopic, outTopic, dlqTopic)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	inst := startInstance(t, config, nil)
	waitUntil(t, 60*time.Second, "ready", func() bool { code, _ := inst.get("/readyz"); return code == 200 })
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	produce(t, io, produced{inTopic, 0, nil, key("before"), `{"n":1}`})
	waitUntil(t, 30*time.Second, "the first record", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 1
	})

	srv.Stop()
	produce(t, io, produced{inTopic, 0, nil, key("during"), `{"n":2}`}, produced{inTopic, 0, nil, key("before"), `{"n":1}`})
	waitUntil(t, 30*time.Second, "/readyz to report the outage", func() bool {
		code, body := inst.get("/readyz")
		return code == 503 && strings.Contains(body, "store")
	})
	if got := inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first"); got != 1 {
		t.Errorf("decided %v firsts while Redis was down, want still 1", got)
	}
	if got := len(readTopic(t, io, outTopic)); got != 1 {
		t.Errorf("%d results while Redis was down, want 1", got)
	}

	srv.Start()
	waitUntil(t, 60*time.Second, "ready again", func() bool { code, _ := inst.get("/readyz"); return code == 200 })
	waitUntil(t, 30*time.Second, "the held records decided", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 2 &&
			inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "replay") == 1
	})
	if got := len(readTopic(t, io, outTopic)); got != 2 {
		t.Errorf("%d results after the outage, want 2 (the AOF kept the first decision)", got)
	}
	if !strings.Contains(inst.stderr.String(), "paused") || !strings.Contains(inst.stderr.String(), "resumed") {
		t.Errorf("no pause/resume log lines:\n%s", inst.stderr.String())
	}
}

// TestRunStdoutSink: --sink stdout prints results and dead letters as JSON
// lines and produces nothing.
func TestRunStdoutSink(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	run := testenv.UniqueName(t, "stdout")
	inTopic := run + ".in"
	testenv.CreateTopics(t, brokers, 1, inTopic)
	config := writeRunConfig(t, brokers, redisAddr, run, fmt.Sprintf("{name: p, input: %s, output: %s.out, dlq: %s.dlq, key: {format: any}}", inTopic, run, run))
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	produce(t, io, produced{inTopic, 0, nil, key("k"), `{"a":1}`}, produced{inTopic, 0, nil, key("k"), `{"a":1}`}, produced{inTopic, 0, nil, nil, `{}`})
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run2(ctx, []string{"run", "--config", config, "--metrics-addr", testenv.FreeAddr(t), "--sink", "stdout"}, out)
	}()
	waitUntil(t, 60*time.Second, "two JSON lines", func() bool { return strings.Count(out.String(), "\n") >= 2 })
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("run exited %d", code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0]+lines[1], `"idemstream-outcome":"first"`) || !strings.Contains(lines[0]+lines[1], `"idemstream-reason":"missing_key"`) {
		t.Errorf("stdout sink printed:\n%s", out.String())
	}
}

func run2(ctx context.Context, args []string, stdout io.Writer) int {
	return run(ctx, args, strings.NewReader(""), stdout, io.Discard, func(string) string { return "" })
}

// TestRunSASL: the consumer authenticates with PLAIN, SCRAM-SHA-256 and
// SCRAM-SHA-512 on the broker's SASL listener, the password read from the
// environment variable the config names; a wrong password never makes the
// instance ready.
func TestRunSASL(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	saslBrokers := testenv.KafkaSASLBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	for _, mech := range []string{"plain", "scram-sha-256", "scram-sha-512"} {
		t.Run(mech, func(t *testing.T) {
			run, inTopic, outTopic, dlqTopic := pipelineTopics(t, brokers, "sasl", 1)
			config := filepath.Join(t.TempDir(), "c.yaml")
			yaml := fmt.Sprintf("kafka: {brokers: [%s], group: %s, sasl: {mechanism: %s, username: %s, password_env: KAFKA_PASSWORD}}\n"+
				"store: {redis: {url: 'redis://%s/0', prefix: %s, check_server: false}}\npipelines:\n  - {name: p, input: %s, output: %s, dlq: %s, key: {format: any}}\n",
				strings.Join(saslBrokers, ","), run, mech, testenv.KafkaSASLUser, redisAddr, run, inTopic, outTopic, dlqTopic)
			if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			produce(t, io, produced{inTopic, 0, nil, key("k"), `{"a":1}`})
			inst := startInstance(t, config, map[string]string{"KAFKA_PASSWORD": testenv.KafkaSASLPassword})
			waitUntil(t, 60*time.Second, "the record decided over SASL", func() bool {
				return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 1
			})
			if got := len(readTopic(t, io, outTopic)); got != 1 {
				t.Errorf("%d results, want 1", got)
			}
			if mech != "plain" {
				return
			}
			wrong := startInstance(t, config, map[string]string{"KAFKA_PASSWORD": "not-the-password"})
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if code, _ := wrong.get("/readyz"); code == 200 {
					t.Fatal("an instance with a wrong SASL password became ready")
				}
				time.Sleep(100 * time.Millisecond)
			}
			if strings.Contains(wrong.stderr.String(), "not-the-password") {
				t.Error("the SASL password reached the log")
			}
		})
	}
}

// TestRunTLS: the consumer reaches the broker's TLS listener, trusting the
// CA named by kafka.tls.ca_file; without that CA it never becomes ready.
func TestRunTLS(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	tlsBrokers, caFile := testenv.KafkaTLSBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	run, inTopic, outTopic, dlqTopic := pipelineTopics(t, brokers, "tls", 1)
	write := func(name, tls string) string {
		config := filepath.Join(t.TempDir(), name)
		yaml := fmt.Sprintf("kafka: {brokers: [%s], group: %s, tls: %s}\n"+
			"store: {redis: {url: 'redis://%s/0', prefix: %s, check_server: false}}\npipelines:\n  - {name: p, input: %s, output: %s, dlq: %s, key: {format: any}}\n",
			strings.Join(tlsBrokers, ","), run, tls, redisAddr, run, inTopic, outTopic, dlqTopic)
		if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return config
	}
	produce(t, io, produced{inTopic, 0, nil, key("k"), `{"a":1}`})
	inst := startInstance(t, write("ok.yaml", fmt.Sprintf("{ca_file: '%s'}", caFile)), nil)
	waitUntil(t, 60*time.Second, "the record decided over TLS", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 1
	})
	if got := len(readTopic(t, io, outTopic)); got != 1 {
		t.Errorf("%d results, want 1", got)
	}
	untrusting := startInstance(t, write("no-ca.yaml", "{enabled: true}"), nil)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if code, _ := untrusting.get("/readyz"); code == 200 {
			t.Fatal("an instance that does not trust the broker's CA became ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
