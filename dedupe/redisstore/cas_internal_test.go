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
	// The entry's expiry is the one its state asks for (RetainUntil),
	// as every other writer of an entry sets it.
	for _, c := range comps {
		e, _, err := s.Lookup(context.Background(), "p", c.Key)
		if err != nil {
			t.Fatal(err)
		}
		pttl, err := testenv.RedisCommand(addr, "PTTL", s.redisKey("p", c.Key))
		if err != nil {
			t.Fatal(err)
		}
		ms, _ := strconv.ParseInt(pttl, 10, 64)
		if wantMs := e.RetainUntil().Sub(e.Now).Milliseconds(); ms < wantMs-2000 || ms > wantMs+2000 {
			t.Errorf("%s (%s): PTTL %d ms, want about %d", c.Key, e.State, ms, wantMs)
		}
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
	beforeCAS = func([]string) {
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
	defer func() { beforeCAS = nil }()
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
	const n = casChunk + 9
	var mine []dedupe.DecideRequest
	for i := range n {
		mine = append(mine, pendingReq(fmt.Sprintf("k%03d", i), "holder-a", i, time.Second))
	}
	if _, err := s.Decide(ctx, mine); err != nil {
		t.Fatal(err)
	}
	taken := mine[casChunk+2]
	var mu sync.Mutex
	reads, takeovers, polls := 0, 0, 0
	beforeCAS = func(names []string) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if !slices.Contains(names, s.redisKey("p", taken.Key)) {
			return
		}
		// The lease ends on the server's clock, and another holder takes
		// the key over.
		r := taken
		r.Owner, r.Final = dedupe.Owner{Holder: "holder-b", Source: "in/1/7"}, true
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			polls++
			decs, err := s.Decide(ctx, []dedupe.DecideRequest{r})
			if err != nil {
				t.Errorf("takeover: %v", err)
				return
			}
			if decs[0].Verdict == dedupe.VerdictFirst {
				takeovers++
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Error("the lease did not end within 10s")
	}
	defer func() { beforeCAS = nil }()
	var comps []dedupe.Completion
	for i, r := range mine {
		comps = append(comps, dedupe.Completion{Namespace: "p", Key: r.Key, Owner: r.Owner, State: dedupe.Success,
			Result: dedupe.ResultRef{Partition: 0, Offset: int64(i)}})
	}
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
