package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/dedupe/storetest"
	"github.com/idemstream/idemstream/internal/testenv"
)

var prefixes atomic.Int64

// freshPrefix keeps subtests apart on a shared server.
func freshPrefix() string {
	return "test" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(prefixes.Add(1), 10)
}

func client(t testing.TB, addr string) redis.UniversalClient {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + addr + "/0", Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestConformanceMiniredis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		m := miniredis.RunT(t)
		clock := storetest.NewManualClock()
		m.SetTime(clock.Now())
		return storetest.Harness{
			Store: redisstore.New(client(t, m.Addr()), "idem"),
			Advance: func(d time.Duration) {
				clock.Advance(d)
				m.SetTime(clock.Now())
				m.FastForward(d)
			},
			Simulated: true,
		}
	})
}

// formats are the entry formats a store writes: each conformance run
// holds both to the contract.
var formats = []struct {
	name string
	opts []redisstore.Option
}{
	{"text", nil},
	{"compact", []redisstore.Option{redisstore.WithCompactEntries(),
		redisstore.WithSourceTopics(storetest.SourceTopics...), redisstore.WithRulesDigests(storetest.RulesDigests...)}},
}

// runFormats runs the conformance suite on c once per entry format.
func runFormats(t *testing.T, c redis.UniversalClient) {
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				// The server's clock is real: advancing it is waiting for it.
				return storetest.Harness{Store: redisstore.New(c, freshPrefix(), f.opts...), Advance: time.Sleep}
			})
		})
	}
}

func TestConformanceRedisServer(t *testing.T) {
	runFormats(t, client(t, testenv.RedisAddr(t)))
}

// alternating sends each call to the next of its stores, which share one
// prefix: what one writes the next reads and writes back, as when members
// of one group write different formats during an upgrade.
type alternating struct {
	stores []dedupe.Store
	calls  atomic.Int64
}

func (a *alternating) next() dedupe.Store { return a.stores[a.calls.Add(1)%int64(len(a.stores))] }

func (a *alternating) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	return a.next().Decide(ctx, reqs)
}

func (a *alternating) Complete(ctx context.Context, comps []dedupe.Completion) ([]error, error) {
	return a.next().Complete(ctx, comps)
}

func (a *alternating) Lookup(ctx context.Context, namespace, key string) (dedupe.Entry, bool, error) {
	return a.next().Lookup(ctx, namespace, key)
}

// A store that writes text entries and one that writes compact entries
// share a prefix and keep the contract together, on Redis (WATCH) and on
// Valkey (SET … IFEQ against what the other store wrote).
func TestConformanceMixedFormats(t *testing.T) {
	for _, server := range []struct{ name, addr string }{{"redis", testenv.RedisAddr(t)}, {"valkey", testenv.ValkeyAddr(t)}} {
		c := client(t, server.addr)
		t.Run(server.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				prefix := freshPrefix()
				known := []redisstore.Option{redisstore.WithSourceTopics(storetest.SourceTopics...), redisstore.WithRulesDigests(storetest.RulesDigests...)}
				text := redisstore.New(c, prefix, known...)
				compact := redisstore.New(c, prefix, append(known, redisstore.WithCompactEntries())...)
				return storetest.Harness{Store: &alternating{stores: []dedupe.Store{text, compact}}, Advance: time.Sleep}
			})
		})
	}
}

// Valkey 8.1 and later finish batches with SET … IFEQ instead of WATCH:
// the same contract.
func TestConformanceValkey(t *testing.T) {
	runFormats(t, client(t, testenv.ValkeyAddr(t)))
}

func decideReq(key, holder string) dedupe.DecideRequest {
	return dedupe.DecideRequest{
		Namespace: "p", Key: key, Fingerprint: "sha256:a", RulesDigest: "sha256:r",
		Semantics: dedupe.Strict, Window: time.Minute, Lease: 10 * time.Second,
		Owner:  dedupe.Owner{Holder: holder, Source: "in/0/1"},
		Intent: dedupe.Intent{Partition: -1, Floor: dedupe.NoPosition},
	}
}

// Two consumers racing on one key through separate connections: exactly
// one is told first.
func TestRacingClientsDecideOnce(t *testing.T) {
	addr := testenv.RedisAddr(t)
	prefix := freshPrefix()
	const racers, keys = 8, 200
	var firsts atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, racers)
	for r := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := redisstore.New(client(t, addr), prefix)
			reqs := make([]dedupe.DecideRequest, keys)
			for k := range reqs {
				reqs[k] = decideReq("key-"+strconv.Itoa(k), "racer-"+strconv.Itoa(r))
			}
			decs, err := s.Decide(context.Background(), reqs)
			if err != nil {
				errs <- err
				return
			}
			for _, d := range decs {
				if d.Verdict == dedupe.VerdictFirst {
					firsts.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := firsts.Load(); n != keys {
		t.Errorf("%d first decisions for %d keys across %d racers, want exactly one per key", n, keys, racers)
	}
}

// With appendonly yes and appendfsync always, a decision acknowledged
// before a crash (SIGKILL, no shutdown save) is there after the restart.
func TestDecisionsSurviveRestartWithAOF(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true})
	s := redisstore.New(client(t, srv.Addr), "idem")
	ctx := context.Background()
	r := decideReq("survivor", "instance-a")
	if d, err := s.Decide(ctx, []dedupe.DecideRequest{r}); err != nil || d[0].Verdict != dedupe.VerdictFirst {
		t.Fatalf("decide: %v %v", d, err)
	}
	errs, err := s.Complete(ctx, []dedupe.Completion{{Namespace: "p", Key: "survivor", Owner: r.Owner, State: dedupe.Success, Result: dedupe.ResultRef{Partition: 1, Offset: 42}}})
	if err != nil || errs[0] != nil {
		t.Fatalf("complete: %v %v", err, errs)
	}
	srv.Kill()
	srv.Start()
	var e dedupe.Entry
	var ok bool
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, ok, err = s.Lookup(ctx, "p", "survivor")
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !ok || e.State != dedupe.Success || e.Result.Offset != 42 {
		t.Fatalf("after restart: %+v ok=%v err=%v", e, ok, err)
	}
	d, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("survivor", "instance-b")})
	if err != nil || d[0].Verdict != dedupe.VerdictReplay {
		t.Errorf("after restart the key decides %v (%v), want replay", d, err)
	}
}

// A server that stops answering yields an error wrapping
// ErrStoreUnavailable, never a guess; the next call after it returns works.
func TestFrozenServerIsAnErrorNotAGuess(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	s := redisstore.New(client(t, srv.Addr), "idem")
	ctx := context.Background()
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("warm", "a")}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	decs, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("frozen", "a")})
	srv.Resume()
	if err == nil || decs != nil {
		t.Fatalf("decide on a frozen server = %v, %v; want an error and no decisions", decs, err)
	}
	if !errors.Is(err, dedupe.ErrStoreUnavailable) || !dedupe.IsRetryable(err) {
		t.Errorf("error %v is not a retryable ErrStoreUnavailable", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("frozen", "a")})
		if err == nil {
			if d[0].Verdict != dedupe.VerdictFirst && !d[0].Resumed {
				t.Errorf("after the thaw: %v", d[0].Verdict)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server thawed but decide still fails: %v", err)
		}
	}

	srv.Stop()
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("down", "a")}); !errors.Is(err, dedupe.ErrStoreUnavailable) {
		t.Errorf("decide with the server down: %v, want ErrStoreUnavailable", err)
	}
	if _, _, err := s.Lookup(ctx, "p", "down"); !errors.Is(err, dedupe.ErrStoreUnavailable) {
		t.Errorf("lookup with the server down: %v, want ErrStoreUnavailable", err)
	}
}

// A restarted server has lost its script cache: the store reloads the
// script and decides, without running any item twice.
func TestScriptReloadedAfterFlush(t *testing.T) {
	addr := testenv.RedisAddr(t)
	c := client(t, addr)
	s := redisstore.New(c, freshPrefix())
	ctx := context.Background()
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("a", "h")}); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	decs, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("b", "h"), decideReq("b", "h2")})
	if err != nil {
		t.Fatal(err)
	}
	if decs[0].Verdict != dedupe.VerdictFirst || decs[0].Resumed || decs[1].Verdict != dedupe.VerdictPending {
		t.Errorf("after a script flush: %v resumed=%v, %v; want first (not resumed), pending", decs[0].Verdict, decs[0].Resumed, decs[1].Verdict)
	}
}

func TestLongKeysAreHashedInTheName(t *testing.T) {
	s := redisstore.New(nil, "idem")
	long := strings.Repeat("k", 5000)
	name := s.RedisKey("p", long)
	if len(name) > 100 || !strings.HasPrefix(name, "idem:{p:sha256:") || !strings.HasSuffix(name, "}") {
		t.Errorf("name of a long key = %q (%d bytes)", name, len(name))
	}
	if got := s.RedisKey("p", "9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"); got != "idem:{p:9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d}" {
		t.Errorf("name of a uuid key = %q", got)
	}
}

// TestOneNameForTwoKeysInOneBatch: namespace "a:b" with key "c" and
// namespace "a" with key "b:c" share a Redis name. The second record of
// the name in a batch must not be decided against the entry the first
// one created (a replay of another key); the store refuses it, as it
// refuses such a record in a later batch.
func TestOneNameForTwoKeysInOneBatch(t *testing.T) {
	s := redisstore.New(client(t, testenv.RedisAddr(t)), freshPrefix())
	first, second := decideReq("c", "h"), decideReq("b:c", "h")
	first.Namespace, second.Namespace = "a:b", "a"
	if s.RedisKey(first.Namespace, first.Key) != s.RedisKey(second.Namespace, second.Key) {
		t.Fatal("the two records do not share a name: the test needs them to")
	}
	second.Owner.Source = "in/0/2"
	reqs := []dedupe.DecideRequest{first, second}
	for i := range redisstore.FastPathMin { // enough records for the SET NX path
		r := decideReq("filler-"+strconv.Itoa(i), "h")
		r.Owner.Source = "in/1/" + strconv.Itoa(i)
		reqs = append(reqs, r)
	}
	decs, err := s.Decide(context.Background(), reqs)
	if err == nil {
		t.Fatalf("decided %q in namespace %q as %s on the entry of %q: want an error", second.Key, second.Namespace, decs[1].Verdict, first.Key)
	}
	if !strings.Contains(err.Error(), "holds another key") {
		t.Errorf("error = %v, want one that says the entry holds another key", err)
	}
}

// TestUnreadableEntryIsNeverWrittenOver: a value at an entry's name that
// this release does not read (a later release's format, a compact entry
// with a byte too many, a text entry in a state it does not know, or no
// entry at all) stops its record with an
// error on every path that decides (the SET NX batch, the script alone, a
// renewal) and stays as it was. Written over, it would decide the key
// first again beside the result a later release may have written.
func TestUnreadableEntryIsNeverWrittenOver(t *testing.T) {
	ctx := context.Background()
	c := client(t, testenv.RedisAddr(t))
	s := redisstore.New(c, freshPrefix(), redisstore.WithCompactEntries())
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("model", "h")}); err != nil {
		t.Fatal(err)
	}
	compact, err := c.Get(ctx, s.RedisKey("p", "model")).Result()
	if err != nil {
		t.Fatal(err)
	}
	textStore := redisstore.New(c, freshPrefix())
	if _, err := textStore.Decide(ctx, []dedupe.DecideRequest{decideReq("model", "h")}); err != nil {
		t.Fatal(err)
	}
	text, err := c.Get(ctx, textStore.RedisKey("p", "model")).Result()
	if err != nil {
		t.Fatal(err)
	}
	state, rest, _ := strings.Cut(text, "\x1f")
	if state != "PENDING" {
		t.Fatalf("the text entry starts %q, want PENDING", state)
	}
	values := map[string]string{
		"a compact entry with a byte too many":  compact + "\x01",
		"state code 0, kept for a later format": "\x00\x00" + compact[2:],
		"no entry at all":                       "hello",
		// Its key is the test's own, so that nothing but the state is off.
		"a text entry in an unknown state": "PAUSED\x1f" + strings.TrimSuffix(rest, "model") + "{key}",
	}
	for what, v := range values {
		for _, path := range []string{"set-nx-batch", "script", "renewal"} {
			t.Run(what+"/"+path, func(t *testing.T) {
				key := "k-" + strconv.FormatInt(prefixes.Add(1), 10)
				name := s.RedisKey("p", key)
				v := strings.ReplaceAll(v, "{key}", key)
				if err := c.Set(ctx, name, v, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
				r := decideReq(key, "h")
				reqs := []dedupe.DecideRequest{r}
				switch path {
				case "set-nx-batch":
					for i := range redisstore.FastPathMin {
						f := decideReq(key+"-filler-"+strconv.Itoa(i), "h")
						f.Owner.Source = "in/1/" + strconv.Itoa(i)
						reqs = append(reqs, f)
					}
				case "renewal":
					reqs[0].RenewOnly = true
				}
				decs, err := s.Decide(ctx, reqs)
				if err == nil || !strings.Contains(err.Error(), "not one this release reads") {
					t.Errorf("decided over %q: %v, %v; want an error that says the entry is not one this release reads", v, decs, err)
				}
				if dedupe.IsRetryable(err) {
					t.Errorf("error %v is retryable: it cannot pass by itself", err)
				}
				if got, _ := c.Get(ctx, name).Result(); got != v {
					t.Errorf("the value became %q, want it unchanged", got)
				}
				if _, found, err := s.Lookup(ctx, "p", key); found || err == nil {
					t.Errorf("Lookup = found %v, error %v; want an error", found, err)
				}
			})
		}
	}
}

// A stray value at the readiness probe's name still means the store
// answers: both readiness checks (the consumer's and the front door's) ask
// through dedupe.Probe, and neither may hold its service back for it. A
// Redis that does not answer is reported, as retryable.
func TestProbeAnswersOverAnUnreadableValue(t *testing.T) {
	ctx := context.Background()
	c := client(t, testenv.RedisAddr(t))
	s := redisstore.New(c, freshPrefix(), redisstore.WithCompactEntries())
	if err := c.Set(ctx, s.RedisKey("idemstream-readyz", "probe"), "hello", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Lookup(ctx, "idemstream-readyz", "probe"); !errors.Is(err, dedupe.ErrEntryUnreadable) {
		t.Fatalf("Lookup of the stray value: %v, want an error wrapping dedupe.ErrEntryUnreadable", err)
	}
	if err := dedupe.Probe(ctx, s); err != nil {
		t.Errorf("Probe with a stray value at its name: %v, want nil", err)
	}
	down := redisstore.New(client(t, testenv.FreeAddr(t)), freshPrefix())
	if err := dedupe.Probe(ctx, down); !dedupe.IsRetryable(err) {
		t.Errorf("Probe of a Redis that is not there: %v, want a retryable error", err)
	}
}

func TestRedactURL(t *testing.T) {
	got := redisstore.RedactURL("redis://user:s3cret@host:6379/0")
	if strings.Contains(got, "s3cret") {
		t.Errorf("RedactURL leaks the password: %s", got)
	}
	_, err := redisstore.NewClient(redisstore.Options{URL: "redis://user:s3cret@host:notaport/0"})
	if err != nil && strings.Contains(err.Error(), "s3cret") {
		t.Errorf("NewClient error leaks the password: %v", err)
	}
}

// Real fingerprints and digests, so that entries have the size they have in
// production (about 250 bytes: bench-redis.sh gives redis-benchmark the same).
var (
	benchFingerprint = "sha256:" + strings.Repeat("9e", 32)
	benchDigest      = "sha256:" + strings.Repeat("4d", 32)
)

// BenchmarkDecide measures decisions per second on a real server, one
// batch per call, with as many callers as GOMAXPROCS, as the consumer runs
// one per partition. Compare with redis-benchmark's pipelined SET on the
// same server: internal/testenv/scripts/bench-redis.sh runs both.
func BenchmarkDecide(b *testing.B) {
	addr := testenv.RedisAddr(b)
	c, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + addr + "/0", Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, batch := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			s := redisstore.New(c, freshPrefix())
			var seq atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				reqs := make([]dedupe.DecideRequest, batch)
				ctx := context.Background()
				for pb.Next() {
					for i := range reqs {
						reqs[i] = decideReq("9f8a2c1d-3e4f-4a5b-8c6d-"+strconv.FormatInt(1e11+seq.Add(1), 10), "host-7f9c-4411-1a2b3c4d/g12/coupon.claim.commands/3")
						reqs[i].Fingerprint, reqs[i].RulesDigest = benchFingerprint, benchDigest
						reqs[i].Owner.Source = "coupon.claim.commands/3/" + strconv.Itoa(i)
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

// A new key is written by SET NX in large batches and by decide.lua in
// small ones: both must store the same entry, or the script would misread
// what the fast path wrote.
func TestFastPathAndScriptStoreTheSameEntry(t *testing.T) {
	addr := testenv.RedisAddr(t)
	s := redisstore.New(client(t, addr), freshPrefix())
	ctx := context.Background()
	batch := make([]dedupe.DecideRequest, 20)
	for i := range batch {
		batch[i] = decideReq("fast-"+strconv.Itoa(i), "holder-x")
		batch[i].Intent = dedupe.Intent{Partition: 3, Floor: 99}
	}
	batch[19] = batch[0] // a later record of a key already in the batch
	decs, err := s.Decide(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if decs[0].Verdict != dedupe.VerdictFirst || decs[19].Verdict != dedupe.VerdictFirst || !decs[19].Resumed {
		t.Errorf("batch: %v, %v resumed=%v; want first, then the same record resumed", decs[0].Verdict, decs[19].Verdict, decs[19].Resumed)
	}
	single := decideReq("script-0", "holder-x")
	single.Intent = dedupe.Intent{Partition: 3, Floor: 99}
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{single}); err != nil {
		t.Fatal(err)
	}
	fast, _, err := s.Lookup(ctx, "p", "fast-1")
	if err != nil {
		t.Fatal(err)
	}
	scripted, _, err := s.Lookup(ctx, "p", "script-0")
	if err != nil {
		t.Fatal(err)
	}
	norm := func(e dedupe.Entry) dedupe.Entry {
		e.Key, e.WindowStart, e.LeaseUntil, e.ExpiresAt, e.Now = "", time.Time{}, time.Time{}, time.Time{}, time.Time{}
		return e
	}
	if norm(fast) != norm(scripted) {
		t.Errorf("entries differ:\nfast   %+v\nscript %+v", fast, scripted)
	}
	if d := fast.ExpiresAt.Sub(fast.WindowStart); d != time.Minute {
		t.Errorf("fast path window = %v, want 1m", d)
	}
	if d := fast.LeaseUntil.Sub(fast.WindowStart); d != 10*time.Second {
		t.Errorf("fast path lease = %v, want 10s", d)
	}
	// The script must read what the fast path wrote: a replay decides.
	other := decideReq("fast-1", "holder-y")
	other.Owner.Source = "in/1/7"
	other.Final = true
	if d, err := s.Decide(ctx, []dedupe.DecideRequest{other}); err != nil || d[0].Verdict != dedupe.VerdictReplay || d[0].Entry.Intent.Floor != 99 {
		t.Errorf("script on a fast-path entry: %+v %v", d, err)
	}
}

// The conformance suite on a real Redis Cluster of three masters: keys of
// one batch spread over slots, each script call stays in one slot.
func TestConformanceRedisCluster(t *testing.T) {
	addrs := testenv.StartRedisCluster(t)
	c, err := redisstore.NewClient(redisstore.Options{Addrs: addrs, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("addrs gave a %T, want a cluster client", c)
	}
	runFormats(t, c)
	// A batch large enough for the SET NX path of a single node, over
	// many slots. On a Cluster it must not take it: every entry's times
	// come from the clock of the master that holds it (decide.lua reads
	// its own), never from a TIME read on one node and written as
	// absolute expiries onto keys held by others.
	s := redisstore.New(c, freshPrefix())
	reqs := make([]dedupe.DecideRequest, 300)
	for i := range reqs {
		reqs[i] = decideReq("cluster-"+strconv.Itoa(i%150), "h-"+strconv.Itoa(i/150))
	}
	// Armed first (its markers are SET once per slot): the commands
	// counted are the decisions' own.
	if _, err := s.Decide(context.Background(), []dedupe.DecideRequest{decideReq("warm", "h")}); err != nil {
		t.Fatal(err)
	}
	cmds := &commandNames{}
	c.(*redis.ClusterClient).AddHook(cmds)
	decs, err := s.Decide(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	if n := cmds.count("time") + cmds.count("set"); n != 0 {
		t.Errorf("Decide on a Cluster sent %d TIME and %d SET commands of its own, want none (one clock per entry)", cmds.count("time"), cmds.count("set"))
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
	t.Run("CountFormats", func(t *testing.T) { checkCountFormats(t, c) })
}

// commandNames counts the commands a client sends, by name.
type commandNames struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *commandNames) add(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	for _, c := range cmds {
		h.n[strings.ToLower(c.Name())]++
	}
}

func (h *commandNames) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[name]
}

func (h *commandNames) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *commandNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}

func (h *commandNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.add(cmds...)
		return next(ctx, cmds)
	}
}

// ACL: a server that requires a password refuses a client without it, and
// decides for one with it (the password given apart from the URL, as
// store.redis.password_env does).
func TestPasswordProtectedServer(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{Password: "pw-7f3"})
	anon, _ := redisstore.NewClient(redisstore.Options{URL: "redis://" + srv.Addr + "/0", Timeout: time.Second})
	defer anon.Close()
	if _, err := redisstore.New(anon, "p").Decide(context.Background(), []dedupe.DecideRequest{decideReq("k", "h")}); err == nil {
		t.Error("a client without the password was answered")
	}
	authed, _ := redisstore.NewClient(redisstore.Options{URL: "redis://" + srv.Addr + "/0", Password: "pw-7f3", Timeout: time.Second})
	defer authed.Close()
	if d, err := redisstore.New(authed, "p").Decide(context.Background(), []dedupe.DecideRequest{decideReq("k", "h")}); err != nil || d[0].Verdict != dedupe.VerdictFirst {
		t.Errorf("with the password: %v %v", d, err)
	}
}

// The conformance suite through a Sentinel: the client asks it for the
// master of "mymaster".
func TestConformanceRedisSentinel(t *testing.T) {
	sentinel := testenv.StartRedisSentinel(t)
	c, err := redisstore.NewClient(redisstore.Options{Addrs: []string{sentinel}, MasterName: "mymaster", Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{Store: redisstore.New(c, freshPrefix()), Advance: time.Sleep}
	})
}

// TLS (rediss://): a client that trusts the server's CA decides; one that
// does not is refused, and the error says the store is unavailable.
func TestTLSServer(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{TLS: true})
	trusting, err := redisstore.NewClient(redisstore.Options{URL: "rediss://" + srv.Addr + "/0", CAFile: srv.CAFile, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer trusting.Close()
	if d, err := redisstore.New(trusting, "p").Decide(context.Background(), []dedupe.DecideRequest{decideReq("k", "h")}); err != nil || d[0].Verdict != dedupe.VerdictFirst {
		t.Fatalf("over TLS with the CA: %v %v", d, err)
	}
	doubting, _ := redisstore.NewClient(redisstore.Options{URL: "rediss://" + srv.Addr + "/0", Timeout: 2 * time.Second})
	defer doubting.Close()
	if _, err := redisstore.New(doubting, "p").Decide(context.Background(), []dedupe.DecideRequest{decideReq("k2", "h")}); !errors.Is(err, dedupe.ErrStoreUnavailable) {
		t.Errorf("a client without the CA: %v, want ErrStoreUnavailable", err)
	}
}

// serverCPU is the CPU time the Redis server has used (user + system).
func serverCPU(b *testing.B, c redis.UniversalClient) time.Duration {
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// BenchmarkServerCPUPerRecord is the Redis server's CPU per decided record
// on the consumer's path: a batch of 500 records (70% new keys, 30% copies
// of keys completed in the previous batch) decided, then its first copies
// completed. (The consumer's batches are up to 1,000 records now; 500
// keeps the figures comparable with earlier releases.) Redis is single-threaded: its CPU per record bounds the
// decisions one server can make. The client's CPU per record is reported
// too: where the consumer, the broker and Redis share cores, each µs of
// either is a µs the others lack.
//
// Its cases are the servers: redis-server (completions under WATCH), and
// Valkey 8.1 with SET … IFEQ and, for the comparison on the same server,
// without it.
func BenchmarkServerCPUPerRecord(b *testing.B) {
	compact := redisstore.WithCompactEntries()
	b.Run("redis", func(b *testing.B) { benchServerCPU(b, testenv.RedisAddr(b), false) })
	b.Run("redis-compact", func(b *testing.B) { benchServerCPU(b, testenv.RedisAddr(b), false, compact) })
	b.Run("valkey-set-ifeq", func(b *testing.B) { benchServerCPU(b, testenv.ValkeyAddr(b), false) })
	b.Run("valkey-set-ifeq-compact", func(b *testing.B) { benchServerCPU(b, testenv.ValkeyAddr(b), false, compact) })
	b.Run("valkey-watch", func(b *testing.B) { benchServerCPU(b, testenv.ValkeyAddr(b), true) })
}

func benchServerCPU(b *testing.B, addr string, noSetIfEq bool, opts ...redisstore.Option) {
	c, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + addr + "/0", Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s := redisstore.New(c, freshPrefix(), opts...)
	if noSetIfEq {
		redisstore.WithoutSetIfEq(s)
	}
	ctx := context.Background()
	const batch, fresh = 500, 350
	holder := "host-7f9c-4411-1a2b3c4d/g12/coupon.claim.commands/3"
	var prev []string
	seq := 0
	var cpu, decideCPU, completeCPU, clientDecide, clientComplete time.Duration
	completions := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		reqs := make([]dedupe.DecideRequest, 0, batch)
		var keys []string
		for len(reqs) < batch {
			var key string
			if len(reqs) < fresh || len(prev) == 0 {
				seq++
				key = "9f8a2c1d-3e4f-4a5b-8c6d-" + strconv.Itoa(100000000000+seq)
				keys = append(keys, key)
			} else {
				key = prev[len(reqs)%len(prev)]
			}
			r := decideReq(key, holder)
			r.Fingerprint, r.RulesDigest = benchFingerprint, benchDigest
			r.Owner.Source = "coupon.claim.commands/3/" + strconv.Itoa(seq*batch+len(reqs))
			r.Intent = dedupe.Intent{Partition: 2, Floor: int64(seq)}
			reqs = append(reqs, r)
		}
		before := serverCPU(b, c)
		start := processCPU(b)
		decs, err := s.Decide(ctx, reqs)
		if err != nil {
			b.Fatal(err)
		}
		clientDecide += processCPU(b) - start
		mid := serverCPU(b, c)
		decideCPU += mid - before
		var comps []dedupe.Completion
		for i, d := range decs {
			if d.Verdict == dedupe.VerdictFirst {
				comps = append(comps, dedupe.Completion{Namespace: "p", Key: reqs[i].Key, Owner: reqs[i].Owner,
					State: dedupe.Success, Result: dedupe.ResultRef{Partition: 2, Offset: int64(i)}})
			}
		}
		start = processCPU(b)
		if _, err := s.Complete(ctx, comps); err != nil {
			b.Fatal(err)
		}
		clientComplete += processCPU(b) - start
		after := serverCPU(b, c)
		cpu += after - before
		completeCPU += after - mid
		completions += len(comps)
		prev = keys
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*batch), "server-µs/record")
	b.ReportMetric(float64(decideCPU.Microseconds())/float64(b.N*batch), "decide-µs/record")
	b.ReportMetric(float64(completeCPU.Microseconds())/float64(max(completions, 1)), "complete-µs/first")
	b.ReportMetric(float64(clientDecide.Microseconds())/float64(b.N*batch), "client-decide-µs/record")
	b.ReportMetric(float64(clientComplete.Microseconds())/float64(max(completions, 1)), "client-complete-µs/first")
}

// processCPU is this process's CPU time (user and system, every thread):
// the client's side of a call, which the consumer pays on the same cores
// as the broker and Redis.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Batches of eight or more records decide existing keys from a plain GET
// where the decision changes nothing, and by decide.lua otherwise: every
// verdict and flag must be the reference table's (memstore applies
// decide.Decide), whatever the entry's state.
func TestBatchDecisionsMatchTheReferenceTable(t *testing.T) {
	addr := testenv.RedisAddr(t)
	stores := map[string]dedupe.Store{
		"redis":     redisstore.New(client(t, addr), freshPrefix()),
		"reference": memstore.New(),
	}
	const keys = 24
	req := func(k int, fp, holder, source string, final bool) dedupe.DecideRequest {
		r := decideReq(fmt.Sprintf("k%02d", k), holder)
		r.Window, r.Lease = 10*time.Minute, time.Minute
		r.Fingerprint, r.Owner.Source, r.Final = fp, source, final
		r.Intent = dedupe.Intent{Partition: 1, Floor: 10}
		return r
	}
	first := make([]dedupe.DecideRequest, keys)
	for k := range first {
		first[k] = req(k, "sha256:a", "holder-a", fmt.Sprintf("in/0/%d", k), false)
	}
	var comps []dedupe.Completion
	for k := range keys {
		switch k % 4 {
		case 0, 1:
			comps = append(comps, dedupe.Completion{Namespace: "p", Key: first[k].Key, Owner: first[k].Owner,
				State: dedupe.Success, Result: dedupe.ResultRef{Partition: 1, Offset: int64(k)}})
		case 2:
			comps = append(comps, dedupe.Completion{Namespace: "p", Key: first[k].Key, Owner: first[k].Owner,
				State: dedupe.Failed, FailedTTL: time.Minute})
		}
		// k%4 == 3 stays PENDING under holder-a.
	}
	var second []dedupe.DecideRequest
	for k := range keys {
		second = append(second,
			req(k, "sha256:a", "holder-b", fmt.Sprintf("in/1/%d", k), false),    // the same body elsewhere
			req(k, "sha256:b", "holder-b", fmt.Sprintf("in/1/%d", 100+k), true), // another body, after the wait
			req(k, "sha256:a", "holder-b", fmt.Sprintf("in/0/%d", k), true))     // the owner's own record
	}
	for k := keys; k < keys+6; k++ { // new keys, each with later copies in the same batch
		second = append(second,
			req(k, "sha256:a", "holder-b", fmt.Sprintf("in/1/%d", 200+k), false),
			req(k, "sha256:a", "holder-b", fmt.Sprintf("in/1/%d", 300+k), false),
			req(k, "sha256:c", "holder-b", fmt.Sprintf("in/1/%d", 400+k), false))
	}
	got := map[string][]dedupe.Decision{}
	for name, s := range stores {
		ctx := context.Background()
		if _, err := s.Decide(ctx, first); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(ctx, comps); err != nil {
			t.Fatal(err)
		}
		decs, err := s.Decide(ctx, second)
		if err != nil {
			t.Fatal(err)
		}
		got[name] = decs
	}
	for i, ref := range got["reference"] {
		d := got["redis"][i]
		if d.Verdict != ref.Verdict || d.Resumed != ref.Resumed || d.Rerun != ref.Rerun || d.Mismatch != ref.Mismatch ||
			d.RulesChanged != ref.RulesChanged || d.Entry.State != ref.Entry.State || d.Entry.Owner != ref.Entry.Owner ||
			d.Entry.Result != ref.Entry.Result {
			t.Errorf("record %d (%s from %s): redis %v %+v, reference %v %+v", i, second[i].Key, second[i].Owner.Source,
				d.Verdict, d, ref.Verdict, ref)
		}
	}
}

// The store's connections speak RESP2 (see NewClient), whether the
// server is given as a URL or as addresses, unless a URL asks for RESP3.
func TestClientsSpeakRESP2(t *testing.T) {
	addr := testenv.RedisAddr(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts redisstore.Options
		want string
	}{
		{"url", redisstore.Options{URL: "redis://" + addr + "/0"}, "resp=2"},
		{"addrs", redisstore.Options{Addrs: []string{addr}}, "resp=2"},
		{"url asking for RESP3", redisstore.Options{URL: "redis://" + addr + "/0?protocol=3"}, "resp=3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := redisstore.NewClient(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			info, err := c.Do(ctx, "CLIENT", "INFO").Text()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(strings.Fields(info), tc.want) {
				t.Errorf("CLIENT INFO: %s, want %s", info, tc.want)
			}
		})
	}
}
