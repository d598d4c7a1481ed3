package main

import (
	"strings"
	"testing"
)

// Every command prints its usage once for -h and --help, and exits 0.
func TestHelpPrintsUsageOnce(t *testing.T) {
	for _, c := range commands {
		for _, flag := range []string{"-h", "--help"} {
			r := runCLI(t, "", c.name, flag)
			if r.code != exitOK {
				t.Errorf("%s %s: exit %d, want 0; stderr: %s", c.name, flag, r.code, r.stderr)
			}
			if n := strings.Count(r.stdout, "Usage: idemstream "+c.name); n != 1 {
				t.Errorf("%s %s: usage printed %d times:\n%s", c.name, flag, n, r.stdout)
			}
		}
	}
}
