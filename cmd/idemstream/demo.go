package main

import (
	"context"
	"io"

	"github.com/idemstream/idemstream/internal/demo"
)

func cmdDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "demo", "[--seed N] [--users N] [--commands N] [--stock N] [--conflicts F] [--garbage F] [--members N] [--payload json|avro] [--http] [-o text|json]")
	var w demo.Workload
	fs.Uint64Var(&w.Seed, "seed", 618, "seed of the workload: the same seed gives the same run")
	fs.IntVar(&w.Users, "users", 400, "users who claim the coupon")
	fs.IntVar(&w.Commands, "commands", 2400, "claim records sent, retries included")
	fs.IntVar(&w.Stock, "stock", 500, "coupons in stock")
	fs.Float64Var(&w.Conflicts, "conflicts", 0.012, "share of records that reuse a key with another amount")
	fs.Float64Var(&w.Garbage, "garbage", 0.01, "share of records that are not valid commands")
	members := fs.Int("members", 3, "consumer group members per pipeline")
	payload := fs.String("payload", "json", "json, or avro: the claims as Avro records through an in-process schema registry")
	overHTTP := fs.Bool("http", false, "send the campaign as HTTP requests, straight to the endpoint and through idemstream proxy, instead of as Kafka commands")
	outputOf := outputFlag(fs, "text", "text", "json")
	output, err := parseOutput(fs, args, outputOf)
	if err != nil {
		return err
	}
	asJSON := output == "json"
	if w.Users <= 0 || w.Commands < w.Users || w.Stock < 0 {
		return usagef("want --users > 0, --commands >= --users and --stock >= 0")
	}
	if *payload != "json" && *payload != "avro" {
		return usagef("--payload %q: want json or avro", *payload)
	}
	if *payload == "avro" && *overHTTP {
		return usagef("--payload avro is for the Kafka campaign, not --http")
	}
	opts := demo.Options{Workload: w, Members: *members, Payload: *payload}
	// Progress is for a person watching: only to a terminal.
	if !asJSON && isTerminal(e.stderr) {
		opts.Progress = e.stderr
	}
	var f interface{ Print(io.Writer) }
	if *overHTTP {
		f, err = demo.RunHTTP(ctx, opts)
	} else {
		f, err = demo.Run(ctx, opts)
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e, f)
	}
	f.Print(e.stdout)
	return nil
}
