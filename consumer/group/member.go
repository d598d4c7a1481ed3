package group

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemstream/idemstream/internal/retry"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/joingroup"
)

// Config configures a Member.
type Config struct {
	Group string
	Topic string
	// Client reaches the cluster; its Timeout must outlast
	// RebalanceTimeout, since a JoinGroup waits that long for the others.
	Client *kafka.Client
	// InstanceID makes the member static (KIP-345): restarted under the
	// same id within SessionTimeout, it takes its partitions back without
	// a rebalance, and no other member stops meanwhile. Empty: a dynamic
	// member.
	InstanceID string
	// LeaveOnStop makes a static member leave the group when Run ends in
	// order, as a dynamic member always does: for identities that do not
	// come back after a stop (a Deployment's pod names).
	LeaveOnStop bool
	// Assignor is CooperativeSticky (the default) or Range. A member
	// configured with CooperativeSticky also offers Range, so that a group
	// that still has members of the eager kind agrees on Range and works.
	Assignor string
	// SessionTimeout (default 45s), RebalanceTimeout (default the session
	// timeout) and HeartbeatInterval (default 3s, at most a third of the
	// session).
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration
	// PartitionWatch is how often the leader reads the topic's partition
	// count, and makes the group rebalance when it has changed (default
	// 5s).
	PartitionWatch time.Duration
	// Joined, when set, is told of every generation the member joins,
	// after its Handler.
	Joined func(JoinInfo)
	Logger *slog.Logger
}

// JoinInfo is a generation joined: what the member was assigned, what it
// gave up and was handed, and how long the join took from the first
// request (the time the member's partitions could not move).
type JoinInfo struct {
	Generation
	Assigned, Revoked, Added []int
	Took                     time.Duration
}

// Generation is a generation of the group as this member took part in it.
type Generation struct {
	ID       int
	MemberID string
	Protocol string
}

// Cooperative says whether the generation's assignor moves partitions in
// two rounds, keeping the others where they are.
func (g Generation) Cooperative() bool { return g.Protocol == CooperativeSticky }

// Handler is told what the member owns. Its methods are called one at a
// time, from Run's goroutine; heartbeats go on meanwhile.
type Handler interface {
	// Assigned hands over partitions, with the offsets the group has
	// committed for them (-1: none). ctx is the membership's: it ends the
	// moment the member is known to be out of the group (before Lost is
	// called), and the partitions' work must then stop at once.
	Assigned(ctx context.Context, g Generation, offsets map[int]int64)
	// Revoked takes partitions back in an orderly way: it returns when
	// their work is committed or given up. Commit works meanwhile, except
	// when the group went back to the eager protocol in the middle of a
	// join (the generation has moved on: the work is only wound up). When
	// ctx ends, the time to give them up is over: stop them at once.
	Revoked(ctx context.Context, g Generation, partitions []int)
	// Lost takes partitions back that the member no longer owns (another
	// member may have them already): their work stops at once, and nothing
	// more is committed for them.
	Lost(g Generation, partitions []int)
}

// ErrFenced is Run's error when another process joined under this
// member's instance id: two processes with one identity, which static
// membership assumes never happens.
var ErrFenced = errors.New("group: fenced: another member joined with this instance id")

// ErrNotOwned is Commit's error for a partition the member no longer owns
// (revoked by a rebalance that completed first, or lost).
var ErrNotOwned = errors.New("group: partition not owned")

// Member is one member of a consumer group on one topic.
type Member struct {
	cfg Config
	h   Handler
	log *slog.Logger

	mu       sync.Mutex
	memberID string
	gen      Generation
	active   bool  // a generation is on: heartbeats are sent
	owned    []int // sorted
	coord    net.Addr
	planned  int           // the partitions of the leader's last plan; 0: not the leader
	joining  time.Time     // when the join under way began
	changed  chan struct{} // closed when gen or owned changes
	epoch    uint64        // bumped by every join and loss: labels heartbeats
	member   membership    // ends when the group goes on without the member
	beats    chan beat     // the heartbeat loop's refusals, for Run
	alive    time.Time     // when the last request the broker took as the member's sign of life was sent
	parked   bool          // a JoinGroup is out: the broker keeps the member while it waits
}

// New checks cfg and returns a member; it starts nothing.
func New(cfg Config, h Handler) (*Member, error) {
	switch {
	case cfg.Group == "":
		return nil, errors.New("group: no group")
	case cfg.Topic == "":
		return nil, errors.New("group: no topic")
	case cfg.Client == nil:
		return nil, errors.New("group: no client")
	}
	if cfg.Assignor == "" {
		cfg.Assignor = CooperativeSticky
	}
	if cfg.Assignor != CooperativeSticky && cfg.Assignor != Range {
		return nil, fmt.Errorf("group: assignor %q: want %s or %s", cfg.Assignor, CooperativeSticky, Range)
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 45 * time.Second
	}
	if cfg.RebalanceTimeout <= 0 {
		cfg.RebalanceTimeout = cfg.SessionTimeout
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = min(3*time.Second, cfg.SessionTimeout/3)
	}
	if cfg.PartitionWatch <= 0 {
		cfg.PartitionWatch = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Member{cfg: cfg, h: h, log: log, gen: Generation{ID: -1}, changed: make(chan struct{}),
		member: newMembership(), beats: make(chan beat, 1)}, nil
}

// Generation is the generation the member is in (ID -1: none).
func (m *Member) Generation() Generation {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

// Owned is what the member owns now.
func (m *Member) Owned() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.owned)
}

// Run joins the group and keeps the member in it until ctx ends; then it
// revokes what it owns and, if dynamic, leaves the group. It returns nil
// then, and ErrFenced (after Lost) if another process took its identity.
func (m *Member) Run(ctx context.Context) error {
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { m.heartbeats(hctx) })
	defer func() { stop(); wg.Wait() }()
	err := m.loop(ctx)
	if ctx.Err() != nil && !errors.Is(err, ErrFenced) {
		m.shutdown()
		return nil
	}
	return err
}

// loop is Run's join, sync and wait, over and over.
func (m *Member) loop(ctx context.Context) error {
	again := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for ctx.Err() == nil {
		if !m.Generation().Cooperative() {
			m.revokeAll(context.WithoutCancel(ctx)) // eager: nothing is kept across a join
		}
		err := m.join(ctx)
		if err == nil {
			again.Reset()
			err = m.wait(ctx)
		}
		switch {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, ErrFenced):
			m.lose()
			return err
		case IsFatal(err):
			m.lose()
			return err
		case errors.Is(err, errRejoin), errors.Is(err, kafka.RebalanceInProgress):
			// At once: the group is waiting for this member.
		case errors.Is(err, errMembershipEnded):
			// The member gave itself up before the broker can have: its
			// partitions stopped; it joins again under its member id, which
			// the broker refuses if it has given the member up too.
			m.lose()
		case errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.IllegalGeneration):
			m.lose()
			m.mu.Lock()
			if errors.Is(err, kafka.UnknownMemberId) {
				m.memberID = ""
			}
			m.mu.Unlock()
		default:
			m.log.Warn("group: rejoining after an error", "group", m.cfg.Group, "err", err)
			if m.membershipEnded() {
				m.lose()
			}
			if retry.Sleep(ctx, again.Next()) != nil {
				return nil
			}
		}
	}
	return nil
}

// errRejoin says the member must join again now (a rebalance began, or a
// cooperative revocation must be followed by the second round).
var errRejoin = errors.New("group: rejoin")

// errMembershipEnded says the membership's context ended (the member
// gave itself up, or the broker refused it): what it owns is lost.
var errMembershipEnded = errors.New("group: membership ended")

func (m *Member) membershipEnded() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.member.ctx.Err() != nil
}

// wait heartbeats until the generation ends: a rebalance (errRejoin), a
// fatal refusal, or ctx.
func (m *Member) wait(ctx context.Context) error {
	watch := time.NewTicker(m.cfg.PartitionWatch)
	defer watch.Stop()
	m.mu.Lock()
	ended := m.member.ctx.Done()
	m.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ended:
			return errMembershipEnded
		case b := <-m.beats:
			m.mu.Lock()
			stale := b.epoch != m.epoch
			m.mu.Unlock()
			switch {
			case stale:
			case errors.Is(b.err, kafka.RebalanceInProgress):
				return errRejoin
			default:
				return b.err
			}
		case <-watch.C:
			if m.partitionsChanged(ctx) {
				return errRejoin
			}
		}
	}
}

// partitionsChanged says, for the leader, whether the topic has another
// partition count than its plan had: joining again makes the group
// rebalance and the new partitions assigned.
func (m *Member) partitionsChanged(ctx context.Context) bool {
	m.mu.Lock()
	planned := m.planned
	m.mu.Unlock()
	if planned == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.HeartbeatInterval)
	defer cancel()
	n, err := m.partitionCount(ctx)
	if err != nil || n == planned {
		return false
	}
	m.log.Info("group: the topic's partition count changed; rebalancing", "group", m.cfg.Group, "topic", m.cfg.Topic, "was", planned, "now", n)
	return true
}

func (m *Member) partitionCount(ctx context.Context) (int, error) {
	meta, err := m.cfg.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{m.cfg.Topic}})
	if err != nil {
		return 0, classify("metadata", err)
	}
	if len(meta.Topics) != 1 || meta.Topics[0].Error != nil {
		return 0, fmt.Errorf("group: metadata of %s: %v", m.cfg.Topic, meta.Topics)
	}
	return len(meta.Topics[0].Partitions), nil
}

// join runs one JoinGroup and SyncGroup, and applies the assignment.
func (m *Member) join(ctx context.Context) error {
	m.mu.Lock()
	if m.member.ctx.Err() != nil {
		m.mu.Unlock()
		return errMembershipEnded
	}
	m.active, m.planned = false, 0
	m.epoch++
	if m.joining.IsZero() {
		m.joining = time.Now()
	}
	memberID, owned, prev := m.memberID, slices.Clone(m.owned), m.gen
	m.mu.Unlock()
	protocols := []joingroup.RequestProtocol{{Name: Range, Metadata: encodeSubscription(0, m.cfg.Topic, nil)}}
	if m.cfg.Assignor == CooperativeSticky {
		protocols = append([]joingroup.RequestProtocol{{Name: CooperativeSticky, Metadata: encodeSubscription(1, m.cfg.Topic, owned)}}, protocols...)
	}
	res, err := m.parkedJoin(ctx, memberID, protocols)
	if errors.Is(err, kafka.MemberIDRequired) {
		// KIP-394: the broker names the member id to join with.
		m.setMemberID(res.memberID)
		res, err = m.parkedJoin(ctx, res.memberID, protocols)
	}
	if err != nil {
		return classify("join group", err)
	}
	m.setMemberID(res.memberID)
	g := Generation{ID: res.generation, MemberID: res.memberID, Protocol: res.protocol}
	if !g.Cooperative() && len(owned) > 0 {
		m.revokeBeforeSync(prev, g, owned)
	}
	var plan map[string][]int
	if res.leader == res.memberID {
		if plan, err = m.assign(ctx, g.Protocol, res.members); err != nil {
			return err
		}
	}
	sent := time.Now()
	assigned, err := m.syncGroup(ctx, g, plan)
	if err != nil {
		return classify("sync group", err)
	}
	m.markAlive(sent) // the broker starts the session anew at the sync
	slices.Sort(assigned)
	return m.apply(ctx, g, assigned)
}

// parkedJoin sends a JoinGroup and waits for its answer, at most the
// rebalance timeout and a session more (the broker answers a parked join
// within the rebalance timeout). Meanwhile the broker keeps the member
// alive; an answer proves it alive as of the request.
func (m *Member) parkedJoin(ctx context.Context, memberID string, protocols []joingroup.RequestProtocol) (*joinResult, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RebalanceTimeout+m.cfg.SessionTimeout)
	defer cancel()
	m.mu.Lock()
	m.parked = true
	m.mu.Unlock()
	sent := time.Now()
	res, err := m.joinGroup(ctx, memberID, protocols)
	m.mu.Lock()
	m.parked = false
	m.mu.Unlock()
	if err == nil {
		m.markAlive(sent)
	}
	return res, err
}

// revokeBeforeSync gives up everything the member kept across a join
// whose group went back to the eager protocol (a member that offers only
// range joined): a range leader assigns without looking at what anyone
// owns. Its commits could not pass any more (the generation moved on), so
// the partitions are no longer owned from the start, and the drain only
// completes or releases their keys; it runs with heartbeats under the new
// generation, which keep the session, and is cut short at the member's
// deadline.
func (m *Member) revokeBeforeSync(prev, g Generation, owned []int) {
	m.mu.Lock()
	m.owned = nil
	m.gen, m.active = Generation{ID: g.ID, MemberID: g.MemberID, Protocol: g.Protocol}, true
	m.epoch++
	m.signal()
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), m.deadline())
	defer cancel()
	m.h.Revoked(ctx, prev, owned)
	m.mu.Lock()
	m.active = false
	m.epoch++
	m.mu.Unlock()
}

// markAlive records t, when a request the broker took as a sign of the
// member's life was sent.
func (m *Member) markAlive(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.After(m.alive) {
		m.alive = t
	}
}

// assign is the leader's part: the plan for every member, by the
// protocol the group chose. A subscription that does not decode counts as
// owning nothing: the assignment still gives that member its share.
func (m *Member) assign(ctx context.Context, protocol string, members []joinedMember) (map[string][]int, error) {
	partitions, err := m.partitionCount(ctx)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.planned = partitions
	m.mu.Unlock()
	subs := make([]Subscriber, len(members))
	for i, mem := range members {
		subs[i] = Subscriber{MemberID: mem.memberID, InstanceID: mem.instanceID}
		s, err := decodeSubscription(mem.metadata)
		if err != nil {
			m.log.Warn("group: a member's subscription does not decode", "group", m.cfg.Group, "member", mem.memberID, "err", err)
			continue
		}
		subs[i].Owned = s.owned[m.cfg.Topic]
	}
	if protocol == CooperativeSticky {
		return AssignCooperativeSticky(subs, partitions), nil
	}
	return AssignRange(subs, partitions), nil
}

// apply moves the member to generation g with assigned: what it owns and
// is not assigned is revoked, what is new is handed over. A cooperative
// revocation is followed by a join at once, the second round that lets
// the partitions go to their new owners.
func (m *Member) apply(ctx context.Context, g Generation, assigned []int) error {
	m.mu.Lock()
	prev := m.owned
	revoked, added := minus(prev, assigned), minus(assigned, prev)
	m.gen, m.active = g, true
	took := time.Since(m.joining)
	m.joining = time.Time{}
	m.signal()
	m.mu.Unlock()
	m.log.Debug("group: generation joined", "group", m.cfg.Group, "generation", g.ID, "protocol", g.Protocol,
		"assigned", assigned, "revoked", revoked, "added", added)
	if len(revoked) > 0 {
		m.h.Revoked(context.WithoutCancel(ctx), g, revoked)
		m.setOwned(minus(prev, revoked))
	}
	if len(added) > 0 {
		offsets, err := m.committed(ctx, added)
		if err != nil {
			return err
		}
		m.mu.Lock()
		mctx := m.member.ctx
		m.mu.Unlock()
		if mctx.Err() != nil {
			return errMembershipEnded
		}
		m.setOwned(assigned)
		m.h.Assigned(mctx, g, offsets)
	}
	if m.cfg.Joined != nil {
		m.cfg.Joined(JoinInfo{Generation: g, Assigned: assigned, Revoked: revoked, Added: added, Took: took})
	}
	if len(revoked) > 0 && g.Cooperative() {
		return errRejoin
	}
	return nil
}

// committed reads the group's offsets for partitions (-1: none).
func (m *Member) committed(ctx context.Context, partitions []int) (map[int]int64, error) {
	res, err := m.cfg.Client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: m.cfg.Group, Topics: map[string][]int{m.cfg.Topic: partitions}})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return nil, classify("offset fetch", err)
	}
	out := make(map[int]int64, len(partitions))
	for _, p := range partitions {
		out[p] = -1
	}
	for _, p := range res.Topics[m.cfg.Topic] {
		if p.Error != nil {
			return nil, classify("offset fetch", p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// LeaveTimeout bounds a dynamic member's LeaveGroup on its way out.
const LeaveTimeout = 10 * time.Second

// shutdown revokes what the member owns (its work committed) and, for a
// dynamic member, leaves the group, so that its partitions move at once.
// A static member stays, as KIP-345 has it: its restart under the same id
// takes them back without a rebalance, and until its session ends they
// wait for it. LeaveOnStop makes it leave too (LeaveGroup naming its
// instance id), for identities that do not come back: a Deployment's next
// pod has another name.
func (m *Member) shutdown() {
	m.revokeAll(context.Background())
	m.mu.Lock()
	memberID := m.memberID
	m.active = false
	m.mu.Unlock()
	if memberID == "" || m.cfg.InstanceID != "" && !m.cfg.LeaveOnStop {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), LeaveTimeout)
	defer cancel()
	res, err := m.cfg.Client.LeaveGroup(ctx, &kafka.LeaveGroupRequest{GroupID: m.cfg.Group,
		Members: []kafka.LeaveGroupRequestMember{{ID: memberID, GroupInstanceID: m.cfg.InstanceID}}})
	if err == nil {
		err = res.Error
	}
	if err == nil && len(res.Members) == 1 {
		err = res.Members[0].Error
	}
	if err != nil {
		m.log.Warn("group: leaving the group failed; the session timeout will end the membership", "group", m.cfg.Group, "err", err)
	}
}

func (m *Member) revokeAll(ctx context.Context) {
	m.mu.Lock()
	owned, g := m.owned, m.gen
	m.mu.Unlock()
	if len(owned) > 0 {
		m.h.Revoked(ctx, g, owned)
		m.setOwned(nil)
	}
}

// lose tells the handler that nothing the member owned is its any more,
// and starts a new membership for the next join.
func (m *Member) lose() {
	m.mu.Lock()
	owned, g := m.owned, m.gen
	m.owned, m.active, m.gen = nil, false, Generation{ID: -1}
	m.member.cancel()
	m.member = newMembership()
	m.epoch++
	m.signal()
	m.mu.Unlock()
	if len(owned) > 0 {
		m.h.Lost(g, owned)
	}
}

func (m *Member) setOwned(owned []int) {
	m.mu.Lock()
	m.owned = slices.Clone(owned)
	m.signal()
	m.mu.Unlock()
}

func (m *Member) setMemberID(id string) {
	m.mu.Lock()
	m.memberID = id
	m.mu.Unlock()
}

func (m *Member) setCoordinator(addr net.Addr) {
	m.mu.Lock()
	m.coord = addr
	m.mu.Unlock()
}

// signal wakes the commits waiting for a change; m.mu is held.
func (m *Member) signal() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// minus is a without b; both sorted.
func minus(a, b []int) []int {
	var out []int
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			out = append(out, x)
		}
	}
	return out
}
