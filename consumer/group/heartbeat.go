package group

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// beat is a heartbeat's refusal, labelled with the epoch it was sent in:
// one sent before a join and answered after it speaks of a generation
// that is over, and is dropped.
type beat struct {
	epoch uint64
	err   error
}

// membership is what the member's partitions depend on: its context ends
// the moment the group is known to have gone on without the member (a
// refusal, or a session's worth of heartbeats without an answer), from
// the heartbeat goroutine itself, so that the partitions stop at once even
// while the join loop is busy (a Revoked draining, a JoinGroup waiting).
type membership struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newMembership() membership {
	ctx, cancel := context.WithCancel(context.Background())
	return membership{ctx: ctx, cancel: cancel}
}

// heartbeats runs for the whole of Run: a heartbeat every interval while a
// generation is on. A refusal goes to Run; one that ends the membership
// (unknown member, illegal generation, fenced) first ends the membership's
// context, and so does the member's own deadline: the last request the
// broker took as its sign of life (an answered heartbeat, a join, a sync)
// was sent more than SessionTimeout-HeartbeatInterval ago, which is
// before the broker, whose clock started when that request arrived, can
// have given the member up. The deadline holds between generations too,
// while the member still owns partitions (a cooperative join, a failed
// one), except while a JoinGroup is parked at the broker, which keeps the
// member meanwhile.
func (m *Member) heartbeats(ctx context.Context) {
	t := time.NewTicker(m.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		g, memberID, active, coord, epoch := m.gen, m.memberID, m.active, m.coord, m.epoch
		since, owns, parked := time.Since(m.alive), len(m.owned) > 0, m.parked
		m.mu.Unlock()
		if !active {
			if owns && !parked && since >= m.deadline() {
				m.giveUp(epoch, since)
			}
			continue
		}
		err := errSessionOver
		sent := time.Now()
		if left := m.deadline() - since; left > 0 {
			err = m.heartbeat(ctx, g, memberID, coord, min(left, m.cfg.SessionTimeout/2))
		}
		switch {
		case err == nil || errors.Is(err, kafka.RebalanceInProgress):
			// The broker counts both as the member alive.
			m.markAlive(sent)
			if err == nil {
				continue
			}
		case isGroupError(err):
			err = classify("heartbeat", err)
			m.endMembership(epoch)
		default:
			m.mu.Lock()
			since = time.Since(m.alive)
			m.mu.Unlock()
			if since < m.deadline() {
				m.log.Debug("group: heartbeat failed", "group", m.cfg.Group, "err", err)
				m.setCoordinator(nil)
				continue
			}
			m.giveUp(epoch, since)
			continue
		}
		select {
		case m.beats <- beat{epoch: epoch, err: err}:
		default:
		}
	}
}

// giveUp ends the membership of epoch at the member's own deadline; Run's
// loop sees its context end.
func (m *Member) giveUp(epoch uint64, since time.Duration) {
	if m.endMembership(epoch) {
		m.log.Warn("group: no sign of life from the coordinator within the session; giving the partitions up",
			"group", m.cfg.Group, "since", since.Round(time.Millisecond))
	}
}

// errSessionOver is a heartbeat not sent: the deadline had passed.
var errSessionOver = errors.New("the session's deadline passed")

// deadline is how long after the last answered heartbeat was sent the
// member gives itself up: an interval before the broker may.
func (m *Member) deadline() time.Duration { return m.cfg.SessionTimeout - m.cfg.HeartbeatInterval }

// endMembership ends the membership of epoch, if it is still the current
// one and not over yet: the partitions' work stops now, and Run's loop
// tells the Handler. It reports whether it ended it.
func (m *Member) endMembership(epoch uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if epoch != m.epoch || m.member.ctx.Err() != nil {
		return false
	}
	m.member.cancel()
	return true
}

// heartbeat sends one heartbeat, finding the coordinator first if need
// be, within budget (what is left before the deadline, at most half the
// session).
func (m *Member) heartbeat(ctx context.Context, g Generation, memberID string, coord net.Addr, budget time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	if coord == nil {
		var err error
		if coord, err = m.findCoordinator(ctx); err != nil {
			return err
		}
	}
	res, err := m.cfg.Client.Heartbeat(ctx, &kafka.HeartbeatRequest{Addr: coord, GroupID: m.cfg.Group,
		GenerationID: int32(g.ID), MemberID: memberID, GroupInstanceID: m.cfg.InstanceID})
	if err == nil {
		err = heartbeatError(res)
	}
	if errors.Is(err, kafka.NotCoordinatorForGroup) || errors.Is(err, kafka.GroupCoordinatorNotAvailable) {
		m.setCoordinator(nil)
	}
	return err
}

// heartbeatError reads the error of a heartbeat response. kafka-go
// v0.4.51 reads version 1 and later with the fields in the wrong order
// (error code, then throttle time, where the protocol has the throttle
// time first: segmentio/kafka-go#1371), so the error code arrives as the
// low 16 bits of the throttle time, and Error is nil unless a throttle of
// over 65 s filled the high bits. TestHeartbeatErrorsAreRead holds this
// against the real broker, so that a kafka-go that reads it right fails
// the test rather than turn throttles into errors.
func heartbeatError(res *kafka.HeartbeatResponse) error {
	if res.Error != nil {
		return res.Error
	}
	if code := int16(uint32(int32(res.Throttle/time.Millisecond)) & 0xffff); code != 0 {
		return kafka.Error(code)
	}
	return nil
}

// findCoordinator asks where the group's coordinator is: kafka-go routes
// every group request there but the heartbeat, which names no group.
func (m *Member) findCoordinator(ctx context.Context) (net.Addr, error) {
	res, err := m.cfg.Client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: m.cfg.Group, KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return nil, err
	}
	addr := kafka.TCP(net.JoinHostPort(res.Coordinator.Host, strconv.Itoa(res.Coordinator.Port)))
	m.setCoordinator(addr)
	return addr, nil
}
