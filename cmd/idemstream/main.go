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
	"sync"
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
		{"store", "status: whether the store still holds its decisions; accept-loss: decide again after it forgot", cmdStore},
		{"validate", "check a configuration (and with --check-servers its Kafka topics and Redis) without running", cmdValidate},
		{"proxy", "serve the http section's routes idempotently in front of their upstream", cmdProxy},
		{"audit", "read a command topic and show what \"the same request\" means in it", cmdAudit},
		{"dlq", "summary, show and redrive: count, explain and send back a pipeline's dead letters", cmdDLQ},
		{"version", "print the version", cmdVersion},
	}
}

// usageError is bad usage: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv}
	if len(args) == 0 {
		// Bad usage: the list goes to stderr, like every usage error.
		printUsage(stderr)
		return exitUsage
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printUsage(stdout)
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
// exiting, and prints help (-h) to stdout: the synopsis, then each flag
// once, with its short form.
func newFlags(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	// The flag package calls Usage on -h and on every parse error: the
	// help is printed (to stdout) only when it was asked for.
	fs.Usage = func() {}
	extras.Store(fs, &flagExtras{help: func() {
		fmt.Fprintf(e.stdout, "Usage: idemstream %s %s\n\nFlags:\n", name, synopsis)
		printFlags(e.stdout, fs)
	}, short: map[string]string{}})
	return fs
}

// flagExtras is what a command's flag set has beyond the flag package's:
// its help, and the one-letter forms of its flags (long: letter).
type flagExtras struct {
	help  func()
	short map[string]string
}

// extras holds a flagExtras per flag set; commands run side by side in
// the tests.
var extras sync.Map

func extrasOf(fs *flag.FlagSet) *flagExtras {
	x, _ := extras.Load(fs)
	return x.(*flagExtras)
}

// short gives the flag long a one-letter form (-c for --config), as kcat
// and rpk users expect.
func short(fs *flag.FlagSet, letter, long string) {
	f := fs.Lookup(long)
	fs.Var(f.Value, letter, "")
	extrasOf(fs).short[long] = letter
}

func isShort(fs *flag.FlagSet, name string) bool {
	for _, l := range extrasOf(fs).short {
		if l == name {
			return true
		}
	}
	return false
}

func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		if isShort(fs, f.Name) {
			return
		}
		name := "    --" + f.Name
		if l, ok := extrasOf(fs).short[f.Name]; ok {
			name = "-" + l + ", --" + f.Name
		}
		kind, usage := flag.UnquoteUsage(f)
		if kind != "" {
			name += " " + kind
		}
		fmt.Fprintf(w, "  %s\n      \t%s", name, usage)
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// flagError rewrites the flag package's errors so that each names the
// flag as it is typed and says what it wants.
func flagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return usagef("unknown flag %s: run 'idemstream %s -h' for the flags", dashed(name), fs.Name())
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return usagef("%s needs a value", dashed(name))
	}
	var value, name string
	if _, scanErr := fmt.Sscanf(msg, "invalid value %q for flag -%s", &value, &name); scanErr == nil {
		name = strings.TrimSuffix(name, ":")
		want := "another value"
		if f := fs.Lookup(name); f != nil {
			switch fmt.Sprintf("%T", f.Value) {
			case "*flag.durationValue":
				want = "a duration such as 5s"
			case "*flag.intValue", "*flag.int64Value", "*flag.uintValue", "*flag.uint64Value":
				want = "a whole number"
			case "*flag.float64Value":
				want = "a number"
			case "*flag.boolValue":
				want = "true or false"
			}
			if _, detail, found := strings.Cut(msg, name+": "); found && want == "another value" {
				want = detail
			}
		}
		return usagef("%s: %q: want %s", dashed(name), value, want)
	}
	return usagef("%v", err)
}

func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// choice checks a flag's value against the values it takes.
func choice(flagName, value string, allowed ...string) error {
	for _, a := range allowed {
		if value == a {
			return nil
		}
	}
	return usagef("%s: %q: want %s", flagName, value, strings.Join(allowed, " or "))
}

// outputFlag is -o, --output: the one way every command that prints data
// chooses its form.
func outputFlag(fs *flag.FlagSet, def string, allowed ...string) func() (string, error) {
	out := fs.String("output", def, "output: "+strings.Join(allowed, " or "))
	short(fs, "o", "output")
	return func() (string, error) { return *out, choice("--output", *out, allowed...) }
}

// parseOutput parses a command's flags and returns its --output.
func parseOutput(fs *flag.FlagSet, args []string, outputOf func() (string, error)) (string, error) {
	if err := parseFlags(fs, args); err != nil {
		return "", err
	}
	return outputOf()
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	// Flags may follow positional arguments: "hash a.json --config c.yaml".
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				extrasOf(fs).help()
				return err
			}
			return flagError(fs, err)
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
	// fields are the overridable fields this command takes (by path
	// prefix); the others are neither listed nor read.
	fields []string
}

// addConfigFlags adds -c, --config and the flags (and environment
// variables) of the overridable fields whose path starts with one of
// fields: a command lists only what it uses.
func addConfigFlags(fs *flag.FlagSet, fields ...string) *configFlags {
	cf := &configFlags{overrides: schemas.Overrides{}, fields: fields}
	fs.StringVar(&cf.path, "config", "", "configuration file (or IDEMSTREAM_CONFIG)")
	short(fs, "c", "config")
	for _, f := range schemas.OverridableFields {
		if !cf.takes(f) {
			continue
		}
		path := f.Path
		fs.Func(f.Flag, f.Help+" (or "+f.FlagEnv()+")", func(v string) error {
			cf.overrides[path] = v
			return nil
		})
		if f.Flag == "brokers" {
			short(fs, "b", "brokers")
		}
	}
	return cf
}

func (cf *configFlags) takes(f schemas.OverridableField) bool {
	for _, p := range cf.fields {
		if strings.HasPrefix(f.Path, p) {
			return true
		}
	}
	return false
}

func (cf *configFlags) load(e *env) (*schemas.Config, error) {
	path := cf.path
	if path == "" {
		path = e.getenv("IDEMSTREAM_CONFIG")
	}
	if path == "" {
		return nil, usagef("-c, --config FILE is required (or set IDEMSTREAM_CONFIG)")
	}
	envOv, from := schemas.EnvOverridesFrom(e.getenv)
	for p := range envOv {
		if !cf.takesPath(p) {
			delete(envOv, p)
		}
	}
	cfg, err := schemas.Load(path, envOv, cf.overrides)
	var fe *schemas.FieldError
	if errors.As(err, &fe) && fe.Field != "" {
		// A bad value that came from a flag or a variable names it: the
		// file may not even hold the field.
		for _, f := range schemas.OverridableFields {
			if !strings.HasPrefix(fe.Field, f.Path) {
				continue
			}
			if _, ok := cf.overrides[f.Path]; ok {
				fe.Msg += " (from --" + f.Flag + ")"
			} else if name, ok := from[f.Path]; ok {
				fe.Msg += " (from " + name + ")"
			}
		}
	}
	return cfg, err
}

func (cf *configFlags) takesPath(path string) bool {
	for _, f := range schemas.OverridableFields {
		if f.Path == path {
			return cf.takes(f)
		}
	}
	return false
}
