package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

func cmdRun(ctx context.Context, e *env, args []string) (err error) {
	fs := newFlags(e, "run", "-c FILE [-b BROKERS] [--redis-url URL] [--settle-wait D] [--drain-timeout D] [--batch-size N] [--log-format json|text] [--log-level L]")
	cf := addConfigFlags(fs, "")
	logFormat := fs.String("log-format", "json", "json or text")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	settle := fs.Duration("settle-wait", consumer.DefaultSettleWait, "how long a write of unknown outcome may take to become visible (at least 1.5 × the brokers' replica.lag.time.max.ms)")
	drain := fs.Duration("drain-timeout", consumer.DefaultDrainTimeout, "how long a revoked partition (rebalance, SIGTERM) goes on with the batch in hand before it releases its keys; below the 10s session timeout")
	batch := fs.Int("batch-size", consumer.DefaultBatchSize, fmt.Sprintf("the most records decided, written and committed together; lower it for a handler that takes milliseconds per record (a batch in hand on revocation must finish within --drain-timeout); 1 to %d", maxBatchSize))
	sink := fs.String("sink", "kafka", "kafka, or stdout to print results, dead letters and replies as JSON lines instead (debugging)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(e, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	cfg, err := cf.load(e)
	if err != nil {
		return err
	}
	if *sink != "kafka" && *sink != "stdout" {
		return usagef("--sink %q: want kafka or stdout", *sink)
	}
	var lines *sinks.JSONLines
	if *sink == "stdout" {
		lines = sinks.NewJSONLines(e.stdout)
	}
	if *settle <= 0 {
		return usagef("--settle-wait %v: want more than 0 (at least 1.5 × the brokers' replica.lag.time.max.ms)", *settle)
	}
	if *drain <= 0 || *drain >= 10*time.Second {
		return usagef("--drain-timeout %v: want more than 0 and less than the 10s session timeout", *drain)
	}
	if *batch < 1 || *batch > maxBatchSize {
		return usagef("--batch-size %d: want 1 to %d", *batch, maxBatchSize)
	}
	svc, err := buildService(cfg, e.getenv, log, runTimings{settle: *settle, drain: *drain, batch: *batch}, lines)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, svc.close()) }()
	return svc.run(ctx)
}

func newLogger(e *env, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	}
	return nil, usagef("--log-format %q: want json or text", format)
}

// httpShutdownTimeout bounds the metrics server's shutdown, which comes
// after every pipeline stopped (consumer.StopTimeout): together they are
// what a SIGTERM may take, and deploy/kubernetes's grace period covers them
// (TestGracePeriodCoversTheShutdown).
const httpShutdownTimeout = 5 * time.Second

// writeBudget is the time a produce may take (the client's timeout is 10s).
const writeBudget = consumer.WriteBudget

// service is everything `run` owns, built in order and closed in reverse.
type service struct {
	cfg       *schemas.Config
	log       *slog.Logger
	store     dedupe.Store
	closeFn   func() error
	client    *kafka.Client
	registry  *prometheus.Registry
	pipelines []*consumer.Pipeline
	server    *http.Server
	listener  net.Listener
	probe     storeProbe
	settings  *settingsCheck // nil: the store's settings are not checked
}

// runTimings are the run flags that shape the result protocol.
type runTimings struct {
	settle time.Duration // --settle-wait
	drain  time.Duration // --drain-timeout
	batch  int           // --batch-size
}

// maxBatchSize bounds --batch-size: a fetch held about 1,500 records of
// 1 KB in the load runs, so a larger batch saves little per record, while every record
// of a batch shares its latency and its work redone after a crash.
const maxBatchSize = 10000

func buildService(cfg *schemas.Config, getenv func(string) string, log *slog.Logger, timings runTimings, lines *sinks.JSONLines) (*service, error) {
	settle := timings.settle
	dialer, transport, err := kafkaSecurity(cfg, getenv)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := consumer.NewMetrics(reg, buildVersion())
	if err != nil {
		return nil, err
	}
	rawStore, closeStore, err := openStore(cfg, getenv)
	if err != nil {
		return nil, err
	}
	store := consumer.InstrumentStore(rawStore, metrics)
	client := &kafka.Client{Addr: kafka.TCP(cfg.Kafka.Brokers...), Timeout: 10 * time.Second, Transport: transport}
	writer := sinks.NewKafka(client)
	if writer.Compression, err = sinks.ParseCompression(cfg.Kafka.Compression); err != nil {
		return nil, errors.Join(&schemas.FieldError{Field: "kafka.compression", Msg: err.Error()}, closeStore())
	}
	var io consumer.Broker = writer
	if lines != nil {
		inputs := map[string]bool{}
		for _, p := range cfg.Pipelines {
			inputs[p.Input] = true
		}
		io = &printingBroker{Broker: io, lines: lines, inputs: inputs}
	}
	instance := consumer.InstanceID()
	s := &service{cfg: cfg, log: log, store: store, closeFn: closeStore, client: client, registry: reg,
		probe: storeProbe{store: rawStore}, settings: newSettingsCheck(cfg, rawStore, log, metrics)}
	for i, pc := range cfg.Pipelines {
		pol, err := cfg.Policy(pc)
		if err != nil {
			return nil, errors.Join(err, closeStore())
		}
		// A successor may scan for a result only once a write of unknown
		// outcome has settled: the lease must outlast a write plus the
		// settle wait (consumer/doc.go).
		if lease := pol.Lease(); lease < settle+writeBudget {
			return nil, errors.Join(&schemas.FieldError{Field: fmt.Sprintf("pipelines[%d].pending_timeout", i),
				Msg: fmt.Sprintf("%s makes a lease of %s, shorter than --settle-wait (%s) plus %s for a write: raise pending_timeout or lower --settle-wait",
					pc.PendingTimeout, lease, settle, writeBudget)}, closeStore())
		}
		d, err := dedupe.NewDecider(pol, store)
		if err != nil {
			return nil, errors.Join(err, closeStore())
		}
		latest, startTime, err := pc.StartPosition()
		if err != nil {
			return nil, errors.Join(&schemas.FieldError{Field: fmt.Sprintf("pipelines[%d].start", i), Msg: err.Error()}, closeStore())
		}
		p, err := consumer.New(consumer.Config{
			Start:    consumer.StartAt{Latest: latest, Time: startTime},
			Identity: identityOf(cfg, pc), AcceptIdentity: pc.AcceptIdentity,
			Name: pc.Name, Input: pc.Input, Output: pc.Output, DLQ: pc.DLQ, Replies: pc.Replies,
			Group: cfg.ConsumerGroup(pc), Brokers: cfg.Kafka.Brokers, Dialer: dialer,
			Decider: d, Store: store, Broker: io, Metrics: metrics, Logger: log,
			Instance: instance, SettleWait: settle, DrainTimeout: timings.drain, BatchSize: timings.batch,
		})
		if err != nil {
			return nil, errors.Join(err, closeStore())
		}
		s.pipelines = append(s.pipelines, p)
	}
	// Listen now, so that a taken port is a start-up error, not a log line.
	ln, err := net.Listen("tcp", cfg.Metrics.Addr)
	if err != nil {
		return nil, errors.Join(&schemas.FieldError{Field: "metrics.addr", Msg: err.Error()}, closeStore())
	}
	s.listener = ln
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", s.readyz)
	s.server = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// run serves metrics and runs every pipeline until ctx ends.
func (s *service) run(ctx context.Context) error {
	s.log.Info("starting", "version", buildVersion(), "pipelines", len(s.pipelines), "metrics", s.listener.Addr().String())
	httpDone := make(chan error, 1)
	go func() {
		if err := s.server.Serve(s.listener); !errors.Is(err, http.ErrServerClosed) {
			httpDone <- err
		}
		close(httpDone)
	}()
	// A pipeline that stops on an error retrying cannot cure stops the
	// process: exit 1, with the reason as the last log line.
	ctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var wg sync.WaitGroup
	errs := make([]error, len(s.pipelines))
	if s.settings != nil {
		// Not ready, and no pipeline started, until the settings pass.
		if err := s.settings.untilPassed(ctx); err != nil {
			if ctx.Err() != nil {
				err = nil
			}
			return s.shutdown(err, httpDone)
		}
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			s.settings.watch(ctx, settingsRecheck)
		}()
		defer func() { stopAll(); <-watched }()
	}
	for i, p := range s.pipelines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = p.Run(ctx); errs[i] != nil {
				s.log.Error("pipeline stopped", "pipeline", p.Name(), "err", errs[i])
				stopAll()
			}
		}()
	}
	wg.Wait()
	return s.shutdown(errors.Join(errs...), httpDone)
}

// shutdown stops the metrics server once the pipelines are done.
func (s *service) shutdown(err error, httpDone <-chan error) error {
	ctx, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
	defer cancel()
	err = errors.Join(err, s.server.Shutdown(ctx))
	if herr := <-httpDone; herr != nil {
		err = errors.Join(err, herr)
	}
	s.log.Info("stopped")
	return err
}

func (s *service) close() error {
	if t, ok := s.client.Transport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	return s.closeFn()
}

func (s *service) readyz(w http.ResponseWriter, r *http.Request) {
	var problems []string
	for _, p := range s.pipelines {
		if !p.Ready() {
			problems = append(problems, "pipeline "+p.Name()+" not joined or paused")
		}
	}
	if err := s.probe.check(r.Context()); err != nil {
		problems = append(problems, "store: "+err.Error())
	}
	if s.settings != nil {
		if err := s.settings.err(); err != nil {
			problems = append(problems, "store settings: "+err.Error())
		}
	}
	if ra, ok := s.probe.store.(replicaAcks); ok {
		if err := ra.ReplicaAckError(); err != nil {
			problems = append(problems, "store writes not acknowledged by replicas: "+err.Error())
		}
	}
	if len(problems) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		for _, p := range problems {
			fmt.Fprintln(w, p)
		}
		return
	}
	fmt.Fprintln(w, "ready")
}

// replicaAcks is a store that waits for replicas (redisstore with
// store.redis.min_replicas): the newest write they did not acknowledge in
// time, nil once one was.
type replicaAcks interface{ ReplicaAckError() error }

// storeProbe asks the store a harmless question, at most once a second.
type storeProbe struct {
	store dedupe.Store
	mu    sync.Mutex
	last  time.Time
	err   error
}

func (p *storeProbe) check(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.last) < time.Second {
		return p.err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _, p.err = p.store.Lookup(ctx, "idemstream-readyz", "probe")
	p.last = time.Now()
	return p.err
}

// kafkaSecurity builds the TLS and SASL settings of the config, for the
// group's dialer and the client's transport alike.
func kafkaSecurity(cfg *schemas.Config, getenv func(string) string) (*kafka.Dialer, *kafka.Transport, error) {
	dialer := &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, ClientID: cfg.Kafka.ClientID}
	transport := &kafka.Transport{ClientID: cfg.Kafka.ClientID, DialTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second}
	if t := cfg.Kafka.TLS; t != nil && (t.Enabled || t.CAFile != "" || t.CertFile != "") {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
		if t.CAFile != "" {
			pem, err := os.ReadFile(cfg.Resolve(t.CAFile))
			if err != nil {
				return nil, nil, &schemas.FieldError{Field: "kafka.tls.ca_file", Msg: err.Error()}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, nil, &schemas.FieldError{Field: "kafka.tls.ca_file", Msg: "no PEM certificate in " + t.CAFile}
			}
			tc.RootCAs = pool
		}
		if t.CertFile != "" || t.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.Resolve(t.CertFile), cfg.Resolve(t.KeyFile))
			if err != nil {
				return nil, nil, &schemas.FieldError{Field: "kafka.tls.cert_file", Msg: err.Error()}
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		dialer.TLS, transport.TLS = tc, tc
	}
	if s := cfg.Kafka.SASL; s != nil {
		password := getenv(s.PasswordEnv)
		if password == "" {
			return nil, nil, &schemas.FieldError{Field: "kafka.sasl.password_env", Msg: "environment variable " + s.PasswordEnv + " is empty"}
		}
		var mech sasl.Mechanism
		switch s.Mechanism {
		case "plain":
			mech = plain.Mechanism{Username: s.Username, Password: password}
		case "scram-sha-256", "scram-sha-512":
			algo := scram.SHA256
			if s.Mechanism == "scram-sha-512" {
				algo = scram.SHA512
			}
			m, err := scram.Mechanism(algo, s.Username, password)
			if err != nil {
				return nil, nil, &schemas.FieldError{Field: "kafka.sasl", Msg: err.Error()}
			}
			mech = m
		}
		dialer.SASLMechanism, transport.SASL = mech, mech
	}
	return dialer, transport, nil
}

// identityOf is the pipeline's identity, checked against its output's
// latest results at start. A memory store keeps nothing across a restart,
// so there is nothing its identity could lose: it is not checked.
func identityOf(cfg *schemas.Config, pc schemas.Pipeline) string {
	if cfg.Store.Kind != "redis" {
		return ""
	}
	return cfg.Identity(pc)
}

// printingBroker reads the inputs from Kafka and prints everything it
// would write: output topics need not exist, and recovery scans find
// nothing (there is nothing to find).
type printingBroker struct {
	consumer.Broker
	lines  *sinks.JSONLines
	inputs map[string]bool
}

func (b *printingBroker) Write(ctx context.Context, msgs []sinks.Message) ([]sinks.Written, error) {
	return b.lines.Write(ctx, msgs)
}

func (b *printingBroker) Partitions(ctx context.Context, topic string) (int, error) {
	if b.inputs[topic] {
		return b.Broker.Partitions(ctx, topic)
	}
	return 1, nil
}

func (b *printingBroker) EndOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	if b.inputs[topic] {
		return b.Broker.EndOffsets(ctx, topic, partitions)
	}
	out := make(map[int]int64, len(partitions))
	for _, p := range partitions {
		out[p] = 0
	}
	return out, nil
}

func (b *printingBroker) StartOffsets(ctx context.Context, topic string, partitions []int) (map[int]int64, error) {
	if b.inputs[topic] {
		return b.Broker.StartOffsets(ctx, topic, partitions)
	}
	return b.EndOffsets(ctx, topic, partitions)
}

func (b *printingBroker) OffsetsAt(ctx context.Context, topic string, partitions []int, t time.Time) (map[int]int64, error) {
	at, ok := b.Broker.(interface {
		OffsetsAt(context.Context, string, []int, time.Time) (map[int]int64, error)
	})
	if !ok {
		return nil, fmt.Errorf("%T cannot list offsets by time", b.Broker)
	}
	return at.OffsetsAt(ctx, topic, partitions, t)
}

func (b *printingBroker) Fetch(ctx context.Context, topic string, partition int, offset int64, maxWait time.Duration) ([]sinks.Fetched, int64, error) {
	if b.inputs[topic] {
		return b.Broker.Fetch(ctx, topic, partition, offset, maxWait)
	}
	return nil, 0, nil
}
