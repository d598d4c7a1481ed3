package redisstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
)

// commandCalls is how many times the server at addr ran each command.
func commandCalls(t *testing.T, addr string) map[string]int {
	t.Helper()
	stats, err := testenv.RedisCommand(addr, "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, m := range regexp.MustCompile(`cmdstat_([a-z|]+):calls=(\d+)`).FindAllStringSubmatch(stats, -1) {
		calls[m[1]], _ = strconv.Atoi(m[2])
	}
	return calls
}

// mixedBatch decides n keys as holder-a and returns completions of every
// kind for them: SUCCESS, FAILED, a release, and a completion under
// another owner's token (fenced), with what Lookup must show after each.
func mixedBatch(t *testing.T, s *Store, n int) ([]dedupe.Completion, []dedupe.State) {
	t.Helper()
	ctx := context.Background()
	var reqs []dedupe.DecideRequest
	for i := range n {
		reqs = append(reqs, pendingReq(fmt.Sprintf("m%03d", i), "holder-a", i, time.Minute))
	}
	if _, err := s.Decide(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	var comps []dedupe.Completion
	var want []dedupe.State
	for i, r := range reqs {
		c := dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success,
			Result: dedupe.ResultRef{Partition: 0, Offset: int64(i)}, FailedTTL: time.Minute}
		st := dedupe.Success
		switch i % 10 {
		case 7:
			c.State, st = dedupe.Failed, dedupe.Failed
		case 8:
			c.State, st = dedupe.Pending, dedupe.Pending
		case 9:
			c.Owner.Holder, st = "holder-z", dedupe.Pending
		}
		comps, want = append(comps, c), append(want, st)
	}
	return comps, want
}

func checkMixed(t *testing.T, s *Store, comps []dedupe.Completion, want []dedupe.State, errs []error) {
	t.Helper()
	for i, c := range comps {
		fenced := c.Owner.Holder == "holder-z"
		if fenced != errors.Is(errs[i], dedupe.ErrFenced) || (!fenced && errs[i] != nil) {
			t.Errorf("completion %d (%s as %s): %v, want fenced %v", i, c.State, c.Owner.Holder, errs[i], fenced)
		}
		e, ok, err := s.Lookup(context.Background(), "p", c.Key)
		if err != nil || !ok {
			t.Fatalf("lookup %s: %v %v", c.Key, ok, err)
		}
		if e.State != want[i] || e.Owner.Holder != "holder-a" || (want[i] == dedupe.Success && e.Result.Offset != int64(i)) {
			t.Errorf("%s after completion %d: %s by %s at %d, want %s", c.Key, i, e.State, e.Owner.Holder, e.Result.Offset, want[i])
		}
		if c.State == dedupe.Pending && e.LeaseUntil.After(e.Now) {
			t.Errorf("%s: released, but its lease runs until %v (now %v)", c.Key, e.LeaseUntil, e.Now)
		}
	}
}

// On a server with SET … IFEQ a batch is finished with it, without WATCH
// or MULTI/EXEC, and every kind of completion ends as decide.Complete
// says.
func TestCompleteUsesSetIfEqWhereTheServerHasIt(t *testing.T) {
	addr := testenv.ValkeyAddr(t)
	s, _ := storeOn(t, &redis.Options{Addr: addr}, "cas")
	comps, want := mixedBatch(t, s, 3*casChunk+5)
	before := commandCalls(t, addr)
	errs, err := s.Complete(context.Background(), comps)
	if err != nil {
		t.Fatal(err)
	}
	after := commandCalls(t, addr)
	if casState(s.cas.Load()) != casSupported {
		t.Fatalf("the store did not find SET IFEQ on %s", addr)
	}
	if after["watch"] != before["watch"] || after["exec"] != before["exec"] || after["evalsha"] != before["evalsha"] {
		t.Errorf("completed with WATCH %d, EXEC %d, EVALSHA %d; want none", after["watch"]-before["watch"],
			after["exec"]-before["exec"], after["evalsha"]-before["evalsha"])
	}
	// Every completion but the fenced ones writes its entry.
	if sets, want := after["set"]-before["set"], len(comps)-len(comps)/10; sets < want {
		t.Errorf("%d SETs for %d entries that change", sets, want)
	}
	checkMixed(t, s, comps, want, errs)
	for _, c := range comps {
		e, _, err := s.Lookup(context.Background(), "p", c.Key)
		if err != nil {
			t.Fatal(err)
		}
		checkExpiry(t, s, addr, c.Key, e)
	}
}

// checkExpiry checks that key's entry e expires when its state asks
// (RetainUntil), as every other writer of an entry sets it.
func checkExpiry(t *testing.T, s *Store, addr, key string, e dedupe.Entry) {
	t.Helper()
	pttl, err := testenv.RedisCommand(addr, "PTTL", s.redisKey("p", key))
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := strconv.ParseInt(pttl, 10, 64)
	if wantMs := e.RetainUntil().Sub(e.Now).Milliseconds(); ms < wantMs-2000 || ms > wantMs+2000 {
		t.Errorf("%s (%s): PTTL %d ms, want about %d", key, e.State, ms, wantMs)
	}
}

// A SET … IFEQ the server refuses for another reason than the entry's
// change (here WRONGTYPE; OOM, READONLY and NOPERM alike) fails the call,
// as a refused EXEC does, even when an earlier SET of its round trip
// found its entry changed.
func TestCompleteWithSetIfEqFailsOnARefusal(t *testing.T) {
	addr := testenv.ValkeyAddr(t)
	s, _ := storeOn(t, &redis.Options{Addr: addr}, "casrefused")
	ctx := context.Background()
	var reqs []dedupe.DecideRequest
	var comps []dedupe.Completion
	for i := range 10 {
		r := pendingReq(fmt.Sprintf("k%03d", i), "holder-a", i, time.Minute)
		reqs = append(reqs, r)
		comps = append(comps, dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success,
			Result: dedupe.ResultRef{Partition: 0, Offset: int64(i)}})
	}
	if _, err := s.Decide(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	s.hooks.beforeCAS = func([]string) {
		renew := reqs[0]
		renew.RenewOnly = true
		if _, err := s.Decide(ctx, []dedupe.DecideRequest{renew}); err != nil {
			t.Error(err)
		}
		name := s.redisKey("p", reqs[1].Key)
		if _, err := testenv.RedisCommand(addr, "DEL", name); err != nil {
			t.Error(err)
		}
		if _, err := testenv.RedisCommand(addr, "RPUSH", name, "not an entry"); err != nil {
			t.Error(err)
		}
	}
	if _, err := s.Complete(ctx, comps); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Complete over an entry that became a list: %v; want the refusal", err)
	}
}

// When another holder takes a key over between the read and its SET …
// IFEQ, that SET writes nothing and complete.lua decides the key's
// completion again: fenced, while the others of the batch succeed.
func TestCompleteWithSetIfEqFallsBackWhenAnEntryChanges(t *testing.T) {
	addr := testenv.ValkeyAddr(t)
	s, _ := storeOn(t, &redis.Options{Addr: addr}, "casfallback")
	ctx := context.Background()
	mine := decideKeys(t, s, casChunk+9, time.Second)
	taken := mine[casChunk+2]
	var mu sync.Mutex
	reads, takeovers, polls := 0, 0, 0
	s.hooks.beforeCAS = func(names []string) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if !slices.Contains(names, s.redisKey("p", taken.Key)) {
			return
		}
		_, polls = takeOver(t, s, taken, "holder-b")
		takeovers++
	}
	comps := successes(mine)
	// decide.lua and complete.lua loaded before the count: a first
	// EVALSHA that answers NOSCRIPT counts as a call too.
	loadReq := pendingReq("load", "holder-c", 999, time.Minute)
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{loadReq}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Complete(ctx, []dedupe.Completion{{Namespace: "p", Key: loadReq.Key, Owner: loadReq.Owner, State: dedupe.Pending}}); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, addr)
	errs, err := s.Complete(ctx, comps)
	if err != nil {
		t.Fatal(err)
	}
	// Each of the other holder's polls is one decide.lua call; the taken
	// key's completion is one more: nothing else goes to a script.
	if scripts := commandCalls(t, addr)["evalsha"] - before["evalsha"]; scripts != polls+1 {
		t.Errorf("%d script calls, want %d (the other holder's %d decisions, the taken key's completion)", scripts, polls+1, polls)
	}
	if reads != 1 || takeovers != 1 {
		t.Fatalf("%d reads, %d takeovers; want 1 and 1", reads, takeovers)
	}
	for i, c := range comps {
		e, ok, err := s.Lookup(ctx, "p", c.Key)
		if err != nil || !ok {
			t.Fatalf("lookup %s: %v %v", c.Key, ok, err)
		}
		if c.Key == taken.Key {
			if !errors.Is(errs[i], dedupe.ErrFenced) || e.State != dedupe.Pending || e.Owner.Holder != "holder-b" {
				t.Errorf("taken key: %v, %s by %s; want fenced, PENDING by holder-b", errs[i], e.State, e.Owner.Holder)
			}
		} else if errs[i] != nil || e.State != dedupe.Success || e.Result.Offset != int64(i) {
			t.Errorf("%s: %v, %s at %d; want SUCCESS at %d", c.Key, errs[i], e.State, e.Result.Offset, i)
		}
	}
}

// A server without SET … IFEQ (Redis before 8.4) is asked once, and its
// batches are finished under WATCH. After a failover to such a server from
// one that had it, every SET … IFEQ is refused as it is parsed, complete.lua
// finishes the batch, and the next goes under WATCH.
func TestCompleteWithoutSetIfEqUsesWatch(t *testing.T) {
	addr := testenv.RedisAddr(t)
	if info, err := testenv.RedisCommand(addr, "SET", "probe-"+strconv.FormatInt(time.Now().UnixNano(), 10), "x", "IFEQ", "y"); err == nil {
		t.Skipf("this server has SET IFEQ (%q)", info)
	}
	for name, known := range map[string]casState{"asked": casUnknown, "after a failover": casSupported} {
		t.Run(name, func(t *testing.T) {
			s, _ := storeOn(t, &redis.Options{Addr: addr}, "nocas")
			s.cas.Store(int32(known))
			comps, want := mixedBatch(t, s, 2*watchChunk+3)
			before := commandCalls(t, addr)
			errs, err := s.Complete(context.Background(), comps)
			if err != nil {
				t.Fatal(err)
			}
			after := commandCalls(t, addr)
			if casState(s.cas.Load()) != casUnsupported {
				t.Errorf("the store takes SET IFEQ for supported on %s", addr)
			}
			if known == casUnknown && after["watch"]-before["watch"] < 3 {
				t.Errorf("%d WATCH for three transactions", after["watch"]-before["watch"])
			}
			if known == casSupported && (after["watch"] != before["watch"] || after["evalsha"] == before["evalsha"]) {
				// Every SET … IFEQ was refused: complete.lua finished them.
				t.Errorf("%d WATCH and %d script calls after the refusal; want none and some",
					after["watch"]-before["watch"], after["evalsha"]-before["evalsha"])
			}
			checkMixed(t, s, comps, want, errs)
		})
	}
}

// casStoreOn is a store on the Valkey of the tests that has found SET …
// IFEQ, so that its Decide remembers what its SET NX writes, and whose
// scripts are loaded.
func casStoreOn(t *testing.T, name string) (*Store, string) {
	t.Helper()
	addr := testenv.ValkeyAddr(t)
	s, c := storeOn(t, &redis.Options{Addr: addr}, name)
	if !s.hasCAS(context.Background(), c) {
		t.Fatalf("the store did not find SET IFEQ on %s", addr)
	}
	// The scripts loaded before any count: a first EVALSHA that answers
	// NOSCRIPT counts as a call too.
	for _, script := range []*redis.Script{decideScript, completeScript} {
		if err := s.loadScript(context.Background(), script); err != nil {
			t.Fatal(err)
		}
	}
	return s, addr
}

// callsDuring is how many times the server at addr ran each command while
// fn ran.
func callsDuring(t *testing.T, addr string, fn func()) map[string]int {
	t.Helper()
	before := commandCalls(t, addr)
	fn()
	after := commandCalls(t, addr)
	for cmd := range after {
		after[cmd] -= before[cmd]
	}
	return after
}

// A batch decided by this store's SET NX is finished with SET … IFEQ
// against the entries the SET NX wrote: its read is the server's clock
// alone, and every kind of completion ends as on the entries read.
func TestCompleteWithSetIfEqComparesWithWhatDecideWrote(t *testing.T) {
	s, addr := casStoreOn(t, "caskept")
	comps, want := mixedBatch(t, s, 3*casChunk+5)
	// Without the completions under another holder's token: those are
	// read (TestCompleteWithSetIfEqReadsWhatItWouldFence).
	var mine []dedupe.Completion
	var wantMine []dedupe.State
	for i, c := range comps {
		if c.Owner.Holder != "holder-z" {
			mine, wantMine = append(mine, c), append(wantMine, want[i])
		}
	}
	// What is remembered of each entry is what its bytes decode to.
	for name, w := range s.written.cur {
		e, err := decodeEntry(w.entry.Now.UnixMilli(), w.raw, s.readContext(name, w.entry.Owner.Holder, w.entry.RulesDigest, w.entry.Owner.Source))
		if err != nil || e != w.entry {
			t.Errorf("%s: remembered %+v, its bytes decode to %+v (%v)", name, w.entry, e, err)
		}
	}
	if len(s.written.cur) != len(comps) {
		t.Errorf("%d entries remembered for %d decided", len(s.written.cur), len(comps))
	}
	var errs []error
	calls := callsDuring(t, addr, func() {
		var err error
		if errs, err = s.Complete(context.Background(), mine); err != nil {
			t.Fatal(err)
		}
	})
	if calls["mget"] != 0 || calls["time"] != 1 || calls["watch"] != 0 || calls["evalsha"] != 0 {
		t.Errorf("completed with MGET %d, TIME %d, WATCH %d, EVALSHA %d; want one TIME and none of the others",
			calls["mget"], calls["time"], calls["watch"], calls["evalsha"])
	}
	if calls["set"] != len(mine) {
		t.Errorf("%d SETs for %d entries that change", calls["set"], len(mine))
	}
	for i, c := range mine {
		if errs[i] != nil {
			t.Errorf("completion %d (%s): %v", i, c.State, errs[i])
		}
		e, ok, err := s.Lookup(context.Background(), "p", c.Key)
		if err != nil || !ok {
			t.Fatalf("lookup %s: %v %v", c.Key, ok, err)
		}
		if e.State != wantMine[i] || e.Owner != c.Owner || (c.State != dedupe.Pending && e.Result != c.Result) {
			t.Errorf("%s: %s by %s at %v, want %s by %s at %v", c.Key, e.State, e.Owner.Token(), e.Result, wantMine[i], c.Owner.Token(), c.Result)
		}
		if c.State == dedupe.Pending && e.LeaseUntil.After(e.Now) {
			t.Errorf("%s: released, but its lease runs until %v (now %v)", c.Key, e.LeaseUntil, e.Now)
		}
		if c.State == dedupe.Failed && !e.ExpiresAt.After(e.Now.Add(c.FailedTTL-5*time.Second)) {
			t.Errorf("%s: FAILED until %v, want about %v past %v", c.Key, e.ExpiresAt, c.FailedTTL, e.Now)
		}
		checkExpiry(t, s, addr, c.Key, e)
	}
}

// What Decide wrote is not the entry any more when another holder took
// the key over, the owner renewed its lease, or the entry is gone (here
// through another Store on the same server, so that this one still
// remembers what it wrote): each such SET … IFEQ writes nothing and
// complete.lua decides the key's completion on what it finds, while the
// others of the batch succeed without a read of their entries.
func TestCompleteWithSetIfEqChecksWhatDecideWrote(t *testing.T) {
	s, addr := casStoreOn(t, "caschanged")
	other := sameStore(t, s, addr)
	ctx := context.Background()
	reqs := decideKeys(t, s, casChunk+9, time.Second)
	taken, renewed, gone := reqs[2], reqs[5], reqs[7]
	takeOver(t, other, taken, "holder-b")
	// The others' leases ended too: renew one as its owner (its entry is
	// rewritten) and take another away.
	renew := renewed
	renew.RenewOnly = true
	if _, err := other.Decide(ctx, []dedupe.DecideRequest{renew}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.RedisCommand(addr, "DEL", s.redisKey("p", gone.Key)); err != nil {
		t.Fatal(err)
	}
	comps := successes(reqs)
	var errs []error
	calls := callsDuring(t, addr, func() {
		var err error
		if errs, err = s.Complete(ctx, comps); err != nil {
			t.Fatal(err)
		}
	})
	// One script call for the three changed keys, no read of an entry.
	if calls["evalsha"] != 1 || calls["mget"] != 0 {
		t.Errorf("%d script calls and %d MGET; want 1 and none", calls["evalsha"], calls["mget"])
	}
	for i, c := range comps {
		e, ok, err := s.Lookup(ctx, "p", c.Key)
		if err != nil {
			t.Fatal(err)
		}
		switch c.Key {
		case taken.Key:
			if !errors.Is(errs[i], dedupe.ErrFenced) || e.State != dedupe.Pending || e.Owner.Holder != "holder-b" {
				t.Errorf("taken key: %v, %s by %s; want fenced, PENDING by holder-b", errs[i], e.State, e.Owner.Holder)
			}
		case gone.Key:
			if !errors.Is(errs[i], dedupe.ErrFenced) || ok {
				t.Errorf("gone key: %v, found %v; want fenced, no entry", errs[i], ok)
			}
		default:
			if errs[i] != nil || !ok || e.State != dedupe.Success || e.Owner != c.Owner || e.Result.Offset != int64(i) {
				t.Errorf("%s: %v, %s by %s at %d; want SUCCESS by %s at %d", c.Key, errs[i], e.State, e.Owner.Token(), e.Result.Offset, c.Owner.Token(), i)
			}
		}
	}
}

// A completion that the remembered entry would fence (under a token it
// does not name) is decided on the entry read, which here is that token's
// own takeover through another Store: it succeeds.
func TestCompleteWithSetIfEqReadsWhatItWouldFence(t *testing.T) {
	s, addr := casStoreOn(t, "castheirs")
	ctx := context.Background()
	reqs := decideKeys(t, s, 10, time.Second)
	newOwner, _ := takeOver(t, sameStore(t, s, addr), reqs[3], "holder-z")
	comps := successes(reqs)
	comps[3].Owner = newOwner
	var errs []error
	calls := callsDuring(t, addr, func() {
		var err error
		if errs, err = s.Complete(ctx, comps); err != nil {
			t.Fatal(err)
		}
	})
	if calls["mget"] != 1 || calls["evalsha"] != 0 {
		t.Errorf("%d MGET and %d script calls; want 1 and none", calls["mget"], calls["evalsha"])
	}
	for i, c := range comps {
		e, _, err := s.Lookup(ctx, "p", c.Key)
		if err != nil {
			t.Fatal(err)
		}
		if errs[i] != nil || e.State != dedupe.Success || e.Owner != c.Owner {
			t.Errorf("%s: %v, %s by %s; want SUCCESS by %s", c.Key, errs[i], e.State, e.Owner.Token(), c.Owner.Token())
		}
	}
}

// Once a remembered entry puts a call in doubt, every completion of the
// call is decided on the entries read: none keeps a verdict of the
// remembered entries. Here the first plan runs while a key's lease runs
// and releases it; before the read, the lease ends and another store takes
// the key over, and the key's release must come back fenced, not done
// (on the later clock, the remembered entry's release would change
// nothing: no write, so nothing the server checks).
func TestCompleteWithSetIfEqDecidesADoubtedCallOnWhatItReads(t *testing.T) {
	s, addr := casStoreOn(t, "casdoubt")
	other := sameStore(t, s, addr)
	ctx := context.Background()
	reqs := decideKeys(t, s, 10, 2*time.Second)
	rereads := 0
	s.hooks.beforeReread = func() {
		rereads++
		takeOver(t, other, reqs[1], "holder-b")
	}
	comps := successes(reqs)
	comps[1].State, comps[1].Result = dedupe.Pending, dedupe.ResultRef{}
	comps[2].Owner.Holder = "holder-z"
	errs, err := s.Complete(ctx, comps)
	if err != nil {
		t.Fatal(err)
	}
	if rereads != 1 {
		t.Fatalf("%d reads of the whole call, want 1", rereads)
	}
	for i, c := range comps {
		e, _, err := s.Lookup(ctx, "p", c.Key)
		if err != nil {
			t.Fatal(err)
		}
		switch i {
		case 1:
			if !errors.Is(errs[i], dedupe.ErrFenced) || e.Owner.Holder != "holder-b" {
				t.Errorf("release of the key taken over: %v, held by %s; want fenced, held by holder-b", errs[i], e.Owner.Holder)
			}
		case 2:
			if !errors.Is(errs[i], dedupe.ErrFenced) || e.State != dedupe.Pending {
				t.Errorf("completion under another token: %v, %s; want fenced, PENDING", errs[i], e.State)
			}
		default:
			if errs[i] != nil || e.State != dedupe.Success {
				t.Errorf("%s: %v, %s; want SUCCESS", c.Key, errs[i], e.State)
			}
		}
	}
}

// decideKeys decides keys k000, k001, … as holder-a with lease, and
// returns the requests.
func decideKeys(t *testing.T, s *Store, n int, lease time.Duration) []dedupe.DecideRequest {
	t.Helper()
	var reqs []dedupe.DecideRequest
	for i := range n {
		reqs = append(reqs, pendingReq(fmt.Sprintf("k%03d", i), "holder-a", i, lease))
	}
	if _, err := s.Decide(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	return reqs
}

// takeOver decides r again on st as holder, from another source, until
// r's lease has ended on the server's clock and holder has the key. It
// returns holder's token and how many decisions that took.
func takeOver(t *testing.T, st *Store, r dedupe.DecideRequest, holder string) (dedupe.Owner, int) {
	t.Helper()
	r.Owner, r.Final = dedupe.Owner{Holder: holder, Source: "in/1/7"}, true
	for n, deadline := 1, time.Now().Add(10*time.Second); time.Now().Before(deadline); n++ {
		decs, err := st.Decide(context.Background(), []dedupe.DecideRequest{r})
		if err != nil {
			t.Fatalf("takeover: %v", err)
		}
		if decs[0].Verdict == dedupe.VerdictFirst {
			return r.Owner, n
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the lease did not end within 10s")
	return dedupe.Owner{}, 0
}

// successes completes each of reqs SUCCESS, its result at the offset of
// its place in reqs.
func successes(reqs []dedupe.DecideRequest) []dedupe.Completion {
	comps := make([]dedupe.Completion, len(reqs))
	for i, r := range reqs {
		comps[i] = dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success,
			Result: dedupe.ResultRef{Partition: 0, Offset: int64(i)}}
	}
	return comps
}

// sameStore is another Store on the server at addr under s's prefix: what
// it writes s does not remember.
func sameStore(t *testing.T, s *Store, addr string) *Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return New(c, s.prefix)
}
