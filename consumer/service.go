package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemstream/idemstream/internal/retry"
	"github.com/segmentio/kafka-go"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

// ServiceOptions are what a program that runs a configuration file chooses
// beyond the file. Everything is optional.
type ServiceOptions struct {
	// Handlers are the handlers of the pipelines, by pipeline name; a
	// pipeline not named forwards its commands (Forward).
	Handlers map[string]Handler
	// Registerer takes the idemstream_* metrics; nil registers none.
	Registerer prometheus.Registerer
	// Version labels idemstream_build_info ("dev" when empty).
	Version string
	Logger  *slog.Logger
	// Getenv reads the secrets the file names (kafka.sasl.password_env,
	// store.redis.password_env); nil reads the process environment.
	Getenv func(string) string
	// SettleWait, DrainTimeout and BatchSize are Config's (0: their
	// defaults).
	SettleWait   time.Duration
	DrainTimeout time.Duration
	BatchSize    int
	// SettingsRecheck is how often the Redis settings are checked again
	// while the service runs (0: a minute).
	SettingsRecheck time.Duration
	// WrapBroker, when set, wraps the Kafka I/O of every pipeline (to
	// print instead of writing, say).
	WrapBroker func(Broker) Broker
}

// Service runs every pipeline of a configuration file as `idemstream run`
// does: Kafka with the file's TLS and SASL settings, the store it names
// (memory, or Redis standalone, Sentinel or Cluster with replica
// acknowledgement), the Redis settings checked before any pipeline starts
// and again while they run. Build it with NewService, run it with Run,
// release it with Close.
type Service struct {
	log       *slog.Logger
	store     dedupe.Store // the raw store, for probes
	closeFn   func() error
	kafka     *sinks.Kafka
	pipelines []*Pipeline
	probe     storeProbe
	settings  *settingsCheck // nil: the store's settings are not checked
	recheck   time.Duration
}

// NewService builds the pipelines of cfg. Like New, it starts nothing and
// connects to nothing: Run does. A setting it cannot use is a
// *schemas.FieldError naming the field.
func NewService(cfg *schemas.Config, o ServiceOptions) (*Service, error) {
	o.applyDefaults()
	for name := range o.Handlers {
		if !slices.ContainsFunc(cfg.Pipelines, func(p schemas.Pipeline) bool { return p.Name == name }) {
			return nil, fmt.Errorf("consumer: a handler for pipeline %q, which the configuration does not have", name)
		}
	}
	writer, err := sinks.Connect(cfg, o.Getenv)
	if err != nil {
		return nil, err
	}
	dialer := writer.Dialer()
	var metrics *Metrics
	reg := &undoable{Registerer: o.Registerer}
	if o.Registerer != nil {
		if metrics, err = NewMetrics(reg, o.Version); err != nil {
			reg.undo()
			return nil, err
		}
	}
	rawStore, closeStore, err := OpenStore(cfg, o.Getenv)
	if err != nil {
		reg.undo()
		return nil, err
	}
	// A failed NewService leaves nothing behind: the same registry may be
	// used again.
	fail := func(err error) (*Service, error) { reg.undo(); return nil, errors.Join(err, closeStore()) }
	store := instrumentStore(rawStore, metrics)
	var io Broker = writer
	if o.WrapBroker != nil {
		io = o.WrapBroker(io)
	}
	s := &Service{log: o.Logger, store: rawStore, closeFn: closeStore, kafka: writer,
		probe: storeProbe{store: rawStore}, settings: newSettingsCheck(cfg, rawStore, o.Logger, metrics), recheck: o.SettingsRecheck}
	for i, pc := range cfg.Pipelines {
		p, err := newServicePipeline(cfg, i, pc, o, store, io, dialer, metrics)
		if err != nil {
			return fail(err)
		}
		s.pipelines = append(s.pipelines, p)
	}
	return s, nil
}

// applyDefaults fills in what the options leave out.
func (o *ServiceOptions) applyDefaults() {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.SettleWait <= 0 {
		o.SettleWait = DefaultSettleWait
	}
	if o.SettingsRecheck <= 0 {
		o.SettingsRecheck = time.Minute
	}
}

// newServicePipeline builds pipeline i of cfg, pc, on the service's store,
// broker and metrics.
func newServicePipeline(cfg *schemas.Config, i int, pc schemas.Pipeline, o ServiceOptions, store dedupe.Store, io Broker,
	dialer *kafka.Dialer, metrics *Metrics) (*Pipeline, error) {
	pol, err := cfg.Policy(pc)
	if err != nil {
		return nil, err
	}
	d, err := dedupe.NewDecider(pol, store)
	if err != nil {
		return nil, err
	}
	latest, startTime, err := pc.StartPosition()
	if err != nil {
		return nil, &schemas.FieldError{Field: fmt.Sprintf("pipelines[%d].start", i), Msg: err.Error()}
	}
	p, err := New(Config{
		Start:    StartAt{Latest: latest, Time: startTime},
		Identity: identityOf(cfg, pc), AcceptIdentity: pc.AcceptIdentity,
		Name: pc.Name, Input: pc.Input, Output: pc.Output, DLQ: pc.DLQ, Replies: pc.Replies,
		Group: cfg.ConsumerGroup(pc), Brokers: cfg.Kafka.Brokers, Dialer: dialer,
		InstanceID: cfg.Kafka.InstanceID, LeaveOnStop: cfg.Kafka.LeaveOnStop, Assignor: cfg.Kafka.Assignor,
		Decider: d, Store: store, Broker: io, Handler: o.Handlers[pc.Name], Metrics: metrics, Logger: o.Logger,
		SettleWait: o.SettleWait, DrainTimeout: o.DrainTimeout, BatchSize: o.BatchSize,
	})
	if errors.Is(err, errLeaseTooShort) {
		return nil, &schemas.FieldError{Field: fmt.Sprintf("pipelines[%d].pending_timeout", i), Msg: err.Error()}
	}
	return p, err
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

// Run checks the store's settings, then runs every pipeline until ctx
// ends. While Redis does not answer the check, no pipeline starts and
// Ready says why; the check is tried again after 1 s, doubling up to 30 s.
// Settings that lose state end Run with a *schemas.FieldError before any
// pipeline starts; found later, they make Ready report them and the
// pipelines go on. A pipeline that stops on an error that retrying cannot
// cure stops the others, and Run returns its error. Run returns nil when
// ctx ends, once every pipeline has stopped (StopTimeout).
func (s *Service) Run(ctx context.Context) error {
	ctx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	if s.settings != nil {
		if err := s.settings.untilPassed(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			s.settings.watch(ctx, s.recheck)
		}()
		defer func() { stopAll(); <-watched }()
	}
	var wg sync.WaitGroup
	errs := make([]error, len(s.pipelines))
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
	return errors.Join(errs...)
}

// Ready lists why the service is not ready, none when it is: a pipeline
// not joined or paused, a store that does not answer (asked at most once a
// second), writes the replicas did not acknowledge, settings not checked
// or refused.
func (s *Service) Ready(ctx context.Context) []string {
	var problems []string
	for _, p := range s.pipelines {
		if !p.Ready() {
			problem := "pipeline " + p.Name() + " not joined or paused"
			if why := p.PauseCause(); why != "" {
				problem += " (" + why + ")"
			}
			problems = append(problems, problem)
		}
	}
	if err := s.probe.check(ctx); err != nil {
		problems = append(problems, "store: "+err.Error())
	}
	if f, ok := s.store.(forgottenStore); ok {
		if err := f.Forgot(); err != nil {
			problems = append(problems, "store: "+err.Error())
		}
	}
	if ra, ok := s.store.(interface{ ReplicaAckError() error }); ok {
		if err := ra.ReplicaAckError(); err != nil {
			problems = append(problems, "store writes not acknowledged by replicas: "+err.Error())
		}
	}
	if s.settings != nil {
		if err := s.settings.err(); err != nil {
			problems = append(problems, "store settings: "+err.Error())
		}
	}
	return problems
}

// Close releases the store's and Kafka's connections; call it once Run
// has returned.
func (s *Service) Close() error {
	_ = s.kafka.Close()
	return s.closeFn()
}

// OpenStore builds the store cfg names: memstore, or redisstore with the
// file's addresses, TLS, password (read with getenv) and replica
// acknowledgement. It connects to nothing yet; close releases its
// connections, once nothing uses the store any more.
func OpenStore(cfg *schemas.Config, getenv func(string) string) (store dedupe.Store, close func() error, err error) {
	switch cfg.Store.Kind {
	case "memory":
		return memstore.New(), func() error { return nil }, nil
	case "redis":
		r := cfg.Store.Redis
		opts := redisstore.Options{URL: r.URL, Addrs: r.Addrs, MasterName: r.MasterName, Username: r.Username, TLS: r.TLS}
		if r.CAFile != "" {
			opts.CAFile = cfg.Resolve(r.CAFile)
		}
		if r.PasswordEnv != "" {
			opts.Password = getenv(r.PasswordEnv)
			if opts.Password == "" {
				return nil, nil, &schemas.FieldError{Field: "store.redis.password_env", Msg: fmt.Sprintf("environment variable %s is empty", r.PasswordEnv)}
			}
		}
		if r.MinReplicas > 0 {
			// WAIT blocks for up to replica_timeout: the call's own
			// timeout must outlast it.
			opts.Timeout = redisstore.DefaultTimeout + r.ReplicaTimeout.D()
		}
		client, err := redisstore.NewClient(opts)
		if err != nil {
			return nil, nil, &schemas.FieldError{Field: "store.redis", Msg: err.Error()}
		}
		storeOpts := []redisstore.Option{redisstore.WithReplicas(r.MinReplicas, r.ReplicaTimeout.D()),
			redisstore.WithForgetHold(cfg.LongestWindow()), redisstore.WithSourceTopics(cfg.Inputs()...)}
		if r.WritesCompact() {
			storeOpts = append(storeOpts, redisstore.WithCompactEntries())
		}
		return redisstore.New(client, r.Prefix, storeOpts...), client.Close, nil
	}
	return nil, nil, &schemas.FieldError{Field: "store.kind", Msg: fmt.Sprintf("unknown store %q", cfg.Store.Kind)}
}

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
	p.err = dedupe.Probe(ctx, p.store)
	p.last = time.Now()
	return p.err
}

// settingsCheck runs the store's checks of the Redis settings
// (store.redis.check_server): before the pipelines start, retried with
// backoff until it passes or refuses, and then periodically while they
// run, since a CONFIG SET or a failover can change the settings. Settings
// that lose state refuse the start; found later, they make the service
// not ready and set idemstream_store_settings_ok to 0, and the pipelines go
// on: they were started on settings that kept every decision, and an
// operator must choose between fixing the server and stopping.
type settingsCheck struct {
	store *redisstore.Store
	log   *slog.Logger
	ok    prometheus.Gauge // nil without metrics

	mu       sync.Mutex
	problem  error  // nil once the last check passed
	checked  bool   // a check has run to a verdict (passed or refused)
	warnings string // the last warnings logged, to log a change only
}

// newSettingsCheck is the check of cfg's store, nil when nothing is
// checked (a memory store, check_server: false).
func newSettingsCheck(cfg *schemas.Config, store dedupe.Store, log *slog.Logger, metrics *Metrics) *settingsCheck {
	rs, ok := store.(*redisstore.Store)
	if !ok || !cfg.Store.Redis.ChecksServer() {
		return nil
	}
	c := &settingsCheck{store: rs, log: log, problem: errors.New("not checked yet")}
	if metrics != nil {
		c.ok = metrics.storeSettingsOK.WithLabelValues()
		c.ok.Set(0)
	}
	return c
}

// errSettingsUnchecked is a check that could not run: the server did not
// answer.
var errSettingsUnchecked = errors.New("redis settings could not be checked")

// once runs one check: nil when it passed, a *schemas.FieldError naming
// the setting when it refused (or the server refused the check itself),
// errSettingsUnchecked when the server did not answer.
func (c *settingsCheck) once(parent context.Context) error {
	ctx, cancel := context.WithTimeout(parent, 10*time.Second)
	defer cancel()
	warnings, err := c.store.CheckServer(ctx)
	if parent.Err() != nil {
		// Stopping: what a cut call says is not about the settings.
		return parent.Err()
	}
	var se *redisstore.SettingsError
	switch {
	case errors.As(err, &se):
		for _, p := range se.Problems {
			c.log.Error("redis settings lose state: "+p, "setting", "store.redis.check_server")
		}
		err = &schemas.FieldError{Field: se.Field, Msg: se.Error() + " (store.redis.check_server: false starts anyway)"}
	case errors.Is(err, dedupe.ErrStoreUnavailable):
		err = fmt.Errorf("%w: %w", errSettingsUnchecked, err)
	case err != nil:
		// The server answered no (credentials, permissions): waiting
		// cannot cure it.
		err = &schemas.FieldError{Field: "store.redis", Msg: err.Error()}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if joined := strings.Join(warnings, "\n"); joined != c.warnings {
		for _, w := range warnings {
			c.log.Warn("redis settings not verified or weak: "+w, "setting", "store.redis.check_server")
		}
		c.warnings = joined
	}
	if errors.Is(err, errSettingsUnchecked) && c.checked {
		// A server that does not answer a recheck says nothing about its
		// settings: the last verdict stands (Ready reports the store
		// itself as not answering).
		return err
	}
	if err == nil && c.problem != nil {
		c.log.Info("redis settings checked", "setting", "store.redis.check_server")
	}
	c.problem, c.checked = err, c.checked || !errors.Is(err, errSettingsUnchecked)
	if c.ok != nil {
		if err == nil {
			c.ok.Set(1)
		} else {
			c.ok.Set(0)
		}
	}
	return err
}

// untilPassed runs the check before the pipelines start: while the server
// does not answer it tries again, waiting 1 s, doubling up to 30 s; it
// never lets them start unchecked. It returns nil once the check passed,
// the refusal, or the context's error.
func (c *settingsCheck) untilPassed(ctx context.Context) error {
	wait := time.Second
	for attempt := 1; ; attempt++ {
		err := c.once(ctx)
		if err == nil || !errors.Is(err, errSettingsUnchecked) {
			return err
		}
		if attempt&(attempt-1) == 0 || attempt%10 == 0 { // 1, 2, 4, 8, ... and every 10th
			c.log.Warn("redis settings could not be checked; not starting until they are", "setting", "store.redis.check_server", "retry_in", wait, "err", err)
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return err
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// watch checks again every interval until ctx ends.
func (c *settingsCheck) watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.once(ctx); ctx.Err() == nil && errors.Is(err, errSettingsUnchecked) {
				c.log.Warn("redis settings could not be checked again", "setting", "store.redis.check_server", "err", err)
			}
		}
	}
}

// err is what Ready reports: nil once the last check passed.
func (c *settingsCheck) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.problem
}

// undoable is a Registerer that can take back what was registered on it.
type undoable struct {
	prometheus.Registerer
	done []prometheus.Collector
}

func (u *undoable) Register(c prometheus.Collector) error {
	if err := u.Registerer.Register(c); err != nil {
		return err
	}
	u.done = append(u.done, c)
	return nil
}

func (u *undoable) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := u.Register(c); err != nil {
			panic(err)
		}
	}
}

func (u *undoable) undo() {
	for _, c := range u.done {
		u.Registerer.Unregister(c)
	}
	u.done = nil
}
