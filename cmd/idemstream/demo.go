package main

import (
	"context"
	"encoding/json"

	"github.com/idemstream/idemstream/internal/demo"
)

func cmdDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "demo", "[--seed N] [--users N] [--commands N] [--stock N] [--json]")
	var w demo.Workload
	fs.Uint64Var(&w.Seed, "seed", 618, "seed of the workload: the same seed gives the same run")
	fs.IntVar(&w.Users, "users", 400, "users who claim the coupon")
	fs.IntVar(&w.Commands, "commands", 2400, "claim records sent, retries included")
	fs.IntVar(&w.Stock, "stock", 500, "coupons in stock")
	fs.Float64Var(&w.Conflicts, "conflicts", 0.012, "share of records that reuse a key with another amount")
	fs.Float64Var(&w.Garbage, "garbage", 0.01, "share of records that are not valid commands")
	members := fs.Int("members", 3, "consumer group members per pipeline")
	asJSON := fs.Bool("json", false, "print the figures as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if w.Users <= 0 || w.Commands < w.Users || w.Stock < 0 {
		return usagef("want --users > 0, --commands >= --users and --stock >= 0")
	}
	opts := demo.Options{Workload: w, Members: *members}
	if !*asJSON {
		opts.Progress = e.stderr
	}
	f, err := demo.Run(ctx, opts)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(f)
	}
	f.Print(e.stdout)
	return nil
}
