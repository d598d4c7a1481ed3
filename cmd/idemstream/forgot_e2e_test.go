package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// The store forgetting behind idemstream's back, as an operator meets it:
// `idemstream run` on the real broker and a real Redis (standalone,
// Sentinel, Cluster) decides a stream of commands whose retries come
// back; mid-stream the store loses its data. No key may get a second
// result: the instance stops deciding, reports not ready with the
// reason and sets idemstream_store_forgot, until `idemstream store
// accept-loss`, after which it decides again.
const (
	forgetKeys  = 300 // decided before the fault
	forgetLater = 300 // new keys, each followed by the retry of an old one
)

// forgetRun runs the scenario with the config's store section and a fault
// that makes the store forget (and returns once it did).
func forgetRun(t *testing.T, store string, fault func()) {
	brokers := testenv.KafkaBrokers(t)
	run, inTopic, outTopic, dlqTopic := pipelineTopics(t, brokers, "forgot", 2)
	config := filepath.Join(t.TempDir(), "c.yaml")
	yaml := fmt.Sprintf("kafka: {brokers: [%s], group: %s}\nstore: {redis: %s}\npipelines:\n  - {name: p, input: %s, output: %s, dlq: %s, key: {format: any}}\n",
		strings.Join(brokers, ","), run, store, inTopic, outTopic, dlqTopic)
	if err := os.WriteFile(config, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	command := func(i int) produced {
		return produced{inTopic, i % 2, nil, key("k-" + strconv.Itoa(i)), fmt.Sprintf(`{"coupon":%d}`, i)}
	}
	var first []produced
	for i := range forgetKeys {
		first = append(first, command(i))
	}
	produce(t, io, first...)

	inst := startInstance(t, config, nil)
	firsts := func() float64 { return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") }
	waitUntil(t, 90*time.Second, "the first commands decided", func() bool { return firsts() == forgetKeys })

	// New commands, each with the retry of an old one behind it, while
	// the store forgets, and the rest of them once it has.
	pair := func(i int) { produce(t, io, command(forgetKeys+i), command(i)) }
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range forgetLater / 3 {
			pair(i)
			time.Sleep(10 * time.Millisecond)
		}
	})
	waitUntil(t, 60*time.Second, "new commands decided", func() bool { return firsts() >= forgetKeys+20 })
	fault()
	wg.Wait()
	for i := forgetLater / 3; i < forgetLater; i++ {
		pair(i)
	}

	t.Cleanup(func() {
		if t.Failed() {
			_, body := inst.get("/readyz")
			t.Logf("/readyz: %s\nlog:\n%s", body, tail(inst.stderr.String(), 40))
		}
	})
	waitUntil(t, 60*time.Second, "/readyz to report the loss", func() bool {
		if k, n := mostResults(readTopic(t, io, outTopic)); n > 1 {
			t.Fatalf("key %s has %d results: the store forgot and the instance decided it first again", k, n)
		}
		code, body := inst.get("/readyz")
		return code == 503 && strings.Contains(body, "the store forgot decisions it had made")
	})
	if got := inst.metric("idemstream_store_forgot"); got != 1 {
		t.Errorf("idemstream_store_forgot = %v, want 1", got)
	}
	// What it wrote: no key twice. Everything the partitions had
	// committed is written; a batch in flight at the loss is retried, and
	// waits as the rest does.
	results := readTopic(t, io, outTopic)
	perKey := map[string]int{}
	for _, r := range results {
		perKey[hv(r, sinks.HeaderKey)]++
	}
	for k, n := range perKey {
		if n > 1 {
			t.Errorf("key %s has %d results after the store forgot", k, n)
		}
	}
	if len(results) >= forgetKeys+forgetLater {
		t.Errorf("%d results: every command was decided, so the fault came too late to test anything", len(results))
	}
	t.Logf("%d results, %d keys, when the instance stopped deciding", len(results), len(perKey))

	if r := runCLIWith(t, "store", "status", "--config", config, "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"state": "forgot"`) {
		t.Errorf("store status: exit %d, %s %s; want the state forgot", r.code, r.stdout, r.stderr)
	}

	// The operator accepts the loss: the instance decides again.
	if r := runCLIWith(t, "store", "accept-loss", "--config", config); r.code != 2 || !strings.Contains(r.stderr, "--yes") {
		t.Errorf("accept-loss without --yes: exit %d, %q; want usage naming --yes", r.code, r.stderr)
	}
	if r := runCLIWith(t, "store", "accept-loss", "--config", config, "--yes"); r.code != 0 {
		t.Fatalf("accept-loss exited %d: %s", r.code, r.stderr)
	}
	waitUntil(t, 90*time.Second, "ready again after accept-loss", func() bool { code, _ := inst.get("/readyz"); return code == 200 })
	produce(t, io, produced{inTopic, 0, nil, key("after"), `{"coupon":-1}`})
	waitUntil(t, 60*time.Second, "a new command decided after accept-loss", func() bool {
		for _, r := range readTopic(t, io, outTopic) {
			if hv(r, sinks.HeaderKey) == "after" {
				return true
			}
		}
		return false
	})
	if got := inst.metric("idemstream_store_forgot"); got != 0 {
		t.Errorf("idemstream_store_forgot = %v after accept-loss, want 0", got)
	}
	if r := runCLIWith(t, "store", "status", "--config", config); r.code != 0 || !strings.HasPrefix(r.stdout, "state: armed") {
		t.Errorf("store status after accept-loss: exit %d, %s %s; want armed", r.code, r.stdout, r.stderr)
	}
}

// mostResults is the key with the most results, and their number.
func mostResults(results []sinks.Fetched) (string, int) {
	perKey := map[string]int{}
	top, most := "", 0
	for _, r := range results {
		k := hv(r, sinks.HeaderKey)
		if perKey[k]++; perKey[k] > most {
			top, most = k, perKey[k]
		}
	}
	return top, most
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// runCLIWith runs the command line as runCLI does, with no environment.
func runCLIWith(t *testing.T, args ...string) result { t.Helper(); return runCLI(t, "", args...) }

// FLUSHALL on the store while the stream runs.
func TestRunStopsDecidingAfterFlushAll(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	forgetRun(t, fmt.Sprintf("{url: 'redis://%s/0', check_server: false}", srv.Addr), func() {
		if _, err := testenv.RedisCommand(srv.Addr, "FLUSHALL"); err != nil {
			t.Fatal(err)
		}
	})
}

// A master without persistence restarted: it comes back empty.
func TestRunStopsDecidingAfterARestartWithoutPersistence(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	forgetRun(t, fmt.Sprintf("{url: 'redis://%s/0', check_server: false}", srv.Addr), func() {
		before := runID(t, srv.Addr)
		srv.Kill()
		srv.Start()
		if runID(t, srv.Addr) == before {
			t.Fatalf("fault not injected: %s was not restarted", srv.Addr)
		}
	})
}

// A Cluster node restarted without persistence keeps its slots
// (nodes.conf) and loses their entries.
func TestRunStopsDecidingAfterAClusterNodeRestoredEmpty(t *testing.T) {
	nodes := testenv.StartRedisClusterNodes(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, "'"+n.Addr+"'")
	}
	forgetRun(t, fmt.Sprintf("{addrs: [%s], check_server: false}", strings.Join(addrs, ", ")), func() {
		before := runID(t, nodes[1].Addr)
		nodes[1].Kill()
		nodes[1].Start()
		for _, n := range nodes {
			testenv.WaitClusterOK(t, n.Addr, 3, 30*time.Second)
		}
		// Without persistence a new process is an empty one.
		if after := runID(t, nodes[1].Addr); after == before {
			t.Fatalf("fault not injected: node %s was not restarted (run_id %s)", nodes[1].Addr, after)
		}
	})
}

// runID is the server's run_id, new with every process.
func runID(t *testing.T, addr string) string {
	t.Helper()
	info, err := testenv.RedisCommand(addr, "INFO", "server")
	if err != nil {
		t.Fatal(err)
	}
	_, id, _ := strings.Cut(info, "run_id:")
	id, _, _ = strings.Cut(id, "\r")
	return id
}

// Sentinel promotes a replica that never synced, and the replica that
// held every decision resyncs from it: the sequence of a second failover
// right after the old master came back empty.
func TestRunStopsDecidingAfterThePromotedReplicaIsEmptied(t *testing.T) {
	master := testenv.StartRedis(t, testenv.RedisConfig{})
	replica := testenv.StartRedisReplica(t, master.Addr, testenv.RedisConfig{})
	sentinels := testenv.StartRedisSentinels(t, master.Addr, 3, 2)
	waitSentinelsSee(t, sentinels, 1)
	quoted := make([]string, len(sentinels))
	for i, s := range sentinels {
		quoted[i] = "'" + s + "'"
	}
	forgetRun(t, fmt.Sprintf("{addrs: [%s], master_name: mymaster, check_server: false}", strings.Join(quoted, ", ")), func() {
		master.Kill()
		waitSentinelsName(t, sentinels, replica.Port())
		keys, _ := testenv.RedisCommand(replica.Addr, "DBSIZE")
		master.Start() // empty
		// Before the Sentinels turn the empty node into a replica (they
		// wait for its role to settle), a failover promotes it.
		promoteEmpty(t, sentinels, master.Port())
		waitSentinelsName(t, sentinels, master.Port())
		testenv.WaitRedisInfo(t, replica.Addr, "master_link_status:up", 30*time.Second)
		if n, err := testenv.RedisCommand(replica.Addr, "DBSIZE"); err != nil || n == keys {
			t.Fatalf("fault not injected: the replica held %s keys before and %s (%v) after resyncing from the empty node", keys, n, err)
		}
	})
}

// waitSentinelsSee waits until every Sentinel knows n replicas.
func waitSentinelsSee(t *testing.T, sentinels []string, n int) {
	t.Helper()
	for _, s := range sentinels {
		waitUntil(t, 30*time.Second, "Sentinel "+s+" to see the replica", func() bool {
			rep, err := testenv.RedisCommand(s, "SENTINEL", "MASTER", "mymaster")
			return err == nil && strings.Contains(rep, "num-slaves\n"+strconv.Itoa(n)+"\n") && strings.Contains(rep, "num-other-sentinels\n2\n")
		})
	}
}

// waitSentinelsName waits until every Sentinel names the server on port
// the master.
func waitSentinelsName(t *testing.T, sentinels []string, port int) {
	t.Helper()
	for _, s := range sentinels {
		waitUntil(t, 60*time.Second, "Sentinel "+s+" to name port "+strconv.Itoa(port)+" master", func() bool {
			rep, err := testenv.RedisCommand(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
			return err == nil && strings.HasSuffix(rep, "\n"+strconv.Itoa(port))
		})
	}
}

// promoteEmpty forces a failover while the restarted node still reports
// itself master with no data: Sentinel picks it, as it would after a
// spurious down of the promoted master.
func promoteEmpty(t *testing.T, sentinels []string, port int) {
	t.Helper()
	s := sentinels[0]
	waitUntil(t, 30*time.Second, "Sentinel to see the restarted node up", func() bool {
		rep, err := testenv.RedisCommand(s, "SENTINEL", "REPLICAS", "mymaster")
		return err == nil && strings.Contains(rep, "port\n"+strconv.Itoa(port)+"\n") && !strings.Contains(rep, "disconnected") && !strings.Contains(rep, "s_down")
	})
	waitUntil(t, 30*time.Second, "a forced failover to start", func() bool {
		_, err := testenv.RedisCommand(s, "SENTINEL", "FAILOVER", "mymaster")
		return err == nil
	})
}
