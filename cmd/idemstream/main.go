package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/schemas"
)

// Exit codes of docs/operations.md.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// quietRedis drops go-redis's own log lines (one per failed dial): every
// failure reaches the caller as an error, which idemstream reports once.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedis{}) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// env is the process environment, injected so tests do not inherit the
// developer's IDEMSTREAM_* variables.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *env, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"run", "run the consumer (many instances form one group)", cmdRun},
		{"demo", "replay the coupon incident of docs/incident.md on an embedded broker", cmdDemo},
		{"hash", "print the canonical form and fingerprint of a payload", cmdHash},
		{"diff", "print the JSON Pointers where two payloads differ", cmdDiff},
		{"contract", "render the client-facing idempotency contract", cmdContract},
		{"inspect", "print the stored state of one key", cmdInspect},
		{"audit", "read a command topic and show what \"the same request\" means in it", cmdAudit},
		{"version", "print the version", cmdVersion},
	}
}

// usageError is bad usage: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printUsage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, e, args[1:])
		return report(stderr, c.name, err)
	}
	fmt.Fprintf(stderr, "idemstream: unknown command %q: run 'idemstream help' for the list\n", args[0])
	return exitUsage
}

func report(stderr io.Writer, name string, err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "idemstream %s: %s\n", name, oneLine(err.Error()))
	var ue *usageError
	var fe *schemas.FieldError
	if errors.As(err, &ue) || errors.As(err, &fe) {
		return exitUsage
	}
	return exitFailure
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "idemstream makes asynchronous commands on Kafka idempotent.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: idemstream COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'idemstream COMMAND -h' for a command's flags. Exit codes: 0 ok, 1 failure, 2 bad usage or config.")
}

// newFlags makes a flag set that reports errors as usage errors instead of
// exiting, and prints help to stdout.
func newFlags(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "Usage: idemstream %s %s\n\nFlags:\n", name, synopsis)
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	// Flags may follow positional arguments: "hash a.json --config c.yaml".
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err // Parse has printed the usage already
			}
			return usagef("%v", err)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return fs.Parse(append([]string{"--"}, positional...))
}

// configFlags are the flags every config-reading command shares.
type configFlags struct {
	path      string
	overrides schemas.Overrides
}

func addConfigFlags(fs *flag.FlagSet, withOverrides bool) *configFlags {
	cf := &configFlags{overrides: schemas.Overrides{}}
	fs.StringVar(&cf.path, "config", "", "configuration file (or IDEMSTREAM_CONFIG)")
	if withOverrides {
		for _, f := range schemas.OverridableFields {
			path := f.Path
			fs.Func(f.Flag, f.Help+" (or "+f.Env+")", func(v string) error {
				cf.overrides[path] = v
				return nil
			})
		}
	}
	return cf
}

func (cf *configFlags) load(e *env) (*schemas.Config, error) {
	path := cf.path
	if path == "" {
		path = e.getenv("IDEMSTREAM_CONFIG")
	}
	if path == "" {
		return nil, usagef("--config FILE is required (or set IDEMSTREAM_CONFIG)")
	}
	return schemas.Load(path, schemas.EnvOverrides(e.getenv), cf.overrides)
}
