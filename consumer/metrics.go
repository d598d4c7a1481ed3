package consumer

import (
	"runtime"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus series of deploy/README.md ("Metrics"). They live on an
// injected Registerer so that tests and embedding programs keep their own.
type Metrics struct {
	records         *prometheus.CounterVec
	dlqRecords      *prometheus.CounterVec
	lenientMismatch *prometheus.CounterVec
	lag             *prometheus.GaugeVec
	decisionSeconds *prometheus.HistogramVec
	storeSeconds    *prometheus.HistogramVec
	storeErrors     *prometheus.CounterVec
	rebalances      *prometheus.CounterVec
	// The group: the generation this member is in, the partitions it owns,
	// partitions moved to it (assigned), from it in order (revoked) or
	// taken from it (lost), and how long each join took (the time its
	// partitions could not move).
	generation         *prometheus.GaugeVec
	assignedPartitions *prometheus.GaugeVec
	partitionsMoved    *prometheus.CounterVec
	rebalanceSeconds   *prometheus.HistogramVec
	inflight           *prometheus.GaugeVec
	buildInfo          *prometheus.GaugeVec
	// repliesSkipped counts replays that got no reply record, by reason:
	// pending (the key has no result yet), failed (its first copy failed),
	// unreadable (the stored result is gone from the output topic),
	// too_large (the replies topic refused the result for its size).
	repliesSkipped *prometheus.CounterVec
	// scanFloorTruncated counts recovery scans whose floor the output
	// partition no longer held (retention or DeleteRecords).
	scanFloorTruncated *prometheus.CounterVec
	// batchesAbandoned counts batches that ended before their outcomes
	// were durable (revoked past the drain time, fenced, a store or broker
	// refusal): their records are read again.
	batchesAbandoned *prometheus.CounterVec
	// commitErrors counts offset commits that failed (each is retried).
	commitErrors *prometheus.CounterVec
	// recordsTrimmed counts dead letters and replies written with less
	// than the whole input record, because the topic refused them for
	// their size.
	recordsTrimmed *prometheus.CounterVec
	// storeSettingsOK is 1 while the last check of the Redis settings
	// (store.redis.check_server, at start and every minute) passed, 0
	// while it refused them or has not run to a verdict yet (a recheck
	// the server does not answer keeps the last verdict); absent when nothing is
	// checked (a memory store, check_server: false). No labels.
	storeSettingsOK *prometheus.GaugeVec

	// storeForgot is 1 while the store is known to have lost decisions
	// it had made (see redisstore, "A store that forgot"): nothing is
	// decided until an operator accepts the loss or the longest window
	// has passed. It reads forgotOf (0 without a store that can tell).
	storeForgot prometheus.GaugeFunc
	forgotOf    atomic.Pointer[forgottenStore]

	// storeReplicaAckFailures counts store calls whose writes too few
	// replicas acknowledged in time (store.redis.min_replicas); each is
	// also a store error.
	storeReplicaAckFailures *prometheus.CounterVec
}

// NewMetrics creates the series and registers them on reg.
func NewMetrics(reg prometheus.Registerer, version string) (*Metrics, error) {
	const ns = "idemstream"
	m := &Metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "records_total",
			Help: "Input records by outcome; first+replay+conflict+invalid+failed = records consumed."}, []string{"pipeline", "outcome"}),
		dlqRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dlq_records_total",
			Help: "Records written to the dead-letter topic, by reason."}, []string{"pipeline", "reason"}),
		lenientMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lenient_mismatch_total",
			Help: "Lenient replays whose body differed from the first copy's."}, []string{"pipeline"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "consumer_lag",
			Help: "Records behind the high watermark, per partition this instance owns."}, []string{"pipeline", "partition"}),
		decisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "decision_duration_seconds",
			Help: "From fetch to commit-ready, per batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"pipeline"}),
		storeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "store_duration_seconds",
			Help: "Store calls, per operation.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "store_errors_total",
			Help: "Store calls that failed, per operation."}, []string{"op"}),
		storeReplicaAckFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "store_replica_ack_failures_total",
			Help: "Store calls whose writes fewer than store.redis.min_replicas replicas acknowledged in time (also counted as store errors)."}, []string{"op"}),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "rebalances_total",
			Help: "Consumer group generations joined."}, []string{"pipeline"}),
		generation: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "group_generation",
			Help: "The consumer group generation this member is in."}, []string{"pipeline"}),
		assignedPartitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "assigned_partitions",
			Help: "Input partitions this member owns."}, []string{"pipeline"}),
		partitionsMoved: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "partitions_moved_total",
			Help: "Input partitions assigned to this member, revoked from it in order, or lost (the group gave up on it)."}, []string{"pipeline", "change"}),
		rebalanceSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "rebalance_duration_seconds",
			Help: "From the start of a join to its assignment, per generation joined.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, []string{"pipeline"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "inflight_records",
			Help: "Records fetched and not yet committed."}, []string{"pipeline"}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
			Help: "Always 1; the labels say what runs."}, []string{"version", "go_version"}),
		repliesSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "replies_skipped_total",
			Help: "Replays that got no reply record, by reason (pending, failed, unreadable, too_large)."}, []string{"pipeline", "reason"}),
		scanFloorTruncated: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scan_floor_truncated_total",
			Help: "Recovery scans whose floor the output partition no longer held."}, []string{"pipeline"}),
		batchesAbandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batches_abandoned_total",
			Help: "Batches that ended before their outcomes were durable; their records are read again."}, []string{"pipeline"}),
		commitErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "commit_errors_total",
			Help: "Offset commits that failed; each is retried while the partition is owned."}, []string{"pipeline"}),
		recordsTrimmed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "records_trimmed_total",
			Help: "Dead letters and replies written without their whole payload (or key and headers): the topic refused them for their size."}, []string{"pipeline"}),
		storeSettingsOK: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "store_settings_ok",
			Help: "1 while the last check of the Redis settings (store.redis.check_server) passed, 0 while it refused them or none has run to a verdict."}, nil),
	}
	m.storeForgot = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "store_forgot",
		Help: "1 while the store is known to have lost decisions it had made: nothing is decided until `idemstream store accept-loss` or the longest window has passed."}, m.forgot)
	for _, c := range []prometheus.Collector{m.records, m.dlqRecords, m.lenientMismatch, m.lag, m.decisionSeconds,
		m.storeSeconds, m.storeErrors, m.storeReplicaAckFailures, m.rebalances, m.generation, m.assignedPartitions, m.partitionsMoved, m.rebalanceSeconds, m.inflight, m.buildInfo, m.repliesSkipped, m.scanFloorTruncated, m.batchesAbandoned,
		m.commitErrors, m.recordsTrimmed, m.storeSettingsOK, m.storeForgot} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	m.buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	return m, nil
}

// initPipeline makes every series of a pipeline exist at zero, so that
// rates and the accounting identity work from the first scrape.
func (m *Metrics) initPipeline(name string, reasons []string) {
	for _, o := range []string{"first", "replay", "conflict", "invalid", "failed"} {
		m.records.WithLabelValues(name, o)
	}
	for _, r := range reasons {
		m.dlqRecords.WithLabelValues(name, r)
	}
	m.lenientMismatch.WithLabelValues(name)
	m.rebalances.WithLabelValues(name)
	m.assignedPartitions.WithLabelValues(name)
	for _, c := range []string{"assigned", "revoked", "lost"} {
		m.partitionsMoved.WithLabelValues(name, c)
	}
	m.inflight.WithLabelValues(name)
	for _, r := range []string{"pending", "failed", "unreadable", "too_large"} {
		m.repliesSkipped.WithLabelValues(name, r)
	}
	m.scanFloorTruncated.WithLabelValues(name)
	m.batchesAbandoned.WithLabelValues(name)
	m.commitErrors.WithLabelValues(name)
	m.recordsTrimmed.WithLabelValues(name)
	for _, op := range []string{"decide", "complete", "lookup"} {
		m.storeErrors.WithLabelValues(op)
	}
	for _, op := range []string{"decide", "complete"} {
		m.storeReplicaAckFailures.WithLabelValues(op)
	}
}

// forgottenStore is what idemstream_store_forgot reads: a store that can
// tell it lost decisions (redisstore).
type forgottenStore interface{ Forgot() error }

// watchForgot makes idemstream_store_forgot report store.
func (m *Metrics) watchForgot(store forgottenStore) { m.forgotOf.Store(&store) }

// forgot is idemstream_store_forgot's value.
func (m *Metrics) forgot() float64 {
	if f := m.forgotOf.Load(); f != nil && (*f).Forgot() != nil {
		return 1
	}
	return 0
}
