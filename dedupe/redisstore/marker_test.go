package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/internal/testenv"
)

// forgetStream decides and completes keys first-0 … first-(n-1) as the
// consumer does, in batches of batch (8 and more take the SET NX path and
// the compare-and-set or WATCH completion; fewer, the scripts).
func forgetStream(t *testing.T, s *redisstore.Store, from, n, batch int, holder string) error {
	t.Helper()
	ctx := context.Background()
	for start := from; start < from+n; start += batch {
		var reqs []dedupe.DecideRequest
		for i := start; i < min(start+batch, from+n); i++ {
			r := decideReq("k-"+strconv.Itoa(i), holder)
			r.Owner.Source = "in/0/" + strconv.Itoa(i)
			reqs = append(reqs, r)
		}
		decs, err := s.Decide(ctx, reqs)
		if err != nil {
			return err
		}
		var comps []dedupe.Completion
		for i, d := range decs {
			if d.Verdict != dedupe.VerdictFirst {
				continue
			}
			comps = append(comps, dedupe.Completion{Namespace: "p", Key: reqs[i].Key, Owner: reqs[i].Owner, State: dedupe.Success,
				Result: dedupe.ResultRef{Partition: 0, Offset: int64(i)}})
		}
		errs, err := s.Complete(ctx, comps)
		if err != nil {
			return err
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// forgets asserts that err is the store's loss, named as such.
func forgets(t *testing.T, what string, err error) {
	t.Helper()
	var fe *redisstore.ForgotError
	if !errors.Is(err, dedupe.ErrStoreForgot) || !errors.As(err, &fe) {
		t.Fatalf("%s: %v, want the store's loss (ErrStoreForgot)", what, err)
	}
	if !dedupe.IsRetryable(err) {
		t.Errorf("%s: the loss is not retryable: the partition would stop instead of pausing", what)
	}
}

// After a FLUSHALL no path decides: not the scripts (small batches), not
// the SET NX path, not a completion. Another store on the prefix (a member
// started afterwards) finds the loss recorded; an operator's AcceptLoss
// lets both decide again.
func TestFlushAllStopsEveryDecisionPath(t *testing.T) {
	addr := testenv.StartRedis(t, testenv.RedisConfig{}).Addr
	c := client(t, addr)
	prefix := freshPrefix()
	s := redisstore.New(c, prefix)
	ctx := context.Background()
	if err := forgetStream(t, s, 0, 40, 20, "a"); err != nil {
		t.Fatal(err)
	}
	// A batch decided before the FLUSHALL and completed after it.
	pending := decideReq("in-flight", "a")
	if _, err := s.Decide(ctx, []dedupe.DecideRequest{pending}); err != nil {
		t.Fatal(err)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Complete(ctx, []dedupe.Completion{{Namespace: "p", Key: "in-flight", Owner: pending.Owner, State: dedupe.Success}})
	forgets(t, "complete after FLUSHALL", err)
	for _, batch := range []int{1, 20} {
		_, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("k-1", "b")})
		if batch == 20 {
			err = forgetStream(t, s, 0, 20, 20, "b")
		}
		forgets(t, "decide after FLUSHALL, batch "+strconv.Itoa(batch), err)
	}
	if s.Forgot() == nil {
		t.Error("Forgot() = nil after the loss")
	}
	late := redisstore.New(client(t, addr), prefix)
	_, err = late.Decide(ctx, []dedupe.DecideRequest{decideReq("k-2", "c")})
	forgets(t, "a store opened after the loss", err)
	st, err := late.Status(ctx)
	if err != nil || st.Loss == nil || !strings.Contains(st.Loss.Reason, "marker is gone") {
		t.Fatalf("status after the loss: %+v %v, want the loss recorded", st, err)
	}

	if _, err := late.AcceptLoss(ctx); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*redisstore.Store{s, late} {
		waitDecides(t, st, "k-3")
	}
}

// waitDecides polls until s decides key first again: a store that forgot
// asks the server at most once a second.
func waitDecides(t *testing.T, s *redisstore.Store, key string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := s.Decide(context.Background(), []dedupe.DecideRequest{decideReq(key, "after")})
		if err == nil {
			if d[0].Verdict != dedupe.VerdictFirst && d[0].Verdict != dedupe.VerdictPending {
				t.Fatalf("after the loss was accepted %s decided %v", key, d[0].Verdict)
			}
			if s.Forgot() != nil {
				t.Errorf("Forgot() = %v after deciding again", s.Forgot())
			}
			return
		}
		if !errors.Is(err, dedupe.ErrStoreUnavailable) || time.Now().After(deadline) {
			t.Fatalf("deciding after the loss was accepted: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A master restarted without persistence is empty: the next decision
// finds its marker gone, on the script path (the restarted server has no
// script either) as on the SET NX path.
func TestRestartWithoutPersistenceIsALoss(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	s := redisstore.New(client(t, srv.Addr), freshPrefix())
	if err := forgetStream(t, s, 0, 100, 25, "a"); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	srv.Start()
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for {
		// The first call after the restart may meet the closed
		// connection; the one after must name the loss.
		_, err = s.Decide(context.Background(), []dedupe.DecideRequest{decideReq("k-1", "b")})
		if errors.Is(err, dedupe.ErrStoreForgot) || err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	forgets(t, "decide after a restart without persistence", err)
	err = forgetStream(t, s, 0, 25, 25, "b")
	forgets(t, "a batch on the SET NX path", err)
}

// With a hold (the longest window) the store resumes by itself once the
// hold has passed on the server's clock, under a new generation.
func TestLossEndsAfterTheHold(t *testing.T) {
	addr := testenv.StartRedis(t, testenv.RedisConfig{}).Addr
	c := client(t, addr)
	s := redisstore.New(c, freshPrefix(), redisstore.WithForgetHold(2*time.Second))
	ctx := context.Background()
	if err := forgetStream(t, s, 0, 10, 10, "a"); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Status(ctx)
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Decide(ctx, []dedupe.DecideRequest{decideReq("k-1", "b")})
	forgets(t, "decide after FLUSHALL", err)
	var fe *redisstore.ForgotError
	if errors.As(err, &fe); fe.Hold != 2*time.Second || !strings.Contains(err.Error(), "or the window passes at") {
		t.Errorf("the loss does not say when it ends: %v", err)
	}
	waitDecides(t, s, "k-1")
	after, err := s.Status(ctx)
	if err != nil || after.Armed == "" || after.Armed == before.Armed {
		t.Errorf("after the hold the markers hold %+v (%v), want a new generation (was %q)", after, err, before.Armed)
	}
}

// Stores that arm a new prefix at once arm one generation; a store that
// finds entries of an earlier release and no marker arms it too.
func TestStoresArmingAtOnceAgree(t *testing.T) {
	addr := testenv.RedisAddr(t)
	prefix := freshPrefix()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			s := redisstore.New(client(t, addr), prefix)
			errs[i] = forgetStream(t, s, i*10, 10, 10, "h"+strconv.Itoa(i))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.New(client(t, addr), prefix).Status(context.Background())
	if err != nil || st.Armed == "" || len(st.Values) != 1 || st.Absent != 0 {
		t.Errorf("after eight stores armed at once: %+v %v, want one generation", st, err)
	}
}

// A Cluster node restarted without persistence keeps its slots
// (nodes.conf) and loses their entries and markers: decisions on its
// slots are refused, and the loss is recorded for every store.
func TestClusterNodeRestoredEmptyIsALoss(t *testing.T) {
	nodes := testenv.StartRedisClusterNodes(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	c, err := redisstore.NewClient(redisstore.Options{Addrs: addrs, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, freshPrefix())
	if err := forgetStream(t, s, 0, 200, 50, "a"); err != nil {
		t.Fatal(err)
	}
	nodes[0].Kill()
	nodes[0].Start()
	for _, n := range nodes {
		testenv.WaitClusterOK(t, n.Addr, 3, 30*time.Second)
	}
	if n, err := testenv.RedisCommand(nodes[0].Addr, "DBSIZE"); err != nil || n != "0" {
		t.Fatalf("fault not injected: the restarted node holds %s keys (%v), want none", n, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err = forgetStream(t, s, 0, 200, 50, "b")
		if errors.Is(err, dedupe.ErrStoreForgot) || err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	forgets(t, "decide on a Cluster with a node restored empty", err)
	st, err := s.Status(context.Background())
	if err != nil || st.Loss == nil || st.Markers != 16384 {
		t.Fatalf("status: %+v %v, want the loss recorded on 16384 markers", st, err)
	}
	// The loss is recorded on every marker the node lost (about a third).
	if lost := st.Absent + countForgot(st); lost < 5000 {
		t.Errorf("%d markers record the loss, want the restored node's slots (about 5461)", lost)
	}
}

func countForgot(st redisstore.MarkerStatus) int {
	n := 0
	for v, c := range st.Values {
		if strings.HasPrefix(v, "forgot ") {
			n += c
		}
	}
	return n
}
