package group

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/findcoordinator"
	hbapi "github.com/segmentio/kafka-go/protocol/heartbeat"
	"github.com/segmentio/kafka-go/protocol/joingroup"
	"github.com/segmentio/kafka-go/protocol/leavegroup"
	"github.com/segmentio/kafka-go/protocol/metadata"
	"github.com/segmentio/kafka-go/protocol/offsetcommit"
	"github.com/segmentio/kafka-go/protocol/offsetfetch"
	"github.com/segmentio/kafka-go/protocol/syncgroup"
)

// fakeCoord is a scripted coordinator: one member's view of a group, for
// the interleavings a real broker will not produce on cue (heartbeats
// that fail for a session, joins that get no answer).
type fakeCoord struct {
	mu        sync.Mutex
	gen       int32
	hbMode    atomic.Int32 // 0 ok, 1 network error, 2 RIP
	joinFail  atomic.Bool  // JoinGroup returns a network error
	protocol  string       // protocol chosen
	leader    string       // "" => the member itself
	extra     bool         // a second member m2 with empty subscription
	hbCount   atomic.Int32
	commitGen []int32
	commitErr int16
}

func (f *fakeCoord) RoundTrip(ctx context.Context, addr net.Addr, msg protocol.Message) (protocol.Message, error) {
	switch r := msg.(type) {
	case *findcoordinator.Request:
		return &findcoordinator.Response{Host: "fake", Port: 1}, nil
	case *metadata.Request:
		ps := make([]metadata.ResponsePartition, 4)
		for i := range ps {
			ps[i].PartitionIndex = int32(i)
		}
		return &metadata.Response{Topics: []metadata.ResponseTopic{{Name: "t", Partitions: ps}}}, nil
	case *hbapi.Request:
		f.hbCount.Add(1)
		switch f.hbMode.Load() {
		case 1:
			return nil, io.ErrUnexpectedEOF
		case 2:
			return &hbapi.Response{ErrorCode: int16(kafka.RebalanceInProgress)}, nil
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.GenerationID != f.gen {
			return &hbapi.Response{ErrorCode: int16(kafka.IllegalGeneration)}, nil
		}
		return &hbapi.Response{}, nil
	case *joingroup.Request:
		if f.joinFail.Load() {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
			}
			return nil, io.ErrUnexpectedEOF
		}
		if r.MemberID == "" {
			return &joingroup.Response{ErrorCode: int16(kafka.MemberIDRequired), MemberID: "m1"}, nil
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.gen++
		proto := f.protocol
		res := &joingroup.Response{GenerationID: f.gen, ProtocolName: proto, MemberID: r.MemberID, LeaderID: r.MemberID}
		if f.leader != "" {
			res.LeaderID = f.leader
		}
		var md []byte
		for _, p := range r.Protocols {
			if p.Name == proto {
				md = p.Metadata
			}
		}
		res.Members = []joingroup.ResponseMember{{MemberID: r.MemberID, Metadata: md}}
		if f.extra {
			res.Members = append(res.Members, joingroup.ResponseMember{MemberID: "m2", Metadata: encodeSubscription(1, "t", nil)})
		}
		return res, nil
	case *syncgroup.Request:
		for _, a := range r.Assignments {
			if a.MemberID == r.MemberID {
				return &syncgroup.Response{Assignments: a.Assignment}, nil
			}
		}
		// not the leader: the "old" leader gives m1 partition 0 only
		return &syncgroup.Response{Assignments: encodeAssignment("t", []int{0})}, nil
	case *offsetfetch.Request:
		var ps []offsetfetch.ResponsePartition
		for _, t := range r.Topics {
			for _, p := range t.PartitionIndexes {
				ps = append(ps, offsetfetch.ResponsePartition{PartitionIndex: p, CommittedOffset: -1})
			}
		}
		return &offsetfetch.Response{Topics: []offsetfetch.ResponseTopic{{Name: "t", Partitions: ps}}}, nil
	case *offsetcommit.Request:
		f.mu.Lock()
		f.commitGen = append(f.commitGen, r.GenerationID)
		code := int16(0)
		if r.GenerationID != f.gen {
			code = int16(kafka.IllegalGeneration)
		}
		f.mu.Unlock()
		var ps []offsetcommit.ResponsePartition
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				ps = append(ps, offsetcommit.ResponsePartition{PartitionIndex: p.PartitionIndex, ErrorCode: code})
			}
		}
		return &offsetcommit.Response{Topics: []offsetcommit.ResponseTopic{{Name: "t", Partitions: ps}}}, nil
	case *leavegroup.Request:
		return &leavegroup.Response{}, nil
	}
	return nil, errors.New("unexpected request")
}

// hnd is a Handler that keeps what it was told; onRevoke, when set, runs
// inside Revoked (a drain).
type hnd struct {
	mu       sync.Mutex
	ctxs     []context.Context
	lost     [][]int
	revoked  [][]int
	onRevoke func(partitions []int)
}

func (h *hnd) Assigned(ctx context.Context, g Generation, offsets map[int]int64) {
	h.mu.Lock()
	h.ctxs = append(h.ctxs, ctx)
	h.mu.Unlock()
}
func (h *hnd) Revoked(ctx context.Context, g Generation, partitions []int) {
	h.mu.Lock()
	h.revoked = append(h.revoked, partitions)
	f := h.onRevoke
	h.mu.Unlock()
	if f != nil {
		f(partitions)
	}
}
func (h *hnd) Lost(g Generation, partitions []int) {
	h.mu.Lock()
	h.lost = append(h.lost, partitions)
	h.mu.Unlock()
}

// waitUntil polls cond until it holds, or fails the test after within.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runFake runs a member against f until the test ends.
func runFake(t *testing.T, f *fakeCoord, h *hnd) *Member {
	t.Helper()
	m := newFake(t, f, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, 5*time.Second, "the member owns all four", func() bool { return len(m.Owned()) == 4 })
	return m
}

func (h *hnd) wasLost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.lost) > 0
}

func (h *hnd) firstContext() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ctxs[0]
}

func newFake(t *testing.T, f *fakeCoord, h Handler) *Member {
	m, err := New(Config{Group: "g", Topic: "t", Client: &kafka.Client{Addr: kafka.TCP("fake:1"), Transport: f, Timeout: 30 * time.Second},
		SessionTimeout: 3 * time.Second, HeartbeatInterval: 600 * time.Millisecond, RebalanceTimeout: 5 * time.Second, PartitionWatch: time.Hour}, h)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The heartbeats fail for longer than the member's deadline while it is
// busy revoking (a cooperative round: another member joined), so the
// refusal it gave itself is from an epoch that is over by the time it
// waits again. The membership's end is a state, not a message: the
// member takes the loss (Lost) instead of going on owning partitions
// whose work has stopped.
func TestMembershipThatEndedDuringARevokeIsLost(t *testing.T) {
	f := &fakeCoord{protocol: CooperativeSticky}
	h := &hnd{}
	m := runFake(t, f, h)
	h.mu.Lock()
	h.onRevoke = func([]int) {
		// The drain lasts until the member has given itself up.
		f.hbMode.Store(1)
		deadline := time.Now().Add(10 * time.Second)
		for !m.membershipEnded() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		f.hbMode.Store(0)
	}
	h.mu.Unlock()
	f.mu.Lock()
	f.extra = true
	f.mu.Unlock()
	f.hbMode.Store(2) // the rebalance
	waitUntil(t, 15*time.Second, "the partitions lost after the membership ended", h.wasLost)
	if h.firstContext().Err() == nil {
		t.Fatal("Lost was called with the membership's context still on")
	}
}

// Joins that get no answer for a session and more: the member, which
// still owns its partitions (cooperative), gives them up at its deadline
// rather than keep working them while the group hands them on.
func TestNoSignOfLifeWhileJoiningGivesThePartitionsUp(t *testing.T) {
	f := &fakeCoord{protocol: CooperativeSticky}
	h := &hnd{}
	runFake(t, f, h)
	f.joinFail.Store(true)
	f.hbMode.Store(2)
	waitUntil(t, 10*time.Second, "the membership ended (session 3 s)", func() bool { return h.firstContext().Err() != nil })
	waitUntil(t, 10*time.Second, "the partitions lost", h.wasLost)
}

// An eager member joined a cooperative group in the middle of a join: the
// member gives everything up before the sync. Its commits for those
// partitions fail at once (the generation moved on: none could pass), and
// it goes on heartbeating during the drain, so that a drain longer than
// the session does not cost it its membership.
func TestRevokeBeforeSyncKeepsTheSession(t *testing.T) {
	f := &fakeCoord{protocol: CooperativeSticky}
	h := &hnd{}
	m := runFake(t, f, h)
	var (
		took     time.Duration
		cerr     error
		hbDuring int32
		once     sync.Once
		revoked  = make(chan struct{})
		measure  func(ps []int)
	)
	h.mu.Lock()
	h.onRevoke = func(ps []int) { once.Do(func() { measure(ps) }) }
	measure = func(ps []int) {
		defer close(revoked)
		hb0 := f.hbCount.Load()
		start := time.Now()
		cctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		defer c()
		cerr = m.Commit(cctx, map[int]int64{ps[0]: 10})
		took = time.Since(start)
		// The drain lasts until five heartbeats went out (3 s at 600 ms:
		// longer than the session), or gives up after twice that.
		deadline := time.Now().Add(6 * time.Second)
		for f.hbCount.Load()-hb0 < 5 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		hbDuring = f.hbCount.Load() - hb0
	}
	h.mu.Unlock()
	f.mu.Lock()
	f.protocol, f.leader = Range, "old"
	f.mu.Unlock()
	f.hbMode.Store(2)
	select {
	case <-revoked:
	case <-time.After(10 * time.Second):
		t.Fatal("no revocation")
	}
	f.hbMode.Store(0)
	if !errors.Is(cerr, ErrNotOwned) || took > time.Second {
		t.Errorf("commit while revoking before the sync: %v after %v, want ErrNotOwned at once", cerr, took)
	}
	if hbDuring < 5 {
		t.Errorf("%d heartbeats during the drain, want 5 (one every 600 ms for longer than the 3 s session)", hbDuring)
	}
	if h.wasLost() {
		t.Error("the member lost its partitions: the drain cost it its membership")
	}
}
