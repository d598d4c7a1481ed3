package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set at build time (-ldflags "-X main.version=v1.2.3", as the
// image does); otherwise the module version from the build info: a
// release for `go install …@v1.2.3`, "(devel)" in a checkout.
var version = "dev"

// buildVersion is version, or the module version, with the VCS revision
// the build info carries ("+dirty" for a tree with uncommitted changes).
func buildVersion() string {
	v := version
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if v == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	rev, dirty := "", ""
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 12:
			rev = s.Value[:12]
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+dirty"
		}
	}
	if rev != "" && !strings.Contains(v, rev) {
		v += " (" + rev + dirty + ")"
	}
	return v
}

func cmdVersion(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "version", "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "idemstream %s %s %s/%s\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
