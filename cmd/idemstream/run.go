package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

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
	if len(cfg.Pipelines) == 0 {
		return &schemas.FieldError{Field: "pipelines", Msg: "run needs at least one pipeline; a file of http routes alone is served by idemstream proxy"}
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
	if err := openSchemas(ctx, cfg, log); err != nil {
		return err
	}
	svc, err := buildService(cfg, e.getenv, log, runTimings{settle: *settle, drain: *drain, batch: *batch}, lines)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, svc.close()) }()
	return svc.run(ctx)
}

// openSchemas reads the reader schema of every pipeline whose payloads
// are read through one. A registry that does not answer is waited for (1 s,
// doubling up to 30 s): the instance is not ready meanwhile, as with a
// store that does not answer; a registry that refuses, or a schema that
// does not exist, ends the start.
func openSchemas(ctx context.Context, cfg *schemas.Config, log *slog.Logger) error {
	for pause := time.Second; ; pause = min(2*pause, 30*time.Second) {
		err := cfg.OpenDecoders(ctx)
		if err == nil || !dedupe.IsRetryable(err) {
			return err
		}
		log.Warn("waiting for the schema registry before starting", "err", err, "retry_in", pause)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
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
// what a SIGTERM takes with servers that answer, and deploy/kubernetes's
// grace period covers them (TestGracePeriodCoversTheShutdown).
const httpShutdownTimeout = 5 * time.Second

// service is everything `run` owns, built in order and closed in reverse:
// the pipelines (consumer.Service) and the metrics server.
type service struct {
	log      *slog.Logger
	svc      *consumer.Service
	server   *http.Server
	listener net.Listener
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
	reg := newRegistry()
	opts := consumer.ServiceOptions{Registerer: reg, Version: buildVersion(), Logger: log, Getenv: getenv,
		SettleWait: timings.settle, DrainTimeout: timings.drain, BatchSize: timings.batch}
	if lines != nil {
		inputs := map[string]bool{}
		for _, p := range cfg.Pipelines {
			inputs[p.Input] = true
		}
		opts.WrapBroker = func(b consumer.Broker) consumer.Broker {
			return &printingBroker{Broker: b, lines: lines, inputs: inputs}
		}
	}
	svc, err := consumer.NewService(cfg, opts)
	if err != nil {
		return nil, err
	}
	// Listen now, so that a taken port is a start-up error, not a log line.
	ln, err := net.Listen("tcp", cfg.Metrics.Addr)
	if err != nil {
		return nil, errors.Join(&schemas.FieldError{Field: "metrics.addr", Msg: err.Error()}, svc.Close())
	}
	s := &service{log: log, svc: svc, listener: ln}
	s.server = metricsServer(reg, s.svc.Ready, cfg.Metrics.Pprof)
	return s, nil
}

// run serves metrics and runs every pipeline until ctx ends. A pipeline
// that stops on an error retrying cannot cure stops the process: exit 1,
// with the reason as the last log line.
func (s *service) run(ctx context.Context) error {
	s.log.Info("starting", "version", buildVersion(), "metrics", s.listener.Addr().String())
	httpDone := make(chan error, 1)
	go func() {
		if err := s.server.Serve(s.listener); !errors.Is(err, http.ErrServerClosed) {
			httpDone <- err
		}
		close(httpDone)
	}()
	err := s.svc.Run(ctx)
	shutdown, cancel := context.WithTimeout(context.Background(), httpShutdownTimeout)
	defer cancel()
	err = errors.Join(err, s.server.Shutdown(shutdown))
	if herr := <-httpDone; herr != nil {
		err = errors.Join(err, herr)
	}
	s.log.Info("stopped")
	return err
}

func (s *service) close() error { return s.svc.Close() }

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
