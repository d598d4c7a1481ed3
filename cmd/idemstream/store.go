package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemstream/idemstream/consumer"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/schemas"
)

// openStore builds the configured store. The returned close releases its
// connections; main calls it last, after everything that uses the store.
func openStore(cfg *schemas.Config, getenv func(string) string) (dedupe.Store, func() error, error) {
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
		return redisstore.New(client, r.Prefix, redisstore.WithReplicas(r.MinReplicas, r.ReplicaTimeout.D())), client.Close, nil
	}
	return nil, nil, &schemas.FieldError{Field: "store.kind", Msg: fmt.Sprintf("unknown store %q", cfg.Store.Kind)}
}

// settingsCheck runs the store's checks of the Redis settings
// (store.redis.check_server): before the pipelines start, retried with
// backoff until it passes or refuses, and then every settingsRecheck while
// they run, since a CONFIG SET or a failover can change the settings.
// Settings that lose state silently refuse the start (exit 2); found
// later, they make the instance not ready and set
// idemstream_store_settings_ok to 0, and the pipelines go on: they were
// started on settings that kept every decision, and an operator must
// choose between fixing the server and stopping.
type settingsCheck struct {
	store *redisstore.Store
	log   *slog.Logger
	ok    prometheus.Gauge // nil without metrics

	mu       sync.Mutex
	problem  error  // nil once the last check passed
	warnings string // the last warnings logged, to log a change only
}

// settingsRecheck is how often a running instance checks the Redis
// settings again.
var settingsRecheck = time.Minute

// newSettingsCheck is the check of cfg's store, nil when nothing is
// checked (a memory store, check_server: false).
func newSettingsCheck(cfg *schemas.Config, store dedupe.Store, log *slog.Logger, metrics *consumer.Metrics) *settingsCheck {
	rs, ok := store.(*redisstore.Store)
	if !ok || !cfg.Store.Redis.ChecksServer() {
		return nil
	}
	c := &settingsCheck{store: rs, log: log, problem: errors.New("not checked yet")}
	if metrics != nil {
		c.ok = metrics.StoreSettingsOK.WithLabelValues()
		c.ok.Set(0)
	}
	return c
}

// errSettingsUnchecked is a check that could not run: the server did not
// answer.
var errSettingsUnchecked = errors.New("redis settings could not be checked")

// once runs one check: nil when it passed, a *schemas.FieldError naming
// the setting when it refused, errSettingsUnchecked when it could not run.
func (c *settingsCheck) once(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	warnings, err := c.store.CheckServer(ctx)
	var se *redisstore.SettingsError
	switch {
	case errors.As(err, &se):
		for _, p := range se.Problems {
			c.log.Error("redis settings lose state: "+p, "setting", "store.redis.check_server")
		}
		err = &schemas.FieldError{Field: se.Field, Msg: se.Error() + " (store.redis.check_server: false starts anyway)"}
	case err != nil:
		err = fmt.Errorf("%w: %w", errSettingsUnchecked, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if joined := strings.Join(warnings, "\n"); err == nil && joined != c.warnings {
		for _, w := range warnings {
			c.log.Warn("redis settings not verified or weak: "+w, "setting", "store.redis.check_server")
		}
		c.warnings = joined
	}
	if err == nil && c.problem != nil && c.warnings == "" {
		c.log.Info("redis settings checked", "setting", "store.redis.check_server")
	}
	c.problem = err
	if c.ok != nil {
		c.ok.Set(map[bool]float64{true: 1, false: 0}[err == nil])
	}
	return err
}

// untilPassed runs the check before the pipelines start: while the server
// does not answer the instance stays not ready and tries again, waiting
// 1 s, doubling up to 30 s; it never starts unchecked. It returns nil once
// the check passed, the refusal, or the context's error.
func (c *settingsCheck) untilPassed(ctx context.Context) error {
	wait := time.Second
	for attempt := 1; ; attempt++ {
		err := c.once(ctx)
		if err == nil || !errors.Is(err, errSettingsUnchecked) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if attempt&(attempt-1) == 0 || attempt%10 == 0 { // 1, 2, 4, 8, ... and every 10th
			c.log.Warn("redis settings could not be checked; not starting until they are", "setting", "store.redis.check_server", "retry_in", wait, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// watch checks again every settingsRecheck until ctx ends.
func (c *settingsCheck) watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.once(ctx); err != nil && ctx.Err() == nil && errors.Is(err, errSettingsUnchecked) {
				c.log.Warn("redis settings could not be checked again", "setting", "store.redis.check_server", "err", err)
			}
		}
	}
}

// err is what /readyz reports: nil once the last check passed.
func (c *settingsCheck) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.problem
}

func cmdInspect(ctx context.Context, e *env, args []string) (err error) {
	fs := newFlags(e, "inspect", "-c FILE [--pipeline NAME] [-o text|json] KEY")
	cf := addConfigFlags(fs, "store.")
	pipeline := fs.String("pipeline", "", "pipeline of the key (optional when the config has one)")
	outputOf := outputFlag(fs, "text", "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	output, err := outputOf()
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("inspect takes one idempotency key, got %d arguments", fs.NArg())
	}
	cfg, err := cf.load(e)
	if err != nil {
		return err
	}
	p, err := pickPipeline(cfg, *pipeline)
	if err != nil {
		return err
	}
	if cfg.Store.Kind == "memory" {
		return usagef("store.kind is memory: the state lives inside the running process and cannot be inspected from outside")
	}
	format, err := dedupe.ParseKeyFormat(p.Key.Format)
	if err != nil {
		return err
	}
	key, err := format.Normalize(fs.Arg(0))
	if err != nil {
		return usagef("%v", err)
	}
	store, closeStore, err := openStore(cfg, e.getenv)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeStore()) }()
	entry, found, err := store.Lookup(ctx, p.Name, key)
	if err != nil {
		return err
	}
	if output == "json" {
		if !found {
			return writeJSON(e, map[string]any{"key": key, "pipeline": p.Name, "found": false})
		}
		return writeJSON(e, map[string]any{"key": key, "pipeline": p.Name, "found": true, "entry": entryJSON(entry)})
	}
	if !found {
		fmt.Fprintf(e.stdout, "no entry for key %s in pipeline %s: never seen, or its window (or failed_ttl) is over; the next record with it is decided first\n", key, p.Name)
		return nil
	}
	printEntry(e, entry)
	return nil
}

// entryJSON is an entry as inspect -o json prints it: times in RFC 3339 on
// the store's clock, and how long each has left.
func entryJSON(en dedupe.Entry) map[string]any {
	at := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return map[string]string{"at": t.UTC().Format(time.RFC3339Nano), "left": t.Sub(en.Now).Round(time.Millisecond).String()}
	}
	return map[string]any{
		"state": en.State, "fingerprint": en.Fingerprint, "rules": en.RulesDigest,
		"owner": en.Owner.Token(), "first_source": en.FirstSource, "decision": en.DecisionID(),
		"intent":       map[string]int64{"partition": int64(en.Intent.Partition), "floor": en.Intent.Floor},
		"result":       map[string]int64{"partition": int64(en.Result.Partition), "offset": en.Result.Offset},
		"window_start": en.WindowStart.UTC().Format(time.RFC3339Nano), "lease": at(en.LeaseUntil), "expires": at(en.ExpiresAt),
		"store_time": en.Now.UTC().Format(time.RFC3339Nano),
	}
}

func printEntry(e *env, en dedupe.Entry) {
	left := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		d := t.Sub(en.Now)
		if d <= 0 {
			return "expired " + (-d).Round(time.Millisecond).String() + " ago"
		}
		return d.Round(time.Millisecond).String()
	}
	pos := func(p int32, o int64) string {
		if o == dedupe.NoPosition {
			return "-"
		}
		return fmt.Sprintf("partition %d offset %d", p, o)
	}
	fmt.Fprintf(e.stdout, "key:          %s\n", en.Key)
	fmt.Fprintf(e.stdout, "state:        %s\n", en.State)
	fmt.Fprintf(e.stdout, "fingerprint:  %s\n", en.Fingerprint)
	fmt.Fprintf(e.stdout, "rules:        %s\n", en.RulesDigest)
	fmt.Fprintf(e.stdout, "first source: %s\n", en.FirstSource)
	fmt.Fprintf(e.stdout, "owner:        %s\n", en.Owner.Token())
	fmt.Fprintf(e.stdout, "intent:       %s\n", pos(en.Intent.Partition, en.Intent.Floor))
	fmt.Fprintf(e.stdout, "result:       %s\n", pos(en.Result.Partition, en.Result.Offset))
	if en.State == dedupe.Pending {
		fmt.Fprintf(e.stdout, "lease left:   %s\n", left(en.LeaseUntil))
	}
	label := "window left: "
	if en.State == dedupe.Failed {
		label = "failed left: "
	}
	fmt.Fprintf(e.stdout, "%s %s\n", label, left(en.ExpiresAt))
}
