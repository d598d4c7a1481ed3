package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
)

// storeOn is a Store on a client of its own, under a prefix that starts
// with name and no other run shares.
func storeOn(t *testing.T, opts *redis.Options, name string) (*Store, *redis.Client) {
	t.Helper()
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return New(c, fmt.Sprintf("%s%d", name, time.Now().UnixNano())), c
}

// pendingReq asks for key in namespace "p" as holder, for the record at
// offset of in/0, strict, with a one-minute window.
func pendingReq(key, holder string, offset int, lease time.Duration) dedupe.DecideRequest {
	return dedupe.DecideRequest{Namespace: "p", Key: key, Fingerprint: "sha256:a", RulesDigest: "sha256:r",
		Semantics: dedupe.Strict, Window: time.Minute, Lease: lease,
		Owner: dedupe.Owner{Holder: holder, Source: fmt.Sprintf("in/0/%d", offset)}, Intent: dedupe.Intent{Partition: 0, Floor: 0}}
}

// When another holder takes a key over between a transaction's read and
// its EXEC, EXEC must do nothing and complete.lua must decide the
// transaction's completions again: the taken key's completion is fenced,
// the others of its transaction and of the other transactions succeed.
// The transaction that fails shares its round trip with the next one's
// WATCH and reads on the same connection, which must go on unharmed; and
// n transactions on c connections take n+c round trips.
func TestCompleteFallsBackToTheScriptWhenAnEntryChanges(t *testing.T) {
	s, c := storeOn(t, &redis.Options{Addr: testenv.RedisAddr(t)}, "fallback")
	var roundTrips watchRoundTrips
	c.AddHook(&roundTrips)
	ctx := context.Background()
	const n = 6*watchChunk + 5 // seven transactions, on three connections
	var mine []dedupe.DecideRequest
	for i := range n {
		r := pendingReq(fmt.Sprintf("k%03d", i), "holder-a", i, time.Second)
		r.Intent.Partition = 1
		mine = append(mine, r)
	}
	if _, err := s.Decide(ctx, mine); err != nil {
		t.Fatal(err)
	}
	// In the fourth transaction: the first connection's second, whose
	// round trip carries the seventh's WATCH and reads.
	taken := mine[3*watchChunk+3]
	takenName := s.redisKey("p", taken.Key)
	var mu sync.Mutex
	var execs, takeovers int
	s.hooks.beforeExec = func(names []string) {
		mu.Lock()
		defer mu.Unlock()
		execs++
		if !slices.Contains(names, takenName) {
			return
		}
		// The lease ends, and another holder takes the key over.
		time.Sleep(time.Second + 50*time.Millisecond)
		r := taken
		r.Owner, r.Final = dedupe.Owner{Holder: "holder-b", Source: "in/1/7"}, true
		decs, err := s.Decide(ctx, []dedupe.DecideRequest{r})
		if err != nil || decs[0].Verdict != dedupe.VerdictFirst {
			t.Errorf("takeover: %v %+v", err, decs)
			return
		}
		takeovers++
	}
	var comps []dedupe.Completion
	for i, r := range mine {
		comps = append(comps, dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success,
			Result: dedupe.ResultRef{Partition: 1, Offset: int64(i)}})
	}
	roundTrips.n.Store(0)
	errs, err := s.Complete(ctx, comps)
	if err != nil {
		t.Fatal(err)
	}
	if execs != 7 || takeovers != 1 {
		t.Fatalf("%d transactions, %d takeovers; want 7 and 1", execs, takeovers)
	}
	if got, want := roundTrips.n.Load(), int64(7+watchParallel); got != want {
		t.Errorf("%d round trips with a WATCH or an EXEC, want %d", got, want)
	}
	for i, err := range errs {
		if fenced := comps[i].Key == taken.Key; fenced != errors.Is(err, dedupe.ErrFenced) || (!fenced && err != nil) {
			t.Errorf("completion of %s: %v, want fenced %v", comps[i].Key, err, fenced)
		}
		e, ok, err := s.Lookup(ctx, "p", comps[i].Key)
		if err != nil || !ok {
			t.Fatalf("lookup %s: %v %v", comps[i].Key, ok, err)
		}
		if comps[i].Key == taken.Key {
			if e.State != dedupe.Pending || e.Owner.Holder != "holder-b" {
				t.Errorf("taken key after the fallback: %+v, want PENDING by holder-b", e)
			}
		} else if e.State != dedupe.Success || e.Result.Offset != int64(i) {
			t.Errorf("%s: %+v, want SUCCESS at %d", comps[i].Key, e, i)
		}
	}
}

// A connection runs its transactions in a row without looking at the
// call's context, so the store must: a call cancelled during its first
// transactions writes no more than the ones whose round trips were under
// way, and leaves no WATCH behind.
func TestCompleteStopsBetweenTransactionsWhenItsContextEnds(t *testing.T) {
	s, c := storeOn(t, &redis.Options{Addr: testenv.RedisAddr(t), PoolSize: watchParallel}, "cancel")
	const n = 6*watchChunk + 5 // seven transactions, on three connections
	reqs, comps := watchedBatch(t, s, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.hooks.beforeExec = func([]string) { cancel() }
	if _, err := s.Complete(ctx, comps); !errors.Is(err, context.Canceled) {
		t.Fatalf("complete: %v, want the context's end", err)
	}
	done := 0
	for _, r := range reqs {
		e, ok, err := s.Lookup(context.Background(), "p", r.Key)
		if err != nil || !ok {
			t.Fatalf("lookup %s: %v %v", r.Key, ok, err)
		}
		if e.State == dedupe.Success {
			done++
		}
	}
	// Each connection may finish the transaction it was sending.
	if done > watchParallel*watchChunk {
		t.Errorf("%d completions written after the context ended, want at most %d", done, watchParallel*watchChunk)
	}
	assertNoWatchLeft(t, c, s, reqs)
}

// A transaction with nothing to write in the middle of a row (every
// completion in it refused) sends UNWATCH before the next one's WATCH:
// its keys changing afterwards must not make the next EXEC fail.
func TestCompleteUnwatchesATransactionWithNothingToWrite(t *testing.T) {
	s, c := storeOn(t, &redis.Options{Addr: testenv.RedisAddr(t)}, "midrow")
	var counts watchRoundTrips
	c.AddHook(&counts)
	other := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	defer other.Close()
	ctx := context.Background()
	const n = 6*watchChunk + 5
	reqs, comps := watchedBatch(t, s, n)
	// The fourth transaction, the first connection's second, is refused.
	for i := 3 * watchChunk; i < 4*watchChunk; i++ {
		comps[i].Owner = dedupe.Owner{Holder: "someone-else", Source: "in/9/9"}
	}
	refused := s.redisKey("p", comps[3*watchChunk].Key)
	var execs []string
	var mu sync.Mutex
	s.hooks.beforeExec = func(names []string) {
		mu.Lock()
		defer mu.Unlock()
		execs = append(execs, names[0])
		if names[0] == s.redisKey("p", comps[6*watchChunk].Key) {
			// Between the seventh's read and its EXEC, a key of the
			// refused transaction changes.
			if err := other.PExpire(ctx, refused, time.Hour).Err(); err != nil {
				t.Error(err)
			}
		}
	}
	errs, err := s.Complete(ctx, comps)
	if err != nil {
		t.Fatal(err)
	}
	if len(execs) != 6 {
		t.Errorf("%d transactions sent an EXEC, want 6", len(execs))
	}
	if n := counts.scripts.Load(); n != 0 {
		t.Errorf("%d script calls: an EXEC failed for a key its transaction never read", n)
	}
	for i, err := range errs {
		if refusedOne := i >= 3*watchChunk && i < 4*watchChunk; refusedOne != errors.Is(err, dedupe.ErrFenced) {
			t.Errorf("completion %d: %v, want fenced %v", i, err, refusedOne)
		}
	}
	assertNoWatchLeft(t, c, s, reqs)
}

// watchedBatch decides n keys for holder a (each on the SET NX path) and
// returns the requests and their completions as SUCCESS.
func watchedBatch(t *testing.T, s *Store, n int) ([]dedupe.DecideRequest, []dedupe.Completion) {
	t.Helper()
	var reqs []dedupe.DecideRequest
	for i := range n {
		reqs = append(reqs, pendingReq(fmt.Sprintf("k%03d", i), "holder-a", i, time.Minute))
	}
	if _, err := s.Decide(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	comps := make([]dedupe.Completion, n)
	for i, r := range reqs {
		comps[i] = dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success,
			Result: dedupe.ResultRef{Partition: 0, Offset: int64(i)}, KeepAtLeast: time.Minute}
	}
	return reqs, comps
}

// assertNoWatchLeft runs a transaction on every pooled connection of c
// after another client changed every key of reqs: a WATCH the store's
// completions left on a connection would fail it.
func assertNoWatchLeft(t *testing.T, c *redis.Client, s *Store, reqs []dedupe.DecideRequest) {
	t.Helper()
	ctx := context.Background()
	other := redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	defer other.Close()
	for _, r := range reqs {
		if err := other.PExpire(ctx, s.redisKey("p", r.Key), 2*time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	conns := make([]*redis.Conn, c.PoolStats().TotalConns)
	for i := range conns {
		conns[i] = c.Conn()
		defer conns[i].Close()
		_, err := conns[i].TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, s.redisKey("p", "unrelated"), "v", time.Minute)
			return nil
		})
		if errors.Is(err, redis.TxFailedErr) {
			t.Errorf("a WATCH stayed on pooled connection %d", i)
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// watchRoundTrips counts the round trips that carry a WATCH or an EXEC,
// and the scripts run.
type watchRoundTrips struct{ n, scripts atomic.Int64 }

func (h *watchRoundTrips) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *watchRoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *watchRoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		counted := false
		for _, c := range cmds {
			switch name := c.Name(); {
			case (name == "watch" || name == "exec") && !counted:
				h.n.Add(1)
				counted = true
			case name == "evalsha" || name == "eval":
				h.scripts.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A completion that the replica did not acknowledge is no completion, and
// neither is its retry while the replica still lacks it, whatever the
// size of the call and whichever connection the retry takes.
func TestCompleteRetryIsNotAcknowledgedWithoutTheReplica(t *testing.T) {
	master := testenv.StartRedis(t, testenv.RedisConfig{})
	proxy := testenv.StartReplicationProxy(t, master.Addr)
	replica := testenv.StartRedisReplica(t, proxy.Addr, testenv.RedisConfig{})
	testenv.WaitRedisInfo(t, master.Addr, "connected_slaves:1", 20*time.Second)
	testenv.WaitRedisInfo(t, replica.Addr, "master_link_status:up", 20*time.Second)
	for _, n := range []int{5, 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			prefix := fmt.Sprintf("unacked%d-%d", n, time.Now().UnixNano())
			// Each attempt on connections of its own: a retry may take
			// another connection than the write it repeats.
			store := func() *Store {
				c := redis.NewClient(&redis.Options{Addr: master.Addr, MaxRetries: -1})
				t.Cleanup(func() { c.Close() })
				return New(c, prefix, WithReplicas(1, 300*time.Millisecond))
			}
			s := store()
			ctx := context.Background()
			var reqs []dedupe.DecideRequest
			for i := range n {
				reqs = append(reqs, dedupe.DecideRequest{Namespace: "p", Key: fmt.Sprintf("k%03d", i), Fingerprint: "sha256:a",
					RulesDigest: "sha256:r", Semantics: dedupe.Strict, Window: time.Minute, Lease: time.Minute,
					Owner: dedupe.Owner{Holder: "holder-a", Source: fmt.Sprintf("in/0/%d", i)}})
			}
			if _, err := s.Decide(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			var comps []dedupe.Completion
			for i, r := range reqs {
				comps = append(comps, dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success,
					Result: dedupe.ResultRef{Partition: 1, Offset: int64(i)}})
			}
			proxy.Partition()
			defer proxy.Heal()
			for attempt := range 3 {
				_, err := store().Complete(ctx, comps)
				t.Logf("attempt %d: %v", attempt+1, err)
				if !errors.Is(err, dedupe.ErrNotReplicated) {
					t.Fatalf("attempt %d with the replica cut off: %v, want ErrNotReplicated", attempt+1, err)
				}
			}
			proxy.Heal()
			if _, err := store().Complete(ctx, comps); err != nil {
				t.Fatalf("after the link is back: %v", err)
			}
			onReplica, err := testenv.RedisCommand(replica.Addr, "GET", s.redisKey("p", "k000"))
			if err != nil || !strings.HasPrefix(onReplica, "SUCCESS") {
				t.Errorf("replica holds %.20q (%v), want SUCCESS", onReplica, err)
			}
		})
	}
}

// usersWithoutSet starts a Redis of its own and returns a client of its
// default user and one of a user that may run anything but SET.
func usersWithoutSet(t *testing.T) (admin, limited *redis.Client) {
	t.Helper()
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	if _, err := testenv.RedisCommand(srv.Addr, "ACL", "SETUSER", "nowrite", "on", ">pw", "~*", "+@all", "-set"); err != nil {
		t.Fatal(err)
	}
	admin = redis.NewClient(&redis.Options{Addr: srv.Addr})
	limited = redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "nowrite", Password: "pw"})
	t.Cleanup(func() { admin.Close(); limited.Close() })
	return admin, limited
}

// A user that may not SET is refused for good on the WATCH path too, not
// paused for ever behind EXECABORT.
func TestCompleteRefusedInTheTransactionIsFinal(t *testing.T) {
	admin, limited := usersWithoutSet(t)
	prefix := fmt.Sprintf("acl%d", time.Now().UnixNano())
	ctx := context.Background()
	var reqs []dedupe.DecideRequest
	var comps []dedupe.Completion
	for i := range 2 * fastPathMin {
		r := dedupe.DecideRequest{Namespace: "p", Key: fmt.Sprintf("k%02d", i), Fingerprint: "sha256:a", RulesDigest: "sha256:r",
			Semantics: dedupe.Strict, Window: time.Minute, Lease: time.Minute, Owner: dedupe.Owner{Holder: "h", Source: fmt.Sprintf("in/0/%d", i)}}
		reqs = append(reqs, r)
		comps = append(comps, dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success})
	}
	if _, err := New(admin, prefix).Decide(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	_, err := New(limited, prefix).Complete(ctx, comps)
	if err == nil || errors.Is(err, dedupe.ErrStoreUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Complete by a user without SET: %v, want a final NOPERM refusal", err)
	}
}

// A script whose command the user may not run is refused for good too:
// Redis words that refusal inside a script without NOPERM (7.0: "The user
// executing the script can't run this command"; 7.2: "ACL failure in
// script"), and a pipeline that took it for a passing error would pause
// for ever.
func TestScriptRefusedByTheACLIsFinal(t *testing.T) {
	admin, limited := usersWithoutSet(t)
	prefix := fmt.Sprintf("aclscript%d", time.Now().UnixNano())
	ctx := context.Background()
	// Another user's store armed the marker, which the limited user's
	// store only reads; fewer records than the SET NX path takes go to
	// decide.lua.
	if _, err := New(admin, prefix).Decide(ctx, []dedupe.DecideRequest{pendingReq("first", "h", 0, time.Minute)}); err != nil {
		t.Fatal(err)
	}
	var reqs []dedupe.DecideRequest
	for i := range fastPathMin - 1 {
		reqs = append(reqs, pendingReq(fmt.Sprintf("k%d", i), "h", i, time.Minute))
	}
	_, err := New(limited, prefix).Decide(ctx, reqs)
	if err == nil || errors.Is(err, dedupe.ErrStoreUnavailable) ||
		!(strings.Contains(err.Error(), "can't run this command") || strings.Contains(err.Error(), "ACL failure in script")) {
		t.Fatalf("decide.lua refused its SET: %v, want a final refusal", err)
	}
}

// Namespaces that contain ':' can give two keys one Redis name. A call
// that completes both, in either order, fences the one the entry does not
// hold and finishes the other, as complete.lua does, and never crashes.
func TestCompleteOfTwoKeysUnderOneName(t *testing.T) {
	addr := testenv.RedisAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for _, foreignFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("foreign first ", foreignFirst), func(t *testing.T) {
			s := New(c, fmt.Sprintf("samename%d", time.Now().UnixNano()))
			if s.redisKey("p", "a:b") != s.redisKey("p:a", "b") {
				t.Fatal("the two keys do not share a name: the test proves nothing")
			}
			ctx := context.Background()
			owner := dedupe.Owner{Holder: "h", Source: "in/0/1"}
			reqs := []dedupe.DecideRequest{{Namespace: "p", Key: "a:b", Fingerprint: "sha256:a", RulesDigest: "sha256:r",
				Semantics: dedupe.Strict, Window: time.Minute, Lease: time.Minute, Owner: owner}}
			for i := range fastPathMin {
				reqs = append(reqs, dedupe.DecideRequest{Namespace: "p", Key: fmt.Sprintf("k%d", i), Fingerprint: "sha256:a",
					RulesDigest: "sha256:r", Semantics: dedupe.Strict, Window: time.Minute, Lease: time.Minute,
					Owner: dedupe.Owner{Holder: "h", Source: fmt.Sprintf("in/0/%d", 10+i)}})
			}
			if _, err := s.Decide(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			var comps []dedupe.Completion
			for _, r := range reqs {
				comps = append(comps, dedupe.Completion{Namespace: r.Namespace, Key: r.Key, Owner: r.Owner, State: dedupe.Success})
			}
			foreign := dedupe.Completion{Namespace: "p:a", Key: "b", Owner: owner, State: dedupe.Success}
			if foreignFirst {
				comps = append([]dedupe.Completion{foreign}, comps...)
			} else {
				comps = append(comps, foreign)
			}
			errs, err := s.Complete(ctx, comps)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range comps {
				if fenced := c.Namespace == "p:a"; fenced != errors.Is(errs[i], dedupe.ErrFenced) || (!fenced && errs[i] != nil) {
					t.Errorf("completion of %s/%s: %v, want fenced %v", c.Namespace, c.Key, errs[i], fenced)
				}
			}
			if e, ok, err := s.Lookup(ctx, "p", "a:b"); err != nil || !ok || e.State != dedupe.Success {
				t.Errorf("a:b after the call: %+v %v %v, want SUCCESS", e, ok, err)
			}
		})
	}
}

// The WATCH of a completion travels with its reads, so the store itself
// must make sure none stays on a connection it returns to the pool: when
// no EXEC runs (every completion refused, nothing to write) it sends
// UNWATCH. A WATCH left behind would make the next transaction on that
// connection fail for a key it never read.
func TestCompleteLeavesNoWatchOnItsConnection(t *testing.T) {
	addr := testenv.RedisAddr(t)
	s, c := storeOn(t, &redis.Options{Addr: addr, PoolSize: 1}, "unwatch") // one connection: the next user gets it
	other := redis.NewClient(&redis.Options{Addr: addr})
	defer other.Close()
	ctx := context.Background()
	var reqs []dedupe.DecideRequest
	for i := range fastPathMin + 2 {
		reqs = append(reqs, pendingReq(fmt.Sprintf("k%d", i), "a", i, time.Minute))
	}
	for _, tc := range []struct {
		name  string
		owner func(i int) dedupe.Owner
	}{
		{"every completion refused (no EXEC)", func(int) dedupe.Owner { return dedupe.Owner{Holder: "b", Source: "in/9/9"} }},
		{"every completion written (EXEC)", func(i int) dedupe.Owner { return reqs[i].Owner }},
	} {
		if _, err := s.Decide(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		comps := make([]dedupe.Completion, len(reqs))
		for i, r := range reqs {
			comps[i] = dedupe.Completion{Namespace: "p", Key: r.Key, Owner: tc.owner(i), State: dedupe.Success,
				Result: dedupe.ResultRef{Partition: 0, Offset: int64(i)}, KeepAtLeast: time.Minute}
		}
		if _, err := s.Complete(ctx, comps); err != nil {
			t.Fatal(err)
		}
		// Another client changes an entry the completion watched; a
		// transaction that watches nothing, on the pooled connection,
		// must still run.
		if err := other.Set(ctx, s.redisKey("p", "k3"), "changed", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		err := c.Watch(ctx, func(tx *redis.Tx) error {
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, s.redisKey("p", "unrelated"), "v", time.Minute)
				return nil
			})
			return err
		})
		if errors.Is(err, redis.TxFailedErr) {
			t.Errorf("%s: a WATCH stayed on the pooled connection", tc.name)
		} else if err != nil {
			t.Fatal(err)
		}
		if err := other.Del(ctx, s.redisKey("p", "k3")).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Every record of one key in one Decide call is decided against one state
// of its entry. Here the first record of K is decided from a read (a
// replay against its holder's PENDING entry), then the owner completes K
// as FAILED, and the read grows too old for K's later record, which goes
// to the script: the read's decision must go with it, so that the earlier
// record is the rerun and the later one its replay, not the other way
// round.
func TestDecideKeepsAKeysRecordsOnOneState(t *testing.T) {
	s, _ := storeOn(t, &redis.Options{Addr: testenv.RedisAddr(t)}, "onestate")
	ctx := context.Background()
	req := func(key string, offset int) dedupe.DecideRequest { return pendingReq(key, "h", offset, time.Minute) }
	first := req("K", 1)
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{first}); err != nil {
		t.Fatal(err)
	}
	batch := []dedupe.DecideRequest{req("K", 2), req("K", 3)}
	for i := range fastPathMin {
		batch = append(batch, req(fmt.Sprintf("x%d", i), 10+i))
	}
	s.hooks.afterDecideRead = func() {
		errs, err := s.Complete(ctx, []dedupe.Completion{{Namespace: "p", Key: "K", Owner: first.Owner, State: dedupe.Failed,
			Result: dedupe.ResultRef{Partition: -1, Offset: dedupe.NoPosition}, FailedTTL: time.Minute}})
		if err != nil || errs[0] != nil {
			t.Errorf("complete K as FAILED: %v %v", err, errs)
		}
		time.Sleep(readMargin/2 + 50*time.Millisecond) // the read is now too old for K's later record
	}
	decs, err := s.Decide(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if decs[0].Verdict != dedupe.VerdictFirst || decs[1].Verdict != dedupe.VerdictReplay {
		t.Errorf("K at offsets 2 and 3: %s, %s; want first (the rerun of FAILED), then replay", decs[0].Verdict, decs[1].Verdict)
	}
}

// passHook passes every call on; the test hooks below embed it and
// replace what they watch.
type passHook struct{}

func (passHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (passHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (passHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// pipelineSizes records the commands of every pipeline of SETs a client
// sends (not those of connection set-up), and how many were in flight at
// once. Each waits a little before it is sent, so that pipelines sent
// side by side are seen in flight together.
type pipelineSizes struct {
	passHook
	mu                  sync.Mutex
	sizes               []int
	inFlight, maxFlight int
}

func (h *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "set" {
			return next(ctx, cmds)
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, len(cmds))
		h.inFlight++
		h.maxFlight = max(h.maxFlight, h.inFlight)
		h.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		err := next(ctx, cmds)
		h.mu.Lock()
		h.inFlight--
		h.mu.Unlock()
		return err
	}
}

// A batch of new keys larger than pipelineChunk is decided in round trips
// of at most pipelineChunk commands, sent side by side, and every record
// is decided as in one round trip: each new key first, a later copy of a
// key in another chunk's range a replay.
func TestDecideSendsLargeBatchesInChunks(t *testing.T) {
	s, c := storeOn(t, &redis.Options{Addr: testenv.RedisAddr(t)}, "chunks")
	ctx := context.Background()
	// Armed first: the round trips counted are the decisions' own.
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{pendingReq("warm", "holder-a", 0, time.Minute)}); err != nil {
		t.Fatal(err)
	}
	hook := &pipelineSizes{}
	c.AddHook(hook)
	const keys = 2*pipelineChunk + 100
	const copyAt = pipelineChunk + 88 // in the second chunk's range
	var reqs []dedupe.DecideRequest
	for i := range keys {
		if i == copyAt {
			r := pendingReq("k0000", "holder-a", keys, time.Minute)
			reqs = append(reqs, r)
		}
		reqs = append(reqs, pendingReq(fmt.Sprintf("k%04d", i), "holder-a", i, time.Minute))
	}
	decs, err := s.Decide(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range decs {
		want := dedupe.VerdictFirst
		if i == copyAt {
			want = dedupe.VerdictReplay
		}
		if d.Verdict != want {
			t.Fatalf("record %d (%s): %v, want %v", i, reqs[i].Key, d.Verdict, want)
		}
	}
	hook.mu.Lock()
	sizes, maxFlight := slices.Clone(hook.sizes), hook.maxFlight
	hook.mu.Unlock()
	slices.Sort(sizes)
	// Each chunk reads the generation marker behind its writes.
	if want := []int{100 + 1, pipelineChunk + 1, pipelineChunk + 1}; !slices.Equal(sizes, want) {
		t.Errorf("pipelines of %v commands, want %v", sizes, want)
	}
	if maxFlight < 2 {
		t.Errorf("at most %d pipeline in flight at once, want them side by side", maxFlight)
	}
	// Every entry exists, as its first record's decision made it.
	for i, r := range reqs {
		if i == copyAt {
			continue
		}
		e, ok, err := s.Lookup(ctx, "p", r.Key)
		if err != nil || !ok || e.State != dedupe.Pending || e.Owner != r.Owner {
			t.Fatalf("entry of record %d: %+v, found %v, %v", i, e, ok, err)
		}
	}
}

// waitHook makes the first pipeline that ends in a WAIT arrive late and
// reports its WAIT as acknowledged; the others keep the server's answer.
type waitHook struct {
	passHook
	first atomic.Bool
	delay time.Duration
}

func (h *waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		last := cmds[len(cmds)-1]
		if last.Name() != "wait" || !h.first.CompareAndSwap(false, true) {
			return next(ctx, cmds)
		}
		time.Sleep(h.delay)
		err := next(ctx, cmds)
		if c, ok := last.(*redis.Cmd); ok && c.Err() == nil {
			c.SetVal(int64(1))
		}
		return err
	}
}

// A batch decided in several round trips records its replica
// acknowledgement once: one chunk short of replicas keeps /readyz
// unready even when another chunk's acknowledgement comes after it.
func TestChunksReportAShortAcknowledgementOnce(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	// No replicas: every real WAIT falls short.
	s := New(c, fmt.Sprintf("acks%d", time.Now().UnixNano()), WithReplicas(1, 20*time.Millisecond))
	c.AddHook(&waitHook{delay: 300 * time.Millisecond})
	reqs := make([]dedupe.DecideRequest, 2*pipelineChunk+50)
	for i := range reqs {
		reqs[i] = pendingReq(fmt.Sprintf("k%04d", i), "holder-a", i, time.Minute)
	}
	_, err := s.Decide(context.Background(), reqs)
	if !errors.Is(err, dedupe.ErrNotReplicated) {
		t.Fatalf("Decide: %v, want ErrNotReplicated", err)
	}
	if err := s.ReplicaAckError(); !errors.Is(err, dedupe.ErrNotReplicated) {
		t.Errorf("ReplicaAckError after a short chunk: %v, want ErrNotReplicated", err)
	}
}

// infoFails fails every INFO: the probe of a node's acknowledgement mode.
type infoFails struct{ passHook }

func (infoFails) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "info" {
			err := errors.New("i/o timeout (injected)")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// When a node's acknowledgement mode cannot be read, its commands are not
// sent, and each of them says so: on a cluster that node's error is
// joined with other nodes' redis.Nil (a SET NX that found its key), and a
// command without an error would pass for a write that was made.
func TestUnsentCommandsCarryTheError(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	c.AddHook(infoFails{})
	s := New(c, fmt.Sprintf("unsent%d", time.Now().UnixNano()), WithReplicas(1, 20*time.Millisecond))
	ctx := context.Background()
	cmds := []redis.Cmder{
		redis.NewCmd(ctx, "SET", s.redisKey("p", "a"), "v", "NX"),
		redis.NewCmd(ctx, "SET", s.redisKey("p", "b"), "v", "NX"),
	}
	execErr, _, acked := s.nodeRoundTrip(ctx, "decide", c, cmds)
	if execErr == nil || acked {
		t.Fatalf("nodeRoundTrip: %v, acked %v; want an error", execErr, acked)
	}
	for i, cmd := range cmds {
		if cmd.Err() == nil {
			t.Errorf("command %d: no error, though it was not sent", i)
		}
	}
	if n, err := c.Exists(ctx, s.redisKey("p", "a"), s.redisKey("p", "b")).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS: %d, %v; want nothing written", n, err)
	}
}
