package consumer

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer/group"
)

// assignment is the pipeline's group.Handler: a goroutine per partition
// owned, started when the group hands the partition over and stopped when
// it takes it back. Under the cooperative assignor a partition that stays
// with the member keeps its goroutine across generations; only those that
// move stop.
type assignment struct {
	p       *Pipeline
	commits *sharedCommitter
	// hard ends every partition's drain at once: Run's end, once the
	// partitions were revoked or lost. A revoked partition finishes its
	// batch in hand within DrainTimeout unless its membership or hard ends
	// first.
	hard context.Context

	mu      sync.Mutex
	running map[int]*partitionRun
}

type partitionRun struct {
	revoke context.CancelFunc // stop fetching, drain the batch in hand
	lose   context.CancelFunc // stop at once
	done   chan struct{}
}

// newAssignment's commits are set once the member they go through is
// built: the member calls nothing before its Run.
func newAssignment(p *Pipeline, hard context.Context) *assignment {
	return &assignment{p: p, hard: hard, running: map[int]*partitionRun{}}
}

// Assigned starts a goroutine for each partition handed over, at the
// group's committed offset or, for a partition the group has none for,
// where the pipeline's start says.
func (a *assignment) Assigned(membership context.Context, g group.Generation, offsets map[int]int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for partition, offset := range offsets {
		if offset < 0 {
			offset = a.p.startOffset()
		}
		// hard ends with the membership (the group went on without this
		// member: stop at once) or the pipeline; gen, the partition's
		// ownership, ends with either, or with a revocation, which leaves
		// the drain its time.
		hard, cancel := context.WithCancel(membership)
		unhook := context.AfterFunc(a.hard, cancel)
		lose := func() { unhook(); cancel() }
		gen, revoke := context.WithCancel(hard)
		run := &partitionRun{revoke: revoke, lose: lose, done: make(chan struct{})}
		a.running[partition] = run
		go func() {
			defer close(run.done)
			a.p.runPartition(gen, hard, a.commits, int32(g.ID), partition, offset)
		}()
	}
}

// Revoked stops the partitions and waits until each has drained (its
// batch finished and committed, or abandoned after DrainTimeout), or
// until ctx ends, which stops what is left at once.
func (a *assignment) Revoked(ctx context.Context, _ group.Generation, partitions []int) {
	a.stop(ctx, partitions, false)
}

// Lost stops the partitions at once: another member may own them
// already, so nothing more is written or committed for them.
func (a *assignment) Lost(_ group.Generation, partitions []int) {
	a.p.log.Warn("rebalance: partitions lost (the group gave up on this member); their work stops at once", "partitions", partitions)
	a.stop(context.Background(), partitions, true)
	// Not ready until the member is back in a generation.
	a.p.joined.Store(false)
	if m := a.p.cfg.Metrics; m != nil {
		m.partitionsMoved.WithLabelValues(a.p.cfg.Name, "lost").Add(float64(len(partitions)))
		m.assignedPartitions.WithLabelValues(a.p.cfg.Name).Set(0)
		for _, partition := range partitions {
			m.lag.DeleteLabelValues(a.p.cfg.Name, strconv.Itoa(partition))
		}
	}
}

func (a *assignment) stop(ctx context.Context, partitions []int, lost bool) {
	a.mu.Lock()
	var runs []*partitionRun
	for _, partition := range partitions {
		if run := a.running[partition]; run != nil {
			run.revoke()
			if lost {
				run.lose()
			}
			runs = append(runs, run)
			delete(a.running, partition)
		}
	}
	a.mu.Unlock()
	for _, run := range runs {
		select {
		case <-run.done:
		case <-ctx.Done():
			run.lose()
			<-run.done
		}
		run.lose()
	}
}

// stopAll stops every partition still running (Run's end).
func (a *assignment) stopAll(lost bool) {
	a.mu.Lock()
	var partitions []int
	for partition := range a.running {
		partitions = append(partitions, partition)
	}
	a.mu.Unlock()
	slices.Sort(partitions)
	a.stop(context.Background(), partitions, lost)
}

// memberCommitter commits through the group member, under the generation
// in force when the request is sent.
type memberCommitter struct {
	m       *group.Member
	topic   string
	timeout time.Duration
}

func (c memberCommitter) CommitOffsets(ctx context.Context, offsets map[string]map[int]int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return c.m.Commit(ctx, offsets[c.topic])
}

// joinedGeneration is the member's report of a generation: readiness, the
// log, and the group metrics.
func (p *Pipeline) joinedGeneration(info group.JoinInfo) {
	p.joined.Store(true)
	p.log.Info("rebalance: generation joined", "group", p.cfg.Group, "generation", info.ID, "protocol", info.Protocol,
		"partitions", info.Assigned, "revoked", info.Revoked, "added", info.Added, "took", info.Took.Round(time.Millisecond))
	m := p.cfg.Metrics
	if m == nil {
		return
	}
	m.rebalances.WithLabelValues(p.cfg.Name).Inc()
	m.generation.WithLabelValues(p.cfg.Name).Set(float64(info.ID))
	m.assignedPartitions.WithLabelValues(p.cfg.Name).Set(float64(len(info.Assigned)))
	m.partitionsMoved.WithLabelValues(p.cfg.Name, "assigned").Add(float64(len(info.Added)))
	m.partitionsMoved.WithLabelValues(p.cfg.Name, "revoked").Add(float64(len(info.Revoked)))
	m.rebalanceSeconds.WithLabelValues(p.cfg.Name).Observe(info.Took.Seconds())
	for _, partition := range info.Revoked {
		m.lag.DeleteLabelValues(p.cfg.Name, strconv.Itoa(partition))
	}
}

// groupClient is the member's own connection to the cluster, with the
// pipeline's TLS and SASL: a JoinGroup waits up to the rebalance timeout,
// so the client's timeout outlasts it.
func (p *Pipeline) groupClient() (*kafka.Client, *kafka.Transport) {
	t := &kafka.Transport{DialTimeout: 10 * time.Second}
	if d := p.cfg.Dialer; d != nil {
		t.TLS, t.SASL, t.ClientID = d.TLS, d.SASLMechanism, d.ClientID
		if d.Timeout > 0 {
			t.DialTimeout = d.Timeout
		}
	}
	return &kafka.Client{Addr: kafka.TCP(p.cfg.Brokers...), Transport: t, Timeout: p.rebalanceTimeout() + 15*time.Second}, t
}

// errNotOwned says a commit was refused because the partition moved on.
func isNotOwned(err error) bool { return errors.Is(err, group.ErrNotOwned) }
