package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/schemas"
)

func cmdInspect(ctx context.Context, e *env, args []string) (err error) {
	fs := newFlags(e, "inspect", "-c FILE [--pipeline NAME] [-o text|json] KEY")
	cf := addConfigFlags(fs, "store.")
	pipeline := fs.String("pipeline", "", "pipeline of the key (optional when the config has one)")
	outputOf := outputFlag(fs, "text", "text", "json")
	output, err := parseOutput(fs, args, outputOf)
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
	store, closeStore, err := consumer.OpenStore(cfg, e.getenv)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeStore()) }()
	entry, found, err := store.Lookup(ctx, p.Name, key)
	if err != nil {
		return err
	}
	entry.RulesDigest = currentRules(cfg, p, entry.RulesDigest)
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

// currentRules gives back the pipeline's rules digest for rd when rd is
// its first 16 hex digits, as a compact entry keeps it; any other digest
// (rules since changed, or a pipeline whose rules cannot be built here)
// is printed as stored.
func currentRules(cfg *schemas.Config, p schemas.Pipeline, rd string) string {
	if len(rd) != len("sha256:")+16 {
		return rd
	}
	pol, err := cfg.Policy(p)
	if err != nil {
		return rd
	}
	canon, err := dedupe.NewCanonicalizer(pol.Rules)
	if err != nil {
		return rd
	}
	if d := canon.RulesDigest(); strings.HasPrefix(d, rd) {
		return d
	}
	return rd
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
