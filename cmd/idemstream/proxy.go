package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/frontdoor"
	"github.com/idemstream/idemstream/schemas"
)

// cmdProxy serves the front door: the http section's routes guarded in
// front of its upstream, metrics beside them. A SIGTERM stops accepting,
// lets requests in hand finish (each bounded by upstream_timeout) and
// exits.
func cmdProxy(ctx context.Context, e *env, args []string) (err error) {
	cfg, log, err := proxyConfig(e, args)
	if err != nil {
		return err
	}
	raw, closeStore, err := consumer.OpenStore(cfg, e.getenv)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeStore()) }()
	store, ok := raw.(frontdoor.Store)
	if !ok {
		return fmt.Errorf("store %s cannot keep answers", cfg.Store.Kind)
	}
	reg := newRegistry()
	metrics, err := frontdoor.NewMetrics(reg)
	if err != nil {
		return err
	}
	var checked checkState
	proxy, err := frontdoor.NewProxy(cfg, store, frontdoor.Options{Metrics: metrics, Logger: log, Ready: checked.get})
	if err != nil {
		return err
	}
	metricsLn, err := net.Listen("tcp", cfg.Metrics.Addr)
	if err != nil {
		return &schemas.FieldError{Field: "metrics.addr", Msg: err.Error()}
	}
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		_ = metricsLn.Close()
		return &schemas.FieldError{Field: "http.listen", Msg: err.Error()}
	}
	metricsSrv := metricsServer(reg, func(ctx context.Context) []string {
		problem := checked.get()
		if problem == nil {
			problem = proxy.Ready(ctx)
		}
		if problem != nil {
			return []string{problem.Error()}
		}
		return nil
	}, cfg.Metrics.Pprof)
	front := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	log.Info("starting proxy", "version", buildVersion(), "listen", ln.Addr().String(), "upstream", cfg.HTTP.Upstream,
		"metrics", metricsLn.Addr().String(), "routes", len(cfg.HTTP.Routes))
	served := make(chan error, 2)
	for _, s := range []struct {
		srv *http.Server
		ln  net.Listener
	}{{metricsSrv, metricsLn}, {front, ln}} {
		go func() {
			if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
				served <- err
				return
			}
			served <- nil
		}()
	}
	err = checkUntilDone(ctx, cfg, raw, &checked, log, served)
	// Not ready from now on; the requests in hand finish: the longest is
	// a wait for a key held elsewhere, then the upstream call, then
	// keeping its answer. The store closes after them (deferred).
	checked.set(errors.New("stopping"), true)
	shutdown, cancel := context.WithTimeout(context.Background(), proxyShutdownTimeout(cfg))
	defer cancel()
	err = errors.Join(err, front.Shutdown(shutdown), metricsSrv.Shutdown(shutdown))
	log.Info("stopped")
	return err
}

// proxyConfig parses the proxy's flags and loads its configuration, which
// must have an http section.
func proxyConfig(e *env, args []string) (*schemas.Config, *slog.Logger, error) {
	fs := newFlags(e, "proxy", "-c FILE [--listen ADDR] [--upstream URL] [--redis-url URL] [--log-format json|text] [--log-level L]")
	cf := addConfigFlags(fs, "store.", "metrics.")
	listen := fs.String("listen", "", "listen address of the proxy, instead of http.listen")
	upstream := fs.String("upstream", "", "URL of the upstream, instead of http.upstream")
	logFormat := fs.String("log-format", "json", "json or text")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return nil, nil, err
	}
	log, err := newLogger(e, *logFormat, *logLevel)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := cf.load(e)
	if err != nil {
		return nil, nil, err
	}
	if cfg.HTTP == nil {
		return nil, nil, &schemas.FieldError{Field: "http", Msg: "the proxy needs an http section with its routes (docs/http.md)"}
	}
	if *listen != "" {
		cfg.HTTP.Listen = *listen
	}
	if *upstream != "" {
		cfg.HTTP.Upstream = *upstream
	}
	return cfg, log, nil
}

// checkUntilDone checks the store's settings (checkStore, which reports
// not ready until they pass) until ctx ends, the check fails for good, or
// a server stops serving, and returns why it stopped.
func checkUntilDone(ctx context.Context, cfg *schemas.Config, raw dedupe.Store, checked *checkState, log *slog.Logger, served <-chan error) error {
	checkCtx, stopCheck := context.WithCancel(ctx)
	defer stopCheck()
	checkErr := make(chan error, 1)
	go func() { checkErr <- checkStore(checkCtx, cfg, raw, checked, log.Warn) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-checkErr:
		return err
	case err = <-served:
	}
	stopCheck()
	<-checkErr // stopped by stopCheck: it runs no longer
	return err
}

// proxyShutdownTimeout bounds a stop: the longest request in hand (the
// longest pending_timeout, the upstream call, the store calls around it)
// and the metrics server's shutdown.
func proxyShutdownTimeout(cfg *schemas.Config) time.Duration {
	var wait time.Duration
	for _, r := range cfg.HTTP.Routes {
		wait = max(wait, r.PendingTimeout.D())
	}
	return wait + cfg.HTTP.UpstreamTimeout.D() + 20*time.Second + httpShutdownTimeout
}

// checkState is the verdict of the store's settings check: until it
// passes (and once the proxy stops), guarded requests are refused 503 and
// /readyz says why; other paths pass.
type checkState struct {
	mu      sync.Mutex
	problem error
	done    bool
}

func (c *checkState) get() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done && c.problem == nil {
		return errors.New("store settings not checked yet")
	}
	return c.problem
}

func (c *checkState) set(problem error, done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.problem, c.done = problem, done
}

// checkStore runs the Redis settings check (store.redis.check_server)
// until it gives a verdict: settings that lose state end the proxy (exit
// 2); a server that does not answer is asked again with backoff, the
// proxy not ready meanwhile. It returns nil once the settings pass, and
// keeps nothing running.
func checkStore(ctx context.Context, cfg *schemas.Config, raw dedupe.Store, c *checkState, warn func(string, ...any)) error {
	rs, ok := raw.(*redisstore.Store)
	if !ok || !*cfg.Store.Redis.CheckServer {
		c.set(nil, true)
		<-ctx.Done()
		return nil
	}
	pause := time.Second
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		warnings, err := rs.CheckServer(cctx)
		cancel()
		for _, w := range warnings {
			warn("redis settings not verified or weak: " + w)
		}
		var se *redisstore.SettingsError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &se):
			return &schemas.FieldError{Field: se.Field, Msg: se.Error() + " (store.redis.check_server: false starts anyway)"}
		case errors.Is(err, dedupe.ErrStoreUnavailable):
			c.set(fmt.Errorf("store settings not checked: %w", err), false)
			warn("redis settings not checked: retrying", "err", err, "in", pause)
		case err != nil:
			return &schemas.FieldError{Field: "store.redis", Msg: err.Error()}
		default:
			c.set(nil, true)
			<-ctx.Done()
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause = min(pause*2, 30*time.Second)
	}
}
