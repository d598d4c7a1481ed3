package group_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer/group"
	"github.com/idemstream/idemstream/internal/testenv"
)

// recorder is a Handler that keeps what it was told.
type recorder struct {
	mu      sync.Mutex
	owned   map[int]bool
	revoked []int
	lost    []int
	events  int
	gens    []group.Generation
	gone    time.Time // when the last partition was revoked or lost
	got     time.Time // when the last partition was assigned
}

func newRecorder() *recorder { return &recorder{owned: map[int]bool{}} }

func (r *recorder) Assigned(_ context.Context, g group.Generation, offsets map[int]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range offsets {
		r.owned[p] = true
	}
	r.got = time.Now()
	r.events++
	r.gens = append(r.gens, g)
}

func (r *recorder) Revoked(_ context.Context, g group.Generation, partitions []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revoked = r.give(r.revoked, partitions)
	r.gens = append(r.gens, g)
}

func (r *recorder) Lost(_ group.Generation, partitions []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost = r.give(r.lost, partitions)
}

// give takes partitions from what the member owns and adds them to list;
// r.mu is held.
func (r *recorder) give(list, partitions []int) []int {
	for _, p := range partitions {
		delete(r.owned, p)
	}
	r.gone = time.Now()
	r.events++
	return append(list, partitions...)
}

func (r *recorder) snapshot() (owned, revoked, lost []int, events int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.owned {
		owned = append(owned, p)
	}
	slices.Sort(owned)
	return owned, slices.Clone(r.revoked), slices.Clone(r.lost), r.events
}

// running is a member started in the background.
type running struct {
	net  *network
	m    *group.Member
	rec  *recorder
	stop context.CancelFunc
	done chan error
}

func start(t *testing.T, brokers []string, grp, topic, instance, assignor string) *running {
	t.Helper()
	return startWith(t, brokers, group.Config{Group: grp, Topic: topic, InstanceID: instance, Assignor: assignor})
}

// startWith starts a member of cfg, with a client of its own.
func startWith(t *testing.T, brokers []string, cfg group.Config) *running {
	t.Helper()
	nw := &network{}
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 60 * time.Second, Transport: &kafka.Transport{Dial: nw.dial}}
	rec := newRecorder()
	cfg.Client = client
	m, err := group.New(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &running{m: m, rec: rec, stop: stop, done: make(chan error, 1), net: nw}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(r.halt)
	return r
}

// network is a member's connections, which crash cuts: the process
// sends nothing more, as one killed would not.
type network struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

func (n *network) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut {
		return nil, errors.New("the network is cut")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

// cut cuts the member off the cluster: it keeps running, and reaches
// nothing.
func (r *running) cut() {
	r.net.mu.Lock()
	defer r.net.mu.Unlock()
	r.net.cut = true
	for _, c := range r.net.conns {
		c.Close()
	}
}

// halt stops the member and waits for Run to return.
func (r *running) halt() {
	r.stop()
	<-r.done
	r.done <- nil // a second halt returns at once
}

// waitFor is the package's waitUntil.
var waitFor = group.WaitUntil

func owns(r *running, n int) func() bool {
	return func() bool { o, _, _, _ := r.rec.snapshot(); return len(o) == n && len(r.m.Owned()) == n }
}

func setup(t *testing.T, partitions int) (brokers []string, grp, topic string) {
	brokers = testenv.KafkaBrokers(t)
	topic = testenv.UniqueName(t, "group-in")
	testenv.CreateTopics(t, brokers, partitions, topic)
	return brokers, testenv.UniqueName(t, "group"), topic
}

// A member that joins a cooperative group takes only its share: the
// first member gives up those partitions alone and keeps the others
// without a revocation.
func TestCooperativeJoinMovesOnlyWhatMust(t *testing.T) {
	brokers, grp, topic := setup(t, 6)
	a := start(t, brokers, grp, topic, "", "")
	waitFor(t, 30*time.Second, "the first member owns all six", owns(a, 6))
	b := start(t, brokers, grp, topic, "", "")
	waitFor(t, 60*time.Second, "three partitions each", func() bool { return owns(a, 3)() && owns(b, 3)() })
	ao, revoked, lost, _ := a.rec.snapshot()
	bo, _, _, _ := b.rec.snapshot()
	slices.Sort(revoked)
	if !slices.Equal(revoked, bo) || len(lost) > 0 {
		t.Fatalf("a revoked %v and lost %v; b owns %v: want a to revoke exactly b's partitions", revoked, lost, bo)
	}
	if g := a.m.Generation(); g.Protocol != group.CooperativeSticky {
		t.Fatalf("protocol %q, want %s", g.Protocol, group.CooperativeSticky)
	}
	for _, p := range ao {
		if slices.Contains(revoked, p) {
			t.Fatalf("a kept %d but revoked it on the way", p)
		}
	}
	// Commits work under the generation, and not for others' partitions.
	ctx := context.Background()
	if err := a.m.Commit(ctx, map[int]int64{ao[0]: 7}); err != nil {
		t.Fatalf("commit of an owned partition: %v", err)
	}
	if err := a.m.Commit(ctx, map[int]int64{bo[0]: 7}); !errors.Is(err, group.ErrNotOwned) {
		t.Fatalf("commit of b's partition: %v, want ErrNotOwned", err)
	}
	// A dynamic member that leaves hands its partitions back at once.
	b.halt()
	waitFor(t, 30*time.Second, "a owns all six again", owns(a, 6))
}

// A static member stopped and started again under its instance id takes
// its partitions back at once, without a rebalance: the other member is
// told nothing, and stays in its generation. The restart comes well
// inside the session timeout (45 s), and the test allows far less.
func TestStaticMemberRestartsWithoutARebalance(t *testing.T) {
	brokers, grp, topic := setup(t, 6)
	a := start(t, brokers, grp, topic, "member-a", "")
	b := start(t, brokers, grp, topic, "member-b", "")
	waitFor(t, 60*time.Second, "three partitions each", func() bool { return owns(a, 3)() && owns(b, 3)() })
	before, _, _, _ := a.rec.snapshot()
	_, _, _, bEvents := b.rec.snapshot()
	bGen := b.m.Generation()
	a.halt() // a static member stopped in order stays in the group
	began := time.Now()
	a2 := startWith(t, brokers, group.Config{Group: grp, Topic: topic, InstanceID: "member-a", LeaveOnStop: true})
	waitFor(t, 15*time.Second, "the restarted member owns three", owns(a2, 3))
	after, _, _, _ := a2.rec.snapshot()
	if !slices.Equal(before, after) {
		t.Fatalf("restarted member owns %v, before %v", after, before)
	}
	_, _, _, events := b.rec.snapshot()
	if events != bEvents || b.m.Generation() != bGen {
		t.Fatalf("the other member saw %d events and generation %+v, want none and %+v", events-bEvents, b.m.Generation(), bGen)
	}
	t.Logf("restarted member had its partitions back %v after the restart", time.Since(began).Round(time.Millisecond))
	// With LeaveOnStop, a static member stopped in order leaves: the
	// other takes its partitions long before the 45 s session would end.
	a2.halt()
	waitFor(t, 15*time.Second, "the other member owns all six", owns(b, 6))
}

// Two processes under one instance id: the older is fenced, told it lost
// its partitions, and Run returns ErrFenced.
func TestTwoProcessesWithOneIdentityFenceTheOlder(t *testing.T) {
	brokers, grp, topic := setup(t, 2)
	a := start(t, brokers, grp, topic, "member-x", "")
	waitFor(t, 30*time.Second, "a owns both", owns(a, 2))
	a2 := start(t, brokers, grp, topic, "member-x", "")
	waitFor(t, 30*time.Second, "the newer owns both", owns(a2, 2))
	select {
	case err := <-a.done:
		a.done <- err
		if !errors.Is(err, group.ErrFenced) {
			t.Fatalf("older member's Run: %v, want ErrFenced", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the older member was not fenced")
	}
	if _, _, lost, _ := a.rec.snapshot(); len(lost) != 2 {
		t.Fatalf("older member lost %v, want both partitions", lost)
	}
}

// A group with a member of the previous release (kafka-go's consumer
// group: eager, range) agrees on range: both work, and the partitions
// are split between them, never owned by both at once after the join.
func TestMixedGroupAgreesOnRange(t *testing.T) {
	brokers, grp, topic := setup(t, 4)
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: grp, Brokers: brokers, Topics: []string{topic},
		HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second, RebalanceTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close() })
	var mu sync.Mutex
	var old []int
	go func() {
		for {
			gen, err := cg.Next(context.Background())
			if err != nil {
				return
			}
			mu.Lock()
			old = old[:0]
			for _, a := range gen.Assignments[topic] {
				old = append(old, a.ID)
			}
			mu.Unlock()
		}
	}()
	waitFor(t, 30*time.Second, "the old member owns all four", func() bool { mu.Lock(); defer mu.Unlock(); return len(old) == 4 })
	a := start(t, brokers, grp, topic, "", "")
	waitFor(t, 60*time.Second, "two partitions each", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return owns(a, 2)() && len(old) == 2
	})
	if g := a.m.Generation(); g.Protocol != group.Range {
		t.Fatalf("protocol %q, want range", g.Protocol)
	}
	mine := a.m.Owned()
	mu.Lock()
	defer mu.Unlock()
	for _, p := range old {
		if slices.Contains(mine, p) {
			t.Fatalf("partition %d owned by both: %v and %v", p, mine, old)
		}
	}
}

// kafka-go reads the heartbeat response's fields out of order; the member
// reads the error where it lands. In a group with a member, a member id
// the group does not have and a generation it is not in are refused as
// such by the real broker, and the member's own heartbeat passes.
func TestHeartbeatErrorsAreRead(t *testing.T) {
	brokers, grp, topic := setup(t, 1)
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	a := start(t, brokers, grp, topic, "", "")
	waitFor(t, 30*time.Second, "a owns the partition", owns(a, 1))
	g := a.m.Generation()
	for _, tc := range []struct {
		what     string
		gen      int
		memberID string
		want     error
	}{
		{"a member id the group does not have", g.ID, "nobody", kafka.UnknownMemberId},
		{"a later generation", g.ID + 5, g.MemberID, kafka.IllegalGeneration},
		{"the member itself", g.ID, g.MemberID, nil},
	} {
		res, err := client.Heartbeat(context.Background(), &kafka.HeartbeatRequest{GroupID: grp, GenerationID: int32(tc.gen), MemberID: tc.memberID})
		if err != nil {
			t.Fatal(err)
		}
		if got := group.HeartbeatError(res); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
			t.Errorf("heartbeat of %s: %v (response %+v), want %v", tc.what, got, res, tc.want)
		}
	}
}

// A member of the previous release joining a cooperative group makes it
// agree on range: the member that kept its partitions across the join
// gives them all up before any assignment is made, so the old member
// never starts one of them while it still runs it.
func TestEagerJoinerMakesTheCooperativeMemberRevokeFirst(t *testing.T) {
	brokers, grp, topic := setup(t, 4)
	a := start(t, brokers, grp, topic, "", "")
	waitFor(t, 30*time.Second, "a owns all four", owns(a, 4))
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: grp, Brokers: brokers, Topics: []string{topic},
		HeartbeatInterval: time.Second, SessionTimeout: 10 * time.Second, RebalanceTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Close() })
	gen, err := cg.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if n := len(gen.Assignments[topic]); n != 2 {
		t.Fatalf("old member got %d partitions, want 2", n)
	}
	waitFor(t, 30*time.Second, "a owns two", owns(a, 2))
	_, revoked, lost, _ := a.rec.snapshot()
	a.rec.mu.Lock()
	gone := a.rec.gone
	a.rec.mu.Unlock()
	slices.Sort(revoked)
	if !slices.Equal(revoked, []int{0, 1, 2, 3}) || len(lost) > 0 || gone.After(started) {
		t.Fatalf("a revoked %v (done %v, old member started %v), lost %v: want all four revoked before the old member started",
			revoked, gone, started, lost)
	}
	if g := a.m.Generation(); g.Protocol != group.Range {
		t.Fatalf("protocol %q, want range", g.Protocol)
	}
	// The last member of the previous release leaves: the next generation
	// is cooperative again, with no setting changed (one rolling deploy).
	cg.Close()
	waitFor(t, 30*time.Second, "a cooperative generation with all four", func() bool {
		return owns(a, 4)() && a.m.Generation().Protocol == group.CooperativeSticky
	})
}

// A member cut off from the cluster gives its partitions up (Lost)
// before the group can have handed them to another member: the deadline
// is a heartbeat interval inside the session.
func TestCutOffMemberStopsBeforeOthersTakeOver(t *testing.T) {
	brokers, grp, topic := setup(t, 2)
	cfg := group.Config{Group: grp, Topic: topic, SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second}
	a := startWith(t, brokers, cfg)
	waitFor(t, 30*time.Second, "a owns both", owns(a, 2))
	b := startWith(t, brokers, cfg)
	waitFor(t, 30*time.Second, "one each", func() bool { return owns(a, 1)() && owns(b, 1)() })
	a.cut()
	waitFor(t, 30*time.Second, "b owns both", owns(b, 2))
	_, _, lost, _ := a.rec.snapshot()
	a.rec.mu.Lock()
	gone := a.rec.gone
	a.rec.mu.Unlock()
	b.rec.mu.Lock()
	got := b.rec.got
	b.rec.mu.Unlock()
	if len(lost) != 1 || gone.IsZero() || !gone.Before(got) {
		t.Fatalf("a lost %v at %v, b took over at %v: want a's partition lost before b got it", lost, gone, got)
	}
	t.Logf("a gave up %v before b took over", got.Sub(gone).Round(time.Millisecond))
}
