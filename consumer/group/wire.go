package group

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/joingroup"
	"github.com/segmentio/kafka-go/protocol/syncgroup"
)

// The member sends JoinGroup and SyncGroup through the protocol package
// rather than kafka.Client's methods, which read every member's
// subscription and the assignment as version 1 of the consumer protocol:
// the previous release's members (kafka-go's consumer group) send version
// 0, which those methods fail on (unexpected EOF), and read only version
// 0 themselves, refusing a subscription with owned partitions. So the
// member writes its own: version 0 under range, which every member of a
// mixed group reads, version 1 (owned partitions) under
// cooperative-sticky, which only members that can read it choose; and it
// reads every version, up to the fields it knows.

// joinResult is a JoinGroup response: the members' subscriptions are the
// raw bytes, decoded by the leader with decodeSubscription.
type joinResult struct {
	generation       int
	protocol         string
	leader, memberID string
	members          []joinedMember
}

type joinedMember struct {
	memberID, instanceID string
	metadata             []byte
}

func (m *Member) roundTrip(ctx context.Context, msg protocol.Message) (protocol.Message, error) {
	c := m.cfg.Client
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	t := c.Transport
	if t == nil {
		t = kafka.DefaultTransport
	}
	return t.RoundTrip(ctx, c.Addr, msg)
}

func (m *Member) joinGroup(ctx context.Context, memberID string, protocols []joingroup.RequestProtocol) (*joinResult, error) {
	msg, err := m.roundTrip(ctx, &joingroup.Request{
		GroupID: m.cfg.Group, SessionTimeoutMS: int32(m.cfg.SessionTimeout.Milliseconds()),
		RebalanceTimeoutMS: int32(m.cfg.RebalanceTimeout.Milliseconds()), MemberID: memberID,
		GroupInstanceID: m.cfg.InstanceID, ProtocolType: "consumer", Protocols: protocols,
	})
	if err != nil {
		return nil, err
	}
	r, ok := msg.(*joingroup.Response)
	if !ok {
		return nil, fmt.Errorf("join group: response of type %T", msg)
	}
	res := &joinResult{generation: int(r.GenerationID), protocol: r.ProtocolName, leader: r.LeaderID, memberID: r.MemberID}
	for _, mem := range r.Members {
		res.members = append(res.members, joinedMember{memberID: mem.MemberID, instanceID: mem.GroupInstanceID, metadata: mem.Metadata})
	}
	if r.ErrorCode != 0 {
		return res, kafka.Error(r.ErrorCode)
	}
	return res, nil
}

func (m *Member) syncGroup(ctx context.Context, g Generation, plan map[string][]int) ([]int, error) {
	req := &syncgroup.Request{GroupID: m.cfg.Group, GenerationID: int32(g.ID), MemberID: g.MemberID,
		GroupInstanceID: m.cfg.InstanceID, ProtocolType: "consumer", ProtocolName: g.Protocol}
	for id, parts := range plan {
		req.Assignments = append(req.Assignments, syncgroup.RequestAssignment{MemberID: id, Assignment: encodeAssignment(m.cfg.Topic, parts)})
	}
	msg, err := m.roundTrip(ctx, req)
	if err != nil {
		return nil, err
	}
	r, ok := msg.(*syncgroup.Response)
	if !ok {
		return nil, fmt.Errorf("sync group: response of type %T", msg)
	}
	if r.ErrorCode != 0 {
		return nil, kafka.Error(r.ErrorCode)
	}
	assigned, err := decodeAssignment(r.Assignments)
	if err != nil {
		return nil, err
	}
	return assigned[m.cfg.Topic], nil
}

// encodeSubscription writes the consumer protocol's subscription to topic:
// version 0, or version 1 with the partitions owned.
func encodeSubscription(version int16, topic string, owned []int) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(version))
	b = binary.BigEndian.AppendUint32(b, 1)
	b = appendString(b, topic)
	b = binary.BigEndian.AppendUint32(b, 0) // user data: empty, not null, which every reader takes
	if version >= 1 {
		b = appendTopicPartitions(b, topic, owned)
	}
	return b
}

// subscription is what the leader reads of a member's subscription.
type subscription struct {
	topics []string
	owned  map[string][]int
}

var errShort = errors.New("group: consumer protocol data cut short")

// decodeSubscription reads a subscription of any version: version 0's
// topics and user data, and from version 1 the owned partitions; later
// fields (generation, rack) are left unread.
func decodeSubscription(b []byte) (subscription, error) {
	var s subscription
	r := reader{b: b}
	version := r.int16()
	n := r.count()
	for range n {
		s.topics = append(s.topics, r.string())
	}
	r.bytes() // user data
	if version >= 1 {
		s.owned = r.topicPartitions()
	}
	if r.err != nil {
		return subscription{}, r.err
	}
	return s, nil
}

// encodeAssignment writes version 0 of the consumer protocol's
// assignment (version 1 has the same fields), user data empty.
func encodeAssignment(topic string, parts []int) []byte {
	b := binary.BigEndian.AppendUint16(nil, 0)
	b = appendTopicPartitions(b, topic, parts)
	return binary.BigEndian.AppendUint32(b, 0)
}

// decodeAssignment reads an assignment of any version. An empty one (a
// member the leader gave nothing, in some clients) assigns nothing.
func decodeAssignment(b []byte) (map[string][]int, error) {
	if len(b) == 0 {
		return nil, nil
	}
	r := reader{b: b}
	r.int16()
	out := r.topicPartitions()
	return out, r.err
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendTopicPartitions(b []byte, topic string, parts []int) []byte {
	if len(parts) == 0 {
		return binary.BigEndian.AppendUint32(b, 0)
	}
	b = binary.BigEndian.AppendUint32(b, 1)
	b = appendString(b, topic)
	b = binary.BigEndian.AppendUint32(b, uint32(len(parts)))
	for _, p := range parts {
		b = binary.BigEndian.AppendUint32(b, uint32(p))
	}
	return b
}

// reader reads the consumer protocol's big-endian fields; the first
// short read sets err, and the rest read zeros.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b) {
		r.err = errShort
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) int16() int16 {
	if b := r.take(2); b != nil {
		return int16(binary.BigEndian.Uint16(b))
	}
	return 0
}

func (r *reader) int32() int32 {
	if b := r.take(4); b != nil {
		return int32(binary.BigEndian.Uint32(b))
	}
	return 0
}

// count reads an array's length; null (-1) is empty, and a length that
// the bytes left cannot hold is refused before anything is allocated.
func (r *reader) count() int {
	n := int(r.int32())
	if n < 0 {
		return 0
	}
	if n > len(r.b) {
		r.err = errShort
		return 0
	}
	return n
}

func (r *reader) string() string {
	n := int(r.int16())
	if n < 0 {
		return ""
	}
	return string(r.take(n))
}

func (r *reader) bytes() []byte {
	n := int(r.int32())
	if n < 0 {
		return nil
	}
	return r.take(n)
}

func (r *reader) topicPartitions() map[string][]int {
	out := map[string][]int{}
	n := r.count()
	for range n {
		topic := r.string()
		k := r.count()
		for range k {
			out[topic] = append(out[topic], int(r.int32()))
		}
		if r.err != nil {
			return nil
		}
	}
	return out
}
