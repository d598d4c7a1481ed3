package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemstream/idemstream/internal/retry"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer/group"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// Broker is what a pipeline needs from Kafka besides group membership:
// reading partitions, writing records with their offsets handed back, and
// end offsets. sinks.Kafka implements it; tests substitute writers that
// fail after sending.
type Broker interface {
	Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error)
	Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error)
	EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error)
	StartOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error)
	Partitions(ctx context.Context, topic string) (int, error)
}

// committer commits the next offset to read of a partition of the input.
// memberCommitter implements it, through the group member.
type committer interface {
	CommitOffsets(ctx context.Context, offsets map[string]map[int]int64) error
}

// Config configures one pipeline.
type Config struct {
	Name    string
	Input   string
	Output  string
	DLQ     string
	Replies string
	// Group is the consumer group; Brokers and Dialer reach the cluster.
	Group   string
	Brokers []string
	Dialer  *kafka.Dialer

	Decider *dedupe.Decider
	Store   dedupe.Store
	Broker  Broker
	Handler Handler // nil: Forward
	Metrics *Metrics
	Logger  *slog.Logger

	// Instance names this process in owner tokens (default instanceID:
	// host, pid, a nonce). New adds a nonce of its own to a name given
	// here: an owner token must never pass from one incarnation to the
	// next, since a key held under a token its owner recognises is
	// resumed at once, and a static member restarted under its identity
	// keeps its generation (and a pod keeps its host name and pid 1).
	Instance string
	// BatchSize bounds the records decided together (default
	// DefaultBatchSize; `idemstream run --batch-size`). A
	// fetch larger than that is decided in several batches. Each batch
	// pays fixed costs (a TIME, a pipeline per store call, a produce
	// request per output partition, an offset commit), so larger batches
	// cost less per record: 1000 against 500 took the consumer 10% less
	// CPU per record in make load, and Redis and the broker a little less
	// too. The price is latency under a backlog (about 300 ms from fetch
	// to commit-ready then, against 260) and the records redone after a
	// crash. A Handler that takes milliseconds per record wants smaller
	// batches: a member whose partitions are revoked abandons the batch
	// in hand if it does not finish within DrainTimeout.
	BatchSize int
	// MaxWait is the long-poll time of a fetch (default 250ms).
	MaxWait time.Duration
	// SettleWait is how long a write whose outcome is unknown may take to
	// become visible before the output partition is scanned for it
	// (DefaultSettleWait).
	SettleWait time.Duration
	// WriteTimeout bounds one write of a batch's results (default
	// writeBudget, the Kafka client's timeout). The lease must outlast
	// SettleWait plus WriteTimeout.
	WriteTimeout time.Duration
	// SessionTimeout of the group membership (default 10s).
	SessionTimeout time.Duration
	// InstanceID makes the member static (kafka.instance_id): a restart
	// under the same id takes its partitions back without a rebalance.
	// Assignor is group.CooperativeSticky (the default) or group.Range.
	// LeaveOnStop makes a static member leave the group when it stops in
	// order (kafka.leave_on_stop).
	InstanceID  string
	LeaveOnStop bool
	Assignor    string
	// Identity names what makes this pipeline's decisions this pipeline's:
	// its input, output, group, store namespace and key rule. Every result
	// carries it (idemstream-pipeline), and Run refuses to start when the
	// latest result of an output partition names another identity, unless
	// that is AcceptIdentity: a renamed pipeline, prefix or group, or a
	// changed key rule, would decide again every command whose entry it
	// cannot see. Empty: not checked.
	Identity       string
	AcceptIdentity string
	// Start is where the group begins a partition it has no committed
	// offset for (pipelines[].start): the earliest record by default.
	Start StartAt
	// DrainTimeout is how long a member whose partitions are revoked (a
	// rebalance, SIGTERM) goes on with the batch in hand, so that the next
	// owner finds its keys completed rather than PENDING; what is not done
	// by then is abandoned (see protocol.go). It must stay below the
	// rebalance timeout (SessionTimeout): default half of it.
	DrainTimeout time.Duration
}

// StartAt is where a group with no committed offset begins: the earliest
// record the partition holds (the zero value), the latest (Latest: only
// records written from now on), or the first record at or after Time. A
// new group that starts at the earliest record decides every command the
// input still holds whose entry is gone: right for a new pipeline, a
// second result for each such command if the pipeline was only renamed.
type StartAt struct {
	Latest bool
	Time   time.Time
}

// offsetsAt is the Broker of a pipeline that starts at a time.
type offsetsAt interface {
	OffsetsAt(ctx context.Context, topic string, partitions []int, t time.Time) (map[int]int64, error)
}

// DefaultSettleWait is 1.5 × Kafka's default replica.lag.time.max.ms
// (30s): a record the leader appended becomes visible once every in-sync
// follower has it or the leader drops the laggard from the ISR, which it
// checks every half of replica.lag.time.max.ms.
const DefaultSettleWait = 45 * time.Second

// DefaultBatchSize is Config.BatchSize when it is not set: see there for
// what the size trades.
const DefaultBatchSize = 1000

// DefaultDrainTimeout is `idemstream run`'s --drain-timeout, and
// Config.DrainTimeout when neither it nor the session timeout is set: half
// the session timeout, so that a revoked batch finishes before the group
// gives up on the member.
const DefaultDrainTimeout = 5 * time.Second

// commitTimeout and groupLeaveTimeout bound one offset commit (tried again
// by the partition while it is owned) and leaving the group
// (group.LeaveTimeout: a FindCoordinator and a LeaveGroup request).
const (
	commitTimeout     = 5 * time.Second
	groupLeaveTimeout = group.LeaveTimeout
)

// errLeaseTooShort is a lease a successor could outwait before a write of
// unknown outcome has settled (doc.go): it could scan, miss the result and
// write a second.
var errLeaseTooShort = errors.New("lease too short")

// StopTimeout is how long Run takes to return once its context ends, for
// a pipeline whose DrainTimeout is drain, when Kafka and the store answer:
// each partition finishes the batch in hand for up to drain, abandons what
// is left (a release, and for a batch that waited a second store call,
// up to 3 s each), the last commit in flight ends, and the member leaves
// the group. A broker that does not answer can make leaving take longer
// (each dial up to 10 s); a process killed then only makes its partitions
// wait for the session timeout. A handler that ignores its context is not
// bounded. A deployment's grace period after SIGTERM should cover it.
func StopTimeout(drain time.Duration) time.Duration {
	return drain + 2*abandonTimeout + commitTimeout + groupLeaveTimeout
}

// instanceID names this process in owner tokens: host, pid and a random
// nonce, so that no two processes (nor one restarted) ever share a holder.
func instanceID() string {
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + nonce()
}

// nonce is eight random hex digits.
func nonce() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Pipeline consumes one input topic as one consumer group member.
type Pipeline struct {
	cfg      Config
	identity []byte // cfg.Identity, shared by every result's header
	canon    *dedupe.Canonicalizer
	policy   dedupe.Policy
	log      *slog.Logger

	joined   atomic.Bool
	pausedN  atomic.Int32
	pauseWhy atomic.Pointer[string] // the latest pause's cause, for /readyz

	lastBurst atomic.Int64
	runs      atomic.Int64 // partition runs started, for holder names
	// stop ends Run with an error that retrying cannot cure.
	stop context.CancelCauseFunc
}

// New checks the configuration. It starts nothing: Run does.
func New(cfg Config) (*Pipeline, error) {
	switch {
	case cfg.Name == "" || cfg.Input == "" || cfg.Output == "" || cfg.DLQ == "":
		return nil, errors.New("consumer: name, input, output and dlq are required")
	case cfg.Decider == nil || cfg.Store == nil || cfg.Broker == nil:
		return nil, errors.New("consumer: decider, store and broker are required")
	}
	if cfg.Handler == nil {
		cfg.Handler = HandlerFunc(Forward)
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 250 * time.Millisecond
	}
	if cfg.SettleWait <= 0 {
		cfg.SettleWait = DefaultSettleWait
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 10 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = writeBudget
	}
	if lease := cfg.Decider.Policy().Lease(); lease < cfg.SettleWait+cfg.WriteTimeout {
		return nil, fmt.Errorf("consumer: %w: the lease (%v, twice pending_timeout) must outlast the settle wait (%v) plus a write (%v): raise pending_timeout or lower the settle wait",
			errLeaseTooShort, lease, cfg.SettleWait, cfg.WriteTimeout)
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = cfg.SessionTimeout / 2
	}
	if _, ok := cfg.Broker.(offsetsAt); !cfg.Start.Time.IsZero() && !ok {
		return nil, fmt.Errorf("consumer: a start time needs a Broker that lists offsets by time (%T does not)", cfg.Broker)
	}
	if cfg.Start.Latest && !cfg.Start.Time.IsZero() {
		return nil, errors.New("consumer: start at the latest record or at a time, not both")
	}
	if cfg.DrainTimeout >= cfg.SessionTimeout {
		return nil, fmt.Errorf("consumer: drain timeout %v must be shorter than the session (rebalance) timeout %v", cfg.DrainTimeout, cfg.SessionTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Instance == "" {
		cfg.Instance = instanceID()
	} else {
		cfg.Instance += "-" + nonce()
	}
	p := &Pipeline{
		cfg:      cfg,
		canon:    cfg.Decider.Canonicalizer(),
		policy:   cfg.Decider.Policy(),
		log:      cfg.Logger.With("pipeline", cfg.Name),
		identity: []byte(cfg.Identity),
	}
	if cfg.Metrics != nil {
		reasons := []string{}
		for _, r := range dedupe.Reasons {
			reasons = append(reasons, string(r))
		}
		cfg.Metrics.initPipeline(cfg.Name, reasons)
	}
	return p, nil
}

// Ready reports whether the pipeline is a member of its group and not
// paused by an unreachable store or broker.
func (p *Pipeline) Ready() bool { return p.joined.Load() && p.pausedN.Load() == 0 }

// PauseCause says why a partition of the pipeline is paused ("" when none
// is), so that /readyz names the server that does not answer.
func (p *Pipeline) PauseCause() string {
	if p.pausedN.Load() == 0 {
		return ""
	}
	if why := p.pauseWhy.Load(); why != nil {
		return *why
	}
	return ""
}

// Name is the pipeline's name.
func (p *Pipeline) Name() string { return p.cfg.Name }

// Run joins the group and processes assignments until ctx ends. It returns
// nil after a clean shutdown: every partition drained or abandoned,
// nothing committed that is not durable, the group left. It returns an
// error when something refuses for good (a missing topic, an authorization
// error, a dead letter the topic will not take): retrying would loop for
// ever, and nothing past the record concerned may be committed.
func (p *Pipeline) Run(parent context.Context) error {
	ctx, stop := context.WithCancelCause(parent)
	defer stop(nil)
	p.stop = stop
	if err := p.checkTopics(ctx); err != nil {
		return fmt.Errorf("pipeline %s: %w", p.cfg.Name, err)
	}
	if err := p.checkIdentity(ctx); err != nil {
		return fmt.Errorf("pipeline %s: %w", p.cfg.Name, err)
	}
	client, transport := p.groupClient()
	defer transport.CloseIdleConnections()
	// The partitions' drains outlive ctx: a SIGTERM, or a pipeline that
	// stops on an error, drains them as a revocation does.
	hard, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	parts := newAssignment(p, hard)
	member, err := group.New(group.Config{
		Group: p.cfg.Group, Topic: p.cfg.Input, Client: client,
		InstanceID: p.cfg.InstanceID, LeaveOnStop: p.cfg.LeaveOnStop, Assignor: p.cfg.Assignor,
		SessionTimeout: p.cfg.SessionTimeout, RebalanceTimeout: p.rebalanceTimeout(),
		HeartbeatInterval: p.cfg.SessionTimeout / 5,
		Joined:            p.joinedGeneration,
		Logger:            p.log,
	}, parts)
	if err != nil {
		return fmt.Errorf("pipeline %s: consumer group: %w", p.cfg.Name, err)
	}
	parts.commits = newSharedCommitter(memberCommitter{m: member, topic: p.cfg.Input, timeout: commitTimeout})
	err = member.Run(ctx)
	p.joined.Store(false)
	// Run revoked everything it owned on the way out; what a fenced member
	// still runs is lost.
	parts.stopAll(true)
	if err != nil {
		return fmt.Errorf("pipeline %s: %w", p.cfg.Name, err)
	}
	if cause := context.Cause(ctx); parent.Err() == nil && cause != nil {
		return fmt.Errorf("pipeline %s stopped: %w", p.cfg.Name, cause)
	}
	return nil
}

// rebalanceTimeout is how long the group waits for this member to join
// again once a rebalance began: it may be revoking partitions then (under
// range, all of them), which takes up to the drain, the abandon of what is
// left and the last commit, and it learns of the rebalance from a
// heartbeat, which the session bounds.
func (p *Pipeline) rebalanceTimeout() time.Duration {
	return p.cfg.DrainTimeout + 2*abandonTimeout + commitTimeout + p.cfg.SessionTimeout
}

func (p *Pipeline) startOffset() int64 {
	if p.cfg.Start.Latest {
		return kafka.LastOffset
	}
	return kafka.FirstOffset
}

func (p *Pipeline) startName() string {
	switch {
	case p.cfg.Start.Latest:
		return "latest"
	case !p.cfg.Start.Time.IsZero():
		return p.cfg.Start.Time.Format(time.RFC3339)
	}
	return "earliest"
}

// startAt resolves, once, the start of a partition the group has no
// committed offset for, when the pipeline starts at the latest record or
// at a time (kafka-go's group knows only the earliest and the latest, and
// a fetch from "the latest" that returns nothing would be resolved again
// by the next one, skipping what arrived between them).
func (p *Pipeline) startAt(ctx context.Context, pz *pauser, partition int) (int64, error) {
	for {
		var offs map[int]int64
		var err error
		if p.cfg.Start.Time.IsZero() {
			offs, err = p.cfg.Broker.EndOffsets(ctx, p.cfg.Input, []int{partition})
		} else {
			offs, err = p.cfg.Broker.(offsetsAt).OffsetsAt(ctx, p.cfg.Input, []int{partition}, p.cfg.Start.Time)
		}
		if err == nil {
			if off, ok := offs[partition]; ok {
				pz.resume()
				return off, nil
			}
			err = fmt.Errorf("no offset listed for %s/%d: %w", p.cfg.Input, partition, dedupe.ErrBrokerUnavailable)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if !dedupe.IsRetryable(err) {
			return 0, err
		}
		pz.pause(ctx, "list offsets by time", err)
	}
}

// topicWait bounds how long Run waits at start for a topic the cluster
// says does not exist (one being created is not known everywhere at once).
var topicWait = 30 * time.Second

// checkTopics refuses to start on topics that do not exist: every batch
// would otherwise pause on them for ever.
func (p *Pipeline) checkTopics(ctx context.Context) error {
	deadline := time.Now().Add(topicWait)
	again := retry.Backoff{Min: time.Second, Max: 30 * time.Second}
	for _, topic := range []string{p.cfg.Input, p.cfg.Output, p.cfg.DLQ, p.cfg.Replies} {
		if topic == "" {
			continue
		}
		for attempt := 1; ; attempt++ {
			_, err := p.cfg.Broker.Partitions(ctx, topic)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, sinks.ErrUnknownTopic) && time.Now().After(deadline) {
				return fmt.Errorf("topic %s does not exist (create it, or fix the pipeline's topics): %w: %w", topic, dedupe.ErrBrokerRefused, err)
			}
			if !dedupe.IsRetryable(err) {
				return err
			}
			// An unknown topic is waited for second by second (it may be
			// being created); an unreachable cluster with a backoff; the
			// log thins out as the attempts grow.
			wait := time.Second
			if !errors.Is(err, sinks.ErrUnknownTopic) {
				wait = again.Next()
			}
			if attempt&(attempt-1) == 0 || attempt%30 == 0 { // 1, 2, 4, 8, ... and every 30th
				p.log.Warn("reading topic metadata failed; retrying", "topic", topic, "after", wait, "err", err)
			}
			if retry.Sleep(ctx, wait) != nil {
				return nil
			}
		}
	}
	return nil
}

// ErrIdentityChanged is a pipeline whose output holds results of another
// identity (Config.Identity).
var ErrIdentityChanged = errors.New("pipeline identity changed")

// checkIdentity reads the latest record of every output partition and
// refuses to start when a result there names another identity than this
// pipeline's (or the one the operator accepted).
func (p *Pipeline) checkIdentity(ctx context.Context) error {
	if p.cfg.Identity == "" {
		return nil
	}
	for attempt := 0; ; attempt++ {
		other, err := p.otherIdentity(ctx)
		if err == nil {
			if other == "" || other == p.cfg.AcceptIdentity {
				return nil
			}
			return fmt.Errorf("%w: the latest results in %s were written as %q, this pipeline is %q: "+
				"it would decide again every command whose entry it cannot see (a renamed pipeline, prefix or group starts afresh, and a new group reads the input from its start); "+
				"restore the old name, prefix, group or key rule, or, if the change is intended, set the pipeline's accept_identity to %q: %w",
				ErrIdentityChanged, p.cfg.Output, other, p.cfg.Identity, other, dedupe.ErrBrokerRefused)
		}
		if ctx.Err() != nil {
			return nil
		}
		if !dedupe.IsRetryable(err) {
			return err
		}
		if attempt == 0 || attempt%30 == 0 {
			p.log.Warn("reading the latest results failed; retrying", "topic", p.cfg.Output, "err", err)
		}
		if retry.Sleep(ctx, time.Second) != nil {
			return nil
		}
	}
}

// otherIdentity returns the identity named by the latest result of an
// output partition when it differs from this pipeline's, or "".
func (p *Pipeline) otherIdentity(ctx context.Context) (string, error) {
	n, err := p.cfg.Broker.Partitions(ctx, p.cfg.Output)
	if err != nil {
		return "", err
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	ends, err := p.cfg.Broker.EndOffsets(ctx, p.cfg.Output, parts)
	if err != nil {
		return "", err
	}
	starts, err := p.cfg.Broker.StartOffsets(ctx, p.cfg.Output, parts)
	if err != nil {
		return "", err
	}
	for _, q := range parts {
		if ends[q] <= starts[q] {
			continue
		}
		recs, _, err := p.cfg.Broker.Fetch(ctx, p.cfg.Output, q, ends[q]-1, 10*time.Millisecond)
		if errors.Is(err, kafka.OffsetOutOfRange) {
			continue
		}
		if err != nil {
			return "", err
		}
		for _, rec := range recs {
			if id, ok := sinks.HeaderValue(rec.Headers, sinks.HeaderPipeline); ok && id != p.cfg.Identity {
				return id, nil
			}
		}
	}
	return "", nil
}

// drainContext returns a context for the work of a partition that ends
// drain after gen ends, or when the returned cancel is called: revocation
// stops fetching at once, and lets the batch in hand finish for a while.
func drainContext(gen, hard context.Context, drain time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(hard)
	var mu sync.Mutex
	var timer *time.Timer
	stopAfter := context.AfterFunc(gen, func() {
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(drain, cancel)
	})
	return ctx, func() {
		stopAfter()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// prefetcher reads a partition one fetch ahead of the batches being
// decided, so that the broker's round trip overlaps the store's and the
// handler's work. Order is untouched: records are decided and committed in
// offset order, and a fetch from another offset than the one needed next
// is thrown away.
type prefetcher struct {
	p         *Pipeline
	gen       context.Context
	partition int
	next      chan fetched
	from      int64
}

type fetched struct {
	recs []sinks.Fetched
	hw   int64
	err  error
	at   time.Time // when the fetch returned
}

func (f *prefetcher) start(from int64) {
	ch := make(chan fetched, 1)
	f.next, f.from = ch, from
	go func() {
		recs, hw, err := f.p.cfg.Broker.Fetch(f.gen, f.p.cfg.Input, f.partition, from, f.p.cfg.MaxWait)
		ch <- fetched{recs, hw, err, time.Now()}
	}()
}

// topUpAfter is how long a fetch ahead that reached the end of the
// partition may wait before its batch starts without being topped up.
const topUpAfter = 2 * time.Millisecond

// fetch returns the records from offset: the fetch ahead when it started
// there, a new one otherwise.
//
// A fetch ahead that reached the end of the partition returned as soon as
// the first records arrived, and then waited for the batch before it: the
// records that arrived meanwhile are read at once and appended, so that a
// consumer that keeps up decides what is there when its batch starts, not
// what was there one batch earlier (the latency of a record would
// otherwise be about two batches, not one). With a backlog, a fetch ahead
// is full and is taken as it is.
func (f *prefetcher) fetch(offset int64) ([]sinks.Fetched, int64, error) {
	if f.next == nil || f.from != offset {
		f.wait()
		f.start(offset)
	}
	r := <-f.next
	f.next = nil
	if r.err != nil || len(r.recs) == 0 || time.Since(r.at) < topUpAfter {
		return r.recs, r.hw, r.err
	}
	end := r.recs[len(r.recs)-1].Offset + 1
	if r.hw-end >= int64(f.p.cfg.BatchSize) {
		// A backlog: the fetch ahead is as full as a fetch gets.
		// (Nearly at the end, as behind a transaction marker, it is
		// topped up.)
		return r.recs, r.hw, nil
	}
	more, hw, err := f.p.cfg.Broker.Fetch(f.gen, f.p.cfg.Input, f.partition, end, time.Millisecond)
	if err != nil || len(more) == 0 {
		// The records in hand go on; the next fetch meets the error.
		return r.recs, r.hw, nil
	}
	return append(r.recs, more...), hw, nil
}

// wait lets a fetch ahead finish (it ends with the generation's context).
func (f *prefetcher) wait() {
	if f.next != nil {
		<-f.next
		f.next = nil
	}
}

// runPartition processes one assigned partition until its generation ends.
// Once it ends, no new batch starts; the one in hand has DrainTimeout to
// finish and commit.
func (p *Pipeline) runPartition(gen, hard context.Context, commit committer, genID int32, partition int, offset int64) {
	// A member that rejoins after a connection blip can get the same
	// generation ID: the run number keeps its new run from passing for the
	// old one, which may have a write of unknown outcome in flight.
	holder := p.cfg.Instance + "/g" + strconv.Itoa(int(genID)) + "r" + strconv.FormatInt(p.runs.Add(1), 10) +
		"/" + p.cfg.Input + "/" + strconv.Itoa(partition)
	log := p.log.With("partition", partition)
	ctx, cancel := drainContext(gen, hard, p.cfg.DrainTimeout)
	defer cancel()
	run := &partitionWork{p: p, gen: gen, ctx: ctx, commit: commit, partition: partition, offset: offset, holder: holder, log: log,
		pz:      &pauser{p: p, log: log},
		ahead:   &prefetcher{p: p, gen: gen, partition: partition},
		refetch: retry.Backoff{Min: 200 * time.Millisecond, Max: 10 * time.Second}}
	defer run.pz.done()
	defer func() { p.inflight(-run.held) }()
	defer run.ahead.wait()
	if !run.begin() {
		return
	}
	for gen.Err() == nil {
		if !run.next() {
			return
		}
	}
}

// partitionWork is one partition's work in one generation: where it has
// committed to, what it holds, and how it reads again after a failure.
type partitionWork struct {
	p         *Pipeline
	gen, ctx  context.Context // the generation's, and the drain's that outlives it
	commit    committer
	partition int
	holder    string
	log       *slog.Logger
	pz        *pauser
	ahead     *prefetcher
	refetch   retry.Backoff
	// offset is the next record to process, committed; held the records
	// fetched and not yet committed or dropped; hw the partition's high
	// watermark at the last fetch.
	offset int64
	held   int
	hw     int64
	// batch is the batch in hand, for commitTo.
	batch []sinks.Fetched
}

// begin resolves where a partition without a committed offset starts, as
// the pipeline's start says, and commits it at once: resolved again by the
// next owner, "latest" would skip what this one read and did not finish.
// It reports whether the run goes on.
func (r *partitionWork) begin() bool {
	p := r.p
	if !((r.offset == kafka.FirstOffset && !p.cfg.Start.Time.IsZero()) || r.offset == kafka.LastOffset) {
		return true
	}
	start, err := p.startAt(r.gen, r.pz, r.partition)
	if err != nil {
		if r.gen.Err() == nil {
			p.stop(fmt.Errorf("start of %s/%d at %s: %w", p.cfg.Input, r.partition, p.startName(), err))
		}
		return false
	}
	r.log.Info("no committed offset: starting where the pipeline's start says", "start", p.startName(), "offset", start)
	if !p.commit(r.ctx, r.pz, r.commit, r.partition, start) {
		return false
	}
	r.offset = start
	return true
}

// next fetches from the offset and processes what it gets, batch by batch.
// It reports whether the run goes on.
func (r *partitionWork) next() bool {
	p := r.p
	recs, hw, err := r.ahead.fetch(r.offset)
	if err == nil && len(recs) > 0 {
		// The next records are read while these are decided; a batch
		// dropped below reads from its offset again instead.
		r.ahead.start(recs[len(recs)-1].Offset + 1)
	}
	if err != nil {
		return r.fetchFailed(err)
	}
	r.pz.resume()
	fetched := time.Now()
	r.hw = hw
	p.setLag(r.partition, hw, r.offset, recs)
	r.held = len(recs)
	p.inflight(r.held)
	fl := &floors{}
	for start := 0; start < len(recs) && r.gen.Err() == nil; start += p.cfg.BatchSize {
		r.batch = recs[start:min(start+p.cfg.BatchSize, len(recs))]
		err := p.processBatch(r.ctx, r.pz, r.holder, r.batch, fetched, fl, r.commitTo)
		if err == nil {
			r.refetch.Reset()
			r.commitTo(r.batch[len(r.batch)-1].Offset + 1)
			continue
		}
		// Whatever comes next, the rest of what was fetched is read
		// again (or by the next owner).
		return r.batchFailed(err)
	}
	return true
}

// fetchFailed handles a fetch's error: the end of the generation ends the
// run; an offset out of range starts again from the earliest record; an
// error that may pass pauses the partition; any other stops the pipeline.
func (r *partitionWork) fetchFailed(err error) bool {
	p := r.p
	if r.gen.Err() != nil {
		return false
	}
	if errors.Is(err, kafka.OffsetOutOfRange) {
		r.log.Warn("committed offset out of range; starting from the earliest record", "offset", r.offset)
		r.offset = kafka.FirstOffset
		return true
	}
	if !dedupe.IsRetryable(err) {
		p.stop(fmt.Errorf("fetch %s/%d: %w", p.cfg.Input, r.partition, err))
		return false
	}
	r.pz.pause(r.gen, "fetch", err)
	return true
}

// commitTo commits the batch in hand's records up to next: the batch
// commits what is complete before it waits for keys held elsewhere, then
// the rest.
func (r *partitionWork) commitTo(next int64) {
	if next <= r.offset {
		return
	}
	r.p.commit(r.ctx, r.pz, r.commit, r.partition, next)
	done := 0
	for _, rec := range r.batch {
		if rec.Offset < next && rec.Offset >= r.offset {
			done++
		}
	}
	r.offset = next
	r.p.inflight(-done)
	r.held -= done
	r.p.setLag(r.partition, r.hw, r.offset, nil)
}

// batchFailed handles a batch that ended without its commit, and reports
// whether the run goes on.
func (r *partitionWork) batchFailed(err error) bool {
	p := r.p
	if m := p.cfg.Metrics; m != nil {
		m.batchesAbandoned.WithLabelValues(p.cfg.Name).Inc()
	}
	if r.ctx.Err() != nil {
		r.log.Info("revoked: the batch in hand did not finish within the drain time; its records go to the next owner",
			"offset", r.offset, "drain", p.cfg.DrainTimeout)
		return false
	}
	if !errors.Is(err, errFenced) && !dedupe.IsRetryable(err) {
		// Only a fenced batch, or one that met an error that may pass,
		// is worth reading again: anything else that ends a batch would
		// end it again (a record the topic refuses, a store that refuses
		// a request), and reading it again and again would write its
		// dead letters and results again each time.
		r.log.Error("stopping: an error that retrying cannot cure; nothing past it is committed", "offset", r.offset, "err", err)
		p.stop(err)
		return false
	}
	// Fenced (another worker took a key over), or an error that may
	// pass: drop the batch, commit nothing, and read again from the last
	// committed offset after a pause that grows while it happens again;
	// the store decides what comes back.
	wait := r.refetch.Next()
	r.log.Warn("batch dropped without commit; its records are read again", "offset", r.offset, "after", wait, "err", err)
	p.inflight(-r.held)
	r.held = 0
	return retry.Sleep(r.gen, wait) == nil
}

// commit commits next as the partition's offset, and tries again with
// backoff while it fails and the partition's work goes on, reporting not
// ready meanwhile: a lost commit leaves completed records to be read
// again, and once their window ends they would be decided new (doc.go,
// "Assumptions"). A refusal that cannot pass (authorization) stops the
// pipeline. false: the partition's work ends.
func (p *Pipeline) commit(ctx context.Context, pz *pauser, commit committer, partition int, next int64) bool {
	wait := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		err := commit.CommitOffsets(ctx, map[string]map[int]int64{p.cfg.Input: {partition: next}})
		if err == nil {
			pz.resume()
			return true
		}
		if m := p.cfg.Metrics; m != nil {
			m.commitErrors.WithLabelValues(p.cfg.Name).Inc()
		}
		if ctx.Err() != nil || isNotOwned(err) {
			pz.log.Warn("offset commit failed as the partition was revoked; its records are read again", "offset", next, "err", err)
			return false
		}
		if group.IsFatal(err) {
			pz.log.Error("stopping: the group coordinator refuses the offset commit", "offset", next, "err", err)
			p.stop(fmt.Errorf("commit %s/%d: %w: %w", p.cfg.Input, partition, dedupe.ErrBrokerRefused, err))
			return false
		}
		if attempt == 1 || attempt%10 == 0 {
			pz.log.Warn("offset commit failed; retrying", "offset", next, "attempt", attempt, "err", err)
		}
		if attempt == 3 {
			pz.pause(ctx, "offset commit", err)
		}
		if retry.Sleep(ctx, wait.Next()) != nil {
			return false
		}
	}
}

func (p *Pipeline) setLag(partition int, hw, offset int64, recs []sinks.Fetched) {
	if p.cfg.Metrics == nil {
		return
	}
	if offset < 0 {
		// No committed offset yet: the lag runs from the first record
		// fetched, and an empty fetch from the start means nothing to read.
		if len(recs) == 0 {
			offset = hw
		} else {
			offset = recs[0].Offset
		}
	}
	lag := max(hw-offset, 0)
	p.cfg.Metrics.lag.WithLabelValues(p.cfg.Name, strconv.Itoa(partition)).Set(float64(lag))
}

// pauser tracks one partition's pause: while its store or broker calls
// fail, the pipeline reports not ready, and nothing is decided, written or
// committed. One log line when it pauses, one when it resumes.
type pauser struct {
	p      *Pipeline
	log    *slog.Logger
	paused bool
	since  time.Time
}

func (z *pauser) pause(ctx context.Context, what string, err error) {
	if !z.paused {
		z.paused, z.since = true, time.Now()
		z.p.pausedN.Add(1)
		z.log.Warn("paused: "+what+" failed; nothing is decided or committed until it answers", "err", err)
	}
	why := what + ": " + err.Error()
	z.p.pauseWhy.Store(&why)
	_ = retry.Sleep(ctx, 500*time.Millisecond)
}

func (z *pauser) resume() {
	if z.paused {
		z.paused = false
		z.p.pausedN.Add(-1)
		z.log.Info("resumed", "paused_for", time.Since(z.since).Round(time.Millisecond))
	}
}

// retryStore calls fn until the store answers: a retryable error pauses
// the partition and tries again, any other ends the batch.
func (z *pauser) retryStore(ctx context.Context, what string, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			z.resume()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !dedupe.IsRetryable(err) {
			return fmt.Errorf("%s: %w", what, err)
		}
		z.pause(ctx, what, err)
	}
}

func (z *pauser) done() {
	if z.paused {
		z.paused = false
		z.p.pausedN.Add(-1)
	}
}

// inflight counts records fetched and not yet committed (or dropped).
func (p *Pipeline) inflight(delta int) {
	if p.cfg.Metrics != nil {
		p.cfg.Metrics.inflight.WithLabelValues(p.cfg.Name).Add(float64(delta))
	}
}
