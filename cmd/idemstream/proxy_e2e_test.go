package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

// couponDesk is a real upstream: an HTTP server that claims coupons and
// counts its calls; hold, when set, makes a call wait until it is closed.
type couponDesk struct {
	calls   atomic.Int64
	called  chan struct{} // one send per call, when not nil
	hold    chan struct{}
	publish func(r *http.Request, body []byte) error
	addr    string
}

func startCouponDesk(t *testing.T, d *couponDesk) *couponDesk {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := d.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		if d.called != nil {
			d.called <- struct{}{}
		}
		if d.hold != nil {
			<-d.hold
		}
		if d.publish != nil {
			if err := d.publish(r, body); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"claim":%d}`, n)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return d
}

func writeProxyConfig(t *testing.T, redisAddr, prefix, upstream, listen, extra string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "proxy.yaml")
	yaml := fmt.Sprintf(`store: {kind: redis, redis: {url: 'redis://%s/0', prefix: %s, check_server: false}}
http:
  listen: %s
  upstream: http://%s
  routes:
    - name: coupon-claim
      path: /api/coupon/claim
      volatile: [/client_time, /retry_count]
      volatile_headers: [X-Retry-Count]
%s`, redisAddr, prefix, listen, upstream, extra)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}

type httpReply struct {
	status   int
	replayed string
	body     string
}

func claimAt(addr, key, body string) httpReply {
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/api/coupon/claim", strings.NewReader(body))
	if err != nil {
		return httpReply{body: err.Error()}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpReply{status: 0, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpReply{resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)}
}

// The proxy on a real redis-server in front of a real upstream: 200
// concurrent retries of one key run the upstream once and all get its
// answer; the incident's retries are replays; a changed amount is 422
// naming /amount; the metrics count each.
func TestProxyOnTheRealRedis(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	prefix := testenv.UniqueName(t, "proxy")
	called, hold := make(chan struct{}, 1000), make(chan struct{})
	desk := startCouponDesk(t, &couponDesk{called: called, hold: hold})
	listen, metrics := testenv.FreeAddr(t), testenv.FreeAddr(t)
	config := writeProxyConfig(t, redisAddr, prefix, desk.addr, listen, "")
	stderr := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"proxy", "-c", config, "--metrics-addr", metrics, "--log-format", "text"}, strings.NewReader(""), io.Discard, stderr, func(string) string { return "" })
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("proxy exited %d:\n%s", code, stderr.String())
		}
	}()
	waitReady(t, metrics)

	const key, clients = "7c2d4f1e-5b6a-4c3d-9e8f-0a1b2c3d4e5f", 200
	replies := make([]httpReply, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			replies[i] = claimAt(listen, key, fmt.Sprintf(`{"user":"u-1","coupon":"VIP300-50","amount":50,"client_time":"12:00:%02d.%03d","retry_count":%d}`, i%60, i, i))
		})
	}
	select {
	case <-called:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream was never called")
	}
	close(hold)
	wg.Wait()
	firsts := 0
	for i, r := range replies {
		if r.status != http.StatusCreated || r.body != `{"claim":1}` {
			t.Fatalf("client %d: %d %s, want 201 {\"claim\":1}", i, r.status, r.body)
		}
		if r.replayed == "" {
			firsts++
		}
	}
	if n := desk.calls.Load(); n != 1 || firsts != 1 {
		t.Fatalf("upstream calls %d, answers not replayed %d: want 1 and 1", n, firsts)
	}
	changed := claimAt(listen, key, `{"user":"u-1","coupon":"VIP300-50","amount":500,"client_time":"12:05:00","retry_count":0}`)
	var p struct {
		Code  string   `json:"code"`
		Paths []string `json:"conflict_paths"`
	}
	if err := json.Unmarshal([]byte(changed.body), &p); changed.status != http.StatusUnprocessableEntity || err != nil || p.Code != "IDEMPOTENCY_KEY_CONFLICT" || strings.Join(p.Paths, ",") != "/amount" {
		t.Fatalf("changed amount: %d %s, want 422 naming /amount", changed.status, changed.body)
	}
	if n := desk.calls.Load(); n != 1 {
		t.Fatalf("the conflict reached the upstream (%d calls)", n)
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for outcome, want := range map[string]float64{"first": 1, "replay": clients - 1, "conflict": 1} {
		if got := metricIn(string(body), "idemstream_http_requests_total", "route", "coupon-claim", "outcome", outcome); got != want {
			t.Errorf("idemstream_http_requests_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
	if got := metricIn(string(body), "idemstream_http_upstream_duration_seconds_count", "route", "coupon-claim"); got != 1 {
		t.Errorf("upstream duration count %v, want 1", got)
	}
}

// SIGKILL of the proxy while the upstream is answering: the key stays
// PENDING for its lease (default timings: twice the 30s upstream_timeout),
// retries meanwhile are 409, and once it has run out a second proxy takes
// the key over without calling the upstream again: the documented rule
// answers outcome unknown, the same for every retry.
func TestProxyKilledWhileTheUpstreamAnswers(t *testing.T) {
	redisAddr := testenv.RedisAddr(t)
	prefix := testenv.UniqueName(t, "proxykill")
	called, hold := make(chan struct{}, 16), make(chan struct{})
	desk := startCouponDesk(t, &couponDesk{called: called, hold: hold})
	bin := filepath.Join(t.TempDir(), "idemstream")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	listen := testenv.FreeAddr(t)
	config := writeProxyConfig(t, redisAddr, prefix, desk.addr, listen, "")
	start := func() (*exec.Cmd, *syncBuffer) {
		metrics := testenv.FreeAddr(t)
		out := &syncBuffer{}
		cmd := exec.Command(bin, "proxy", "-c", config, "--metrics-addr", metrics, "--log-format", "text")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		waitReady(t, metrics)
		return cmd, out
	}
	first, _ := start()
	const key = "3b9f6c2a-8d4e-4f1a-9c7b-2e5d8a1f0c6b"
	body := `{"user":"u-9","coupon":"VIP300-50","client_time":"12:00:00","retry_count":0}`
	go claimAt(listen, key, body)
	select {
	case <-called:
	case <-time.After(30 * time.Second):
		t.Fatal("the upstream was never called")
	}
	killedAt := time.Now()
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	close(hold) // the upstream answers a proxy that is gone

	cfg, err := schemas.Load(config)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	if err != nil {
		t.Fatal(err)
	}
	if pol.Lease() != 2*schemas.DefaultUpstreamTimeout {
		t.Fatalf("lease %v: the test means the default timings", pol.Lease())
	}
	start()
	if r := claimAt(listen, key, body); r.status != http.StatusConflict {
		t.Fatalf("a retry within the lease: %d %s, want 409", r.status, r.body)
	}
	var r httpReply
	waitUntil(t, pol.Lease()+30*time.Second, "the key to be taken over", func() bool {
		r = claimAt(listen, key, strings.Replace(body, "12:00:00", time.Now().Format("15:04:05"), 1))
		return r.status != http.StatusConflict
	})
	if held := time.Since(killedAt); held < pol.Lease()-2*time.Second {
		t.Errorf("the key was taken over %v after the kill, before its %v lease ran out", held, pol.Lease())
	}
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, "IDEMPOTENCY_OUTCOME_UNKNOWN") {
		t.Fatalf("after the takeover: %d %s, want 502 IDEMPOTENCY_OUTCOME_UNKNOWN", r.status, r.body)
	}
	again := claimAt(listen, key, body)
	if again.status != r.status || again.body != r.body || again.replayed != "true" {
		t.Fatalf("the next retry: %d %q %s, want the same answer replayed", again.status, again.replayed, again.body)
	}
	if n := desk.calls.Load(); n != 1 {
		t.Fatalf("the upstream was called %d times for one key, want 1", n)
	}
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	e, found, err := redisstore.New(client, prefix).Lookup(context.Background(), pol.Pipeline, "POST /api/coupon/claim "+key)
	if err != nil || !found || e.State != dedupe.Success {
		t.Fatalf("entry %+v found %v err %v, want SUCCESS (the outcome-unknown answer, kept for the window)", e, found, err)
	}
}

// Stream and HTTP together: a service behind the proxy publishes each
// claim as a command (twice, as a producer retry would), with the
// Idempotency-Key as the record's key header, and an idemstream pipeline
// decides the commands. Retried HTTP requests give one upstream call, and
// the topic one result.
func TestHTTPRetriesThroughProxyAndPipelineGiveOneResult(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	runName := testenv.UniqueName(t, "front")
	in, out, dlq := runName+".in", runName+".out", runName+".dlq"
	testenv.CreateTopics(t, brokers, 1, in, out, dlq)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: in, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	desk := startCouponDesk(t, &couponDesk{publish: func(r *http.Request, body []byte) error {
		m := kafka.Message{Value: body, Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(r.Header.Get("Idempotency-Key"))}}}
		return w.WriteMessages(r.Context(), m, m) // a producer retry: the command twice
	}})
	listen, metrics := testenv.FreeAddr(t), testenv.FreeAddr(t)
	config := writeProxyConfig(t, redisAddr, fmt.Sprintf("fr%d", time.Now().UnixNano()), desk.addr, listen, "")
	stream := fmt.Sprintf("kafka: {brokers: [%s], group: %s}\npipelines:\n  - {name: claims, input: %s, output: %s, dlq: %s, volatile: [/client_time, /retry_count]}\n",
		strings.Join(brokers, ","), runName, in, out, dlq)
	data, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, append(data, stream...), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := schemas.Load(config)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := consumer.NewService(cfg, consumer.ServiceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svcDone := make(chan error, 1)
	go func() { svcDone <- svc.Run(ctx) }()
	proxyDone := make(chan int, 1)
	stderr := &syncBuffer{}
	go func() {
		proxyDone <- run(ctx, []string{"proxy", "-c", config, "--metrics-addr", metrics, "--log-format", "text"}, strings.NewReader(""), io.Discard, stderr, func(string) string { return "" })
	}()
	waitReady(t, metrics)
	const key = "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"
	for i := range 5 {
		r := claimAt(listen, key, fmt.Sprintf(`{"user":"u-3","coupon":"VIP300-50","client_time":"12:00:0%d","retry_count":%d}`, i, i))
		if r.status != http.StatusCreated {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if n := desk.calls.Load(); n != 1 {
		t.Fatalf("upstream calls %d, want 1", n)
	}
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	waitUntil(t, 60*time.Second, "both commands to be decided", func() bool {
		ends, err := io.EndOffsets(context.Background(), in, []int{0})
		if err != nil || ends[0] != 2 {
			return false
		}
		// The group's committed offset is past both commands once the
		// pipeline decided them; its result is then written.
		results := readTopic(t, io, out)
		return len(results) >= 1 && len(svc.Ready(context.Background())) == 0 && committed(t, brokers, cfg.ConsumerGroup(cfg.Pipelines[0]), in) == 2
	})
	results := readTopic(t, io, out)
	if len(results) != 1 || hv(results[0], sinks.HeaderKey) != key {
		t.Fatalf("%d results on %s, want 1 for %s", len(results), out, key)
	}
	cancel()
	if err := <-svcDone; err != nil {
		t.Errorf("pipeline: %v", err)
	}
	if code := <-proxyDone; code != 0 {
		t.Errorf("proxy exited %d:\n%s", code, stderr.String())
	}
}

// committed is the group's committed offset of partition 0 of topic.
func committed(t *testing.T, brokers []string, group, topic string) int64 {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := c.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0}}})
	if err != nil || len(resp.Topics[topic]) == 0 {
		return -1
	}
	return resp.Topics[topic][0].CommittedOffset
}

// waitReady waits for the /readyz of the metrics address to say ready.
func waitReady(t *testing.T, metrics string) {
	t.Helper()
	waitUntil(t, 30*time.Second, "the proxy to be ready", func() bool {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}
