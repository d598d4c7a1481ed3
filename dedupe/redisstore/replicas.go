package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
)

// Option configures a Store.
type Option func(*Store)

// WithReplicas makes every decide, renew and complete wait until n
// replicas have the write, for at most timeout: a decision that only the
// master holds is lost when a failover promotes a replica, and the key is
// decided first again. n = 0 (the default) waits for nobody.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(s *Store) {
		s.acks.replicas = n
		s.acks.timeout = timeout
	}
}

// replicaAcks is the state of the replica acknowledgement.
type replicaAcks struct {
	replicas int
	timeout  time.Duration

	mu sync.Mutex
	// modes caches, per node address, whether the node answers WAITAOF
	// (Redis 7.2+ with appendonly yes) and with how many local fsyncs.
	modes map[string]ackMode
	// last is the outcome of the newest write round trip that waited,
	// at lastAt.
	last   error
	lastAt time.Time
}

// ackErrorFresh bounds how long ReplicaAckError reports a failure that no
// later write confirmed or cleared: a paused partition retries well within
// it, while a pipeline that stopped writing (its partitions revoked, no
// input) must not stay unready for good.
const ackErrorFresh = time.Minute

// ackMode is the command that waits for replicas on one node.
type ackMode struct {
	aof      bool // WAITAOF numlocal numreplicas timeout, else WAIT
	numlocal int
	// again, when set, is when to probe once more: WAITAOF would be there
	// but the replicas did not acknowledge an fsync (yet).
	again time.Time
}

// probeAgain is how long a WAIT chosen for want of fsync acknowledgements
// holds before the next probe: a replica rewriting its AOF after a sync
// acknowledges none for a while.
const probeAgain = time.Minute

// ReplicaAckError returns the error of the newest write whose replicas
// did not acknowledge in time, or nil once a later write was acknowledged
// or no write was tried for a minute (and always nil without
// WithReplicas). /readyz reports it.
func (s *Store) ReplicaAckError() error {
	s.acks.mu.Lock()
	defer s.acks.mu.Unlock()
	if time.Since(s.acks.lastAt) > ackErrorFresh {
		return nil
	}
	return s.acks.last
}

// noteAck records a round trip's acknowledgement: a failure, or a wait
// that answered in full. A round trip that failed before its wait
// answered says nothing about the replicas.
func (s *Store) noteAck(err error, acked bool) {
	if err == nil && !acked {
		return
	}
	s.acks.mu.Lock()
	s.acks.last, s.acks.lastAt = err, time.Now()
	s.acks.mu.Unlock()
}

// waits reports whether a round trip of op must wait for replicas.
func (s *Store) waits(op string) bool { return s.acks.replicas > 0 && op != "lookup" }

// roundTrip sends cmds in one pipelined round trip. keys[i] routes cmds[i]
// on a cluster. When op writes and replicas must acknowledge, one WAIT (or
// WAITAOF) follows the commands on each node, on the same connection: WAIT
// counts the replicas that have this connection's writes, so it cannot be
// sent on another. It returns the pipeline's error, then the
// acknowledgement's (wrapping dedupe.ErrNotReplicated when short).
func (s *Store) roundTrip(ctx context.Context, op string, keys []string, cmds []redis.Cmder) (execErr, ackErr error) {
	execErr, ackErr, acked := s.sendAndWait(ctx, op, keys, cmds)
	if s.waits(op) {
		s.noteAck(ackErr, acked)
	}
	return execErr, ackErr
}

// sendAndWait is roundTrip without recording the acknowledgement for
// ReplicaAckError: a caller that sends several round trips for one call
// records their outcome once (see roundTrips), so that a late success
// does not hide an earlier shortfall.
func (s *Store) sendAndWait(ctx context.Context, op string, keys []string, cmds []redis.Cmder) (execErr, ackErr error, acked bool) {
	if !guards(op) {
		return s.send(ctx, op, keys, cmds)
	}
	keys, cmds, gets, want := s.markerGets(ctx, keys, cmds)
	execErr, ackErr, acked = s.send(ctx, op, keys, cmds)
	if err := s.checkMarkers(ctx, want, gets); err != nil {
		if execErr != nil && !errors.Is(execErr, redis.Nil) && !errors.Is(err, dedupe.ErrStoreForgot) {
			// The markers were not read: the round trip's own error is
			// the cause, but a failure it must stay.
			return markerFailure{classify(op, execErr)}, ackErr, false
		}
		return err, nil, false
	}
	return execErr, ackErr, acked
}

// send is sendAndWait without the markers.
func (s *Store) send(ctx context.Context, op string, keys []string, cmds []redis.Cmder) (execErr, ackErr error, acked bool) {
	if !s.waits(op) {
		pipe := s.client.Pipeline()
		for _, c := range cmds {
			_ = pipe.Process(ctx, c)
		}
		_, err := pipe.Exec(ctx)
		return err, nil, false
	}
	cc, cluster := s.client.(*redis.ClusterClient)
	if !cluster {
		return s.nodeRoundTrip(ctx, op, s.client, cmds)
	}
	// A cluster: one pipeline per master, each with its own WAIT.
	type node struct {
		client *redis.Client
		cmds   []redis.Cmder
	}
	var nodes []*node
	byAddr := map[string]*node{}
	for i, c := range cmds {
		m, err := cc.MasterForKey(ctx, keys[i])
		if err != nil {
			failUnsent(cmds, err)
			return err, nil, false
		}
		addr := m.Options().Addr
		n, ok := byAddr[addr]
		if !ok {
			n = &node{client: m}
			byAddr[addr] = n
			nodes = append(nodes, n)
		}
		n.cmds = append(n.cmds, c)
	}
	execErrs := make([]error, len(nodes))
	ackErrs := make([]error, len(nodes))
	ackedBy := make([]bool, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			execErrs[i], ackErrs[i], ackedBy[i] = s.nodeRoundTrip(ctx, op, n.client, n.cmds)
		}()
	}
	wg.Wait()
	execErr, ackErr = errors.Join(execErrs...), errors.Join(ackErrs...)
	if execErr != nil && isTransient(execErr) {
		// A slot moved (failover, resharding): the next attempt must
		// route by the new map.
		cc.ReloadState(ctx)
	}
	return execErr, ackErr, !slices.Contains(ackedBy, false)
}

// nodeRoundTrip is one node's pipeline: the commands, then the wait of
// node's kind. acked reports that the wait answered and was enough.
func (s *Store) nodeRoundTrip(ctx context.Context, op string, node redis.Cmdable, cmds []redis.Cmder) (execErr, ackErr error, acked bool) {
	mode, addr, err := s.ackMode(ctx, node)
	if err != nil {
		failUnsent(cmds, err)
		return classify(op, err), nil, false
	}
	pipe := node.Pipeline()
	for _, cmd := range cmds {
		_ = pipe.Process(ctx, cmd)
	}
	timeout := s.acks.timeout.Milliseconds()
	if timeout < 1 {
		timeout = 1
	}
	var wait *redis.Cmd
	if mode.aof {
		wait = pipe.Do(ctx, "WAITAOF", mode.numlocal, s.acks.replicas, timeout)
	} else {
		wait = pipe.Do(ctx, "WAIT", s.acks.replicas, timeout)
	}
	_, execErr = pipe.Exec(ctx)
	if err := wait.Err(); err != nil {
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			// The connection failed: the commands' errors say so, and
			// nothing is known about the replicas.
			if execErr == nil {
				execErr = err
			}
			return execErr, nil, false
		}
		if mode.aof {
			// appendonly turned off, or a node that lacks WAITAOF
			// after a failover: find out again on the next call.
			s.forgetMode(addr)
		}
		return execErr, fmt.Errorf("%s: %w: %s: %w", op, dedupe.ErrNotReplicated, waitName(mode), err), false
	}
	n, local, err := parseWait(mode, wait.Val())
	if err != nil {
		return execErr, fmt.Errorf("%s: %w: %w", op, dedupe.ErrNotReplicated, err), false
	}
	if local < int64(mode.numlocal) || n < int64(s.acks.replicas) {
		return execErr, fmt.Errorf("%s: %w: %s: %d of %d replicas acknowledged within %s",
			op, dedupe.ErrNotReplicated, waitName(mode), n, s.acks.replicas, s.acks.timeout), false
	}
	return execErr, nil, true
}

// failUnsent gives each of cmds, none of which was sent, the error that
// kept it back. A caller that reads the commands (Decide's SET NX) would
// take one without an error for a write that was made, and on a cluster
// one node's error is joined with other nodes' redis.Nil.
func failUnsent(cmds []redis.Cmder, err error) {
	for _, c := range cmds {
		c.SetErr(err)
	}
}

func waitName(m ackMode) string {
	if m.aof {
		return "WAITAOF"
	}
	return "WAIT"
}

func parseWait(m ackMode, v any) (replicas, local int64, err error) {
	if !m.aof {
		n, err := num(v)
		return n, 0, err
	}
	pair, ok := v.([]any)
	if !ok || len(pair) != 2 {
		return 0, 0, fmt.Errorf("WAITAOF: unexpected reply %v", v)
	}
	if local, err = num(pair[0]); err != nil {
		return 0, 0, err
	}
	replicas, err = num(pair[1])
	return replicas, local, err
}

func (s *Store) forgetMode(addr string) {
	s.acks.mu.Lock()
	delete(s.acks.modes, addr)
	s.acks.mu.Unlock()
}

// ackMode finds out, once per node, whether WAITAOF is there: Redis 7.2
// and later with appendonly yes fsync the write on the replicas (and
// locally) before they answer, where WAIT only has it in their memory.
func (s *Store) ackMode(ctx context.Context, c redis.Cmdable) (ackMode, string, error) {
	addr := ""
	if rc, ok := c.(*redis.Client); ok {
		addr = rc.Options().Addr
	}
	s.acks.mu.Lock()
	m, ok := s.acks.modes[addr]
	s.acks.mu.Unlock()
	if ok && addr != "" && (m.again.IsZero() || time.Now().Before(m.again)) {
		return m, addr, nil
	}
	info, err := c.Info(ctx, "server", "persistence").Result()
	if err != nil {
		return ackMode{}, addr, err
	}
	fields := infoFields(info)
	m = ackMode{}
	if rc, ok := c.(*redis.Client); ok && versionAtLeast(fields["redis_version"], 7, 2) && fields["aof_enabled"] == "1" {
		aof, err := s.probeWaitAOF(ctx, rc)
		if err != nil {
			return ackMode{}, addr, err
		}
		if aof {
			m = ackMode{aof: true, numlocal: 1}
		} else {
			m.again = time.Now().Add(probeAgain)
		}
	}
	s.acks.mu.Lock()
	if s.acks.modes == nil {
		s.acks.modes = map[string]ackMode{}
	}
	s.acks.modes[addr] = m
	s.acks.mu.Unlock()
	return m, addr, nil
}

// probeWaitAOF writes a short-lived probe key and asks WAITAOF for it: a
// replica without appendonly yes never acknowledges an fsync, and waiting
// for one would pause every write for good. Where the probe falls short
// the store waits with WAIT, which still covers a failover (CheckServer
// warns). A replica that is rewriting its AOF after a sync falls short
// too: WAIT then, and another probe a minute later.
func (s *Store) probeWaitAOF(ctx context.Context, node *redis.Client) (bool, error) {
	// Under <prefix>:probe:, where no entry's name can be (entries are
	// <prefix>:{<pipeline>:<key>}).
	key := s.prefix + ":probe:{replica-ack}"
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		// A key of a slot this node serves, or the write is MOVED.
		for i := 0; i < 10000; i++ {
			k := s.prefix + ":probe:{replica-ack-" + strconv.Itoa(i) + "}"
			if m, err := cc.MasterForKey(ctx, k); err == nil && m.Options().Addr == node.Options().Addr {
				key = k
				break
			}
		}
	}
	conn := node.Conn()
	defer conn.Close()
	pipe := conn.Pipeline()
	pipe.Set(ctx, key, "1", time.Second)
	wait := pipe.Do(ctx, "WAITAOF", 1, s.acks.replicas, max(s.acks.timeout.Milliseconds(), 1))
	if _, err := pipe.Exec(ctx); err != nil {
		var rerr redis.Error
		if errors.As(err, &rerr) {
			return false, nil // no WAITAOF after all (renamed, or refused)
		}
		return false, err
	}
	replicas, local, err := parseWait(ackMode{aof: true}, wait.Val())
	return err == nil && local >= 1 && replicas >= int64(s.acks.replicas), nil
}

// waitsWithAOF reports, for CheckServer, whether writes to node wait with
// WAITAOF, and whether the server would have it.
func (s *Store) waitsWithAOF(ctx context.Context, node *redis.Client) (aof, possible bool, err error) {
	m, _, err := s.ackMode(ctx, node)
	if err != nil {
		return false, false, err
	}
	info, err := node.Info(ctx, "server", "persistence").Result()
	if err != nil {
		return false, false, err
	}
	f := infoFields(info)
	return m.aof, versionAtLeast(f["redis_version"], 7, 2) && f["aof_enabled"] == "1", nil
}

// infoFields parses the key:value lines of INFO.
func infoFields(info string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out
}

// versionAtLeast compares a redis_version such as 7.0.15 with major.minor.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

// evalSha builds the EVALSHA of script as a command that a pipeline of
// any node can carry (Script.EvalSha queues it on one at once).
func evalSha(ctx context.Context, script *redis.Script, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := redis.NewCmd(ctx, append(cmdArgs, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}
