package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func cmdVersion(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "version", "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rev := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = " (" + s.Value[:12] + ")"
			}
		}
	}
	fmt.Fprintf(e.stdout, "idemstream %s%s %s %s/%s\n", version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}

// errNotBuilt says plainly that a command has no implementation in this
// build, instead of pretending to work.
var errNotBuilt = errors.New("not available in this build yet")

func cmdDemo(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "demo", "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return fmt.Errorf("the embedded-broker demo is %w; meanwhile try 'idemstream hash' and 'idemstream diff' on deploy/examples/", errNotBuilt)
}
