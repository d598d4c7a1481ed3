package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

// cmdValidate checks a configuration without running it: the checks run
// makes of the file, and with --check-servers those it makes of Kafka (the
// topics exist) and of Redis (its settings keep every decision). Each
// problem is one line with its fix; any makes the exit code 1 (a bad file
// is 2, as for every command).
func cmdValidate(ctx context.Context, e *env, args []string) (err error) {
	fs := newFlags(e, "validate", "-c FILE [--check-servers] [-b BROKERS] [--redis-url URL]")
	cf := addConfigFlags(fs, "kafka.", "store.")
	checkServers := fs.Bool("check-servers", false, "also check the Kafka topics and the Redis settings, as run does at start")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("validate takes no arguments, got %q", fs.Args())
	}
	cfg, err := cf.load(e)
	if err != nil {
		return err
	}
	names := make([]string, len(cfg.Pipelines))
	for i, p := range cfg.Pipelines {
		names[i] = p.Name
	}
	fmt.Fprintf(e.stdout, "configuration: valid, %d pipeline(s): %s\n", len(cfg.Pipelines), strings.Join(names, ", "))
	if cfg.HTTP != nil {
		routes := make([]string, len(cfg.HTTP.Routes))
		for i, r := range cfg.HTTP.Routes {
			routes[i] = r.Name + " (" + r.Method + " " + r.Path + ")"
		}
		fmt.Fprintf(e.stdout, "http: %d route(s): %s\n", len(routes), strings.Join(routes, ", "))
	}
	if !*checkServers {
		return nil
	}
	problems := 0
	problem := func(format string, a ...any) {
		problems++
		fmt.Fprintf(e.stdout, "problem: "+format+"\n", a...)
	}

	if err := checkTopics(ctx, e, cfg, problem); err != nil {
		return err
	}
	checkSchemas(ctx, e, cfg, problem)
	if cfg.Store.Kind == "redis" {
		store, closeStore, err := consumer.OpenStore(cfg, e.getenv)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, closeStore()) }()
		rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		warnings, cerr := store.(*redisstore.Store).CheckServer(rctx)
		cancel()
		for _, w := range warnings {
			fmt.Fprintf(e.stdout, "warning: %s\n", w)
		}
		var se *redisstore.SettingsError
		switch {
		case errors.As(cerr, &se):
			for _, p := range se.Problems {
				problem("%s", p)
			}
		case cerr != nil:
			problem("redis: %v: check store.redis", cerr)
		default:
			fmt.Fprintln(e.stdout, "redis: settings keep every acknowledged decision")
		}
	}
	if problems > 0 {
		return fmt.Errorf("%d problem(s) found", problems)
	}
	return nil
}

// checkSchemas checks the schema registry (it answers, the credentials may
// read it) and reads each pipeline's reader schema, as run does at start.
func checkSchemas(ctx context.Context, e *env, cfg *schemas.Config, problem func(string, ...any)) {
	if cfg.SchemaRegistry != nil {
		reg, err := cfg.Registry()
		if err == nil {
			err = reg.Check(ctx)
		}
		if err != nil {
			problem("schema registry: %v", err)
			return
		}
		fmt.Fprintf(e.stdout, "schema registry: %s answers\n", cfg.SchemaRegistry.URL)
	}
	for _, p := range cfg.Pipelines {
		d, err := cfg.Decoder(ctx, p)
		switch {
		case err != nil:
			problem("%v", err)
		case d != nil:
			if pol, err := cfg.Policy(p); err == nil {
				if canon, err := dedupe.NewCanonicalizer(pol.Rules); err == nil {
					fmt.Fprintf(e.stdout, "rules: pipeline %s: %s\n", p.Name, canon.RulesDigest())
				}
			}
			id, subject, version := d.Reader()
			if subject == "" {
				fmt.Fprintf(e.stdout, "schema: pipeline %s reads %s payloads (%s)\n", p.Name, p.Payload, d.Digest())
				continue
			}
			fmt.Fprintf(e.stdout, "schema: pipeline %s resolves %s records to %s version %d (id %d)\n", p.Name, p.Payload, subject, version, id)
		}
	}
}

// checkTopics checks that every pipeline's topics exist.
func checkTopics(ctx context.Context, e *env, cfg *schemas.Config, problem func(string, ...any)) error {
	io, err := sinks.Connect(cfg, e.getenv)
	if err != nil {
		return err
	}
	defer io.Close()
	for _, p := range cfg.Pipelines {
		for _, t := range []struct{ role, topic string }{{"input", p.Input}, {"output", p.Output}, {"dlq", p.DLQ}, {"replies", p.Replies}} {
			if t.topic == "" {
				continue
			}
			tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			n, err := io.Partitions(tctx, t.topic)
			cancel()
			switch {
			case errors.Is(err, sinks.ErrUnknownTopic):
				problem("pipeline %s: %s topic %s does not exist: create it (kafka-topics.sh --create --topic %s)", p.Name, t.role, t.topic, t.topic)
			case err != nil:
				problem("pipeline %s: %s topic %s: %v: check kafka.brokers (%s) and the credentials", p.Name, t.role, t.topic, err, strings.Join(cfg.Kafka.Brokers, ","))
			default:
				fmt.Fprintf(e.stdout, "kafka: pipeline %s: %s topic %s has %d partition(s)\n", p.Name, t.role, t.topic, n)
			}
		}
	}

	return nil
}
