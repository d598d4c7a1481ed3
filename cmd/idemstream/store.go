package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe/redisstore"
)

// cmdStore reads the store's generation markers (status) or accepts a
// loss (accept-loss): see docs/operations.md, "The store forgot".
func cmdStore(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(e.stdout, storeUsage)
		return nil
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usagef("store takes a subcommand: status, accept-loss or formats")
	}
	switch args[0] {
	case "status":
		return storeStatus(ctx, e, args[1:])
	case "accept-loss":
		return storeAcceptLoss(ctx, e, args[1:])
	case "formats":
		return storeFormats(ctx, e, args[1:])
	}
	return usagef("unknown store subcommand %q: status, accept-loss or formats", args[0])
}

const storeUsage = `Usage: idemstream store status -c FILE [-o text|json]
       idemstream store accept-loss -c FILE --yes
       idemstream store formats -c FILE [-o text|json]

status reads the store's generation markers: armed (the store holds its
decisions), forgot (it lost them: nothing is decided), new or inconsistent.
accept-loss arms a new generation after a loss: every member decides again,
and commands whose decisions were lost are decided first again when they
come back. See docs/operations.md, "The store forgot".
formats counts the prefix's entries as text and compact (SCAN), and the
values there this release does not read: a rollback to a release before
compact entries waits until it finds no compact one.
See docs/operations.md, "Upgrading to compact entries".
`

// storeFormats counts the entries of each format.
func storeFormats(ctx context.Context, e *env, args []string) (err error) {
	s, output, closeStore, err := openStoreCommand(e, "formats", args)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeStore()) }()
	f, err := s.CountFormats(ctx)
	if err != nil {
		return err
	}
	if output == "json" {
		return writeJSON(e, map[string]int64{"text": f.Text, "compact": f.Compact, "other": f.Other})
	}
	fmt.Fprintf(e.stdout, "entries: %d text, %d compact\n", f.Text, f.Compact)
	if f.Other > 0 {
		fmt.Fprintf(e.stdout, "%d value(s) under the prefix are no entry this release reads (a later release's, or another program's): a pipeline that meets one stops\n", f.Other)
	}
	if f.Compact > 0 {
		fmt.Fprintln(e.stdout, "a release before compact entries would read the compact ones as no entry: do not roll back to it yet")
	}
	return nil
}

// openStoreCommand parses the flags of "store <name>" (a config and
// -o text|json, no arguments) and opens the config's Redis store.
func openStoreCommand(e *env, name string, args []string) (s *redisstore.Store, output string, closeStore func() error, err error) {
	fs := newFlags(e, "store "+name, "-c FILE [-o text|json]")
	cf := addConfigFlags(fs, "store.")
	outputOf := outputFlag(fs, "text", "text", "json")
	if output, err = parseOutput(fs, args, outputOf); err != nil {
		return nil, "", nil, err
	}
	if fs.NArg() != 0 {
		return nil, "", nil, usagef("store %s takes no arguments, got %d", name, fs.NArg())
	}
	s, closeStore, err = openRedisStore(e, cf)
	return s, output, closeStore, err
}

// openRedisStore opens the configuration's Redis store; a memory store
// has no markers to read.
func openRedisStore(e *env, cf *configFlags) (*redisstore.Store, func() error, error) {
	cfg, err := cf.load(e)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Store.Kind != "redis" {
		return nil, nil, usagef("store.kind is %s: only a Redis store keeps decisions it could forget", cfg.Store.Kind)
	}
	store, closeStore, err := consumer.OpenStore(cfg, e.getenv)
	if err != nil {
		return nil, nil, err
	}
	return store.(*redisstore.Store), closeStore, nil
}

func storeStatus(ctx context.Context, e *env, args []string) (err error) {
	s, output, closeStore, err := openStoreCommand(e, "status", args)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeStore()) }()
	st, err := s.Status(ctx)
	if err != nil {
		return err
	}
	state := "armed"
	switch {
	case st.Loss != nil:
		state = "forgot"
	case st.Absent == st.Markers:
		state = "new"
	case st.Armed == "":
		state = "inconsistent"
	}
	if output == "json" {
		out := map[string]any{"state": state, "markers": st.Markers, "absent": st.Absent, "values": st.Values}
		if st.Loss != nil {
			loss := map[string]any{"generation": st.Loss.Generation, "since": st.Loss.Since.UTC(), "reason": st.Loss.Reason}
			if st.Loss.Hold > 0 {
				loss["resumes_at"] = st.Loss.Since.Add(st.Loss.Hold).UTC()
			}
			out["loss"] = loss
		}
		return writeJSON(e, out)
	}
	fmt.Fprintf(e.stdout, "state: %s (%d marker(s), %d missing)\n", state, st.Markers, st.Absent)
	switch state {
	case "forgot":
		fmt.Fprintf(e.stdout, "%s\n", st.Loss.Error())
	case "new":
		fmt.Fprintln(e.stdout, "no marker: no idemstream of this release has decided on this prefix yet; the first to do so arms it")
	case "inconsistent":
		fmt.Fprintln(e.stdout, "the markers disagree and no loss is recorded yet: the next decision records it")
	}
	values := make([]string, 0, len(st.Values))
	for v := range st.Values {
		values = append(values, v)
	}
	slices.Sort(values)
	for _, v := range values {
		fmt.Fprintf(e.stdout, "  %6d × %s\n", st.Values[v], v)
	}
	return nil
}

func storeAcceptLoss(ctx context.Context, e *env, args []string) (err error) {
	fs := newFlags(e, "store accept-loss", "-c FILE --yes")
	cf := addConfigFlags(fs, "store.")
	yes := fs.Bool("yes", false, "accept that keys whose entries the store lost are decided first again when their commands come back")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("store accept-loss takes no arguments, got %d", fs.NArg())
	}
	if !*yes {
		return usagef("accept-loss lets every idemstream decide again on this store: commands whose decisions it lost are decided first again (a second result each) when they come back; run `idemstream store status` first, then again with --yes")
	}
	s, closeStore, err := openRedisStore(e, cf)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeStore()) }()
	v, err := s.AcceptLoss(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "armed anew: %s\nevery member resumes within a second of its next try\n", v)
	return nil
}
