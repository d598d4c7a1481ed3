package validate

import (
	"strings"
	"testing"
)

// TestREADMEOperations: deploy/README.md's Operations section names every
// metric idemstream registers, every recording rule and every alert, so
// the operator's reference cannot fall behind the code and the rules.
func TestREADMEOperations(t *testing.T) {
	readme := string(readFile(t, deployPath("README.md")))
	i := strings.Index(readme, "\n## Operations")
	if i < 0 {
		t.Fatal("deploy/README.md: no \"## Operations\" section")
	}
	ops := readme[i:]
	for name := range registered(t) {
		if !strings.Contains(ops, "| `"+name+"` |") {
			t.Errorf("deploy/README.md Operations: no table row for metric %s", name)
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if !strings.Contains(ops, "| `"+r.Record+r.Alert+"` |") {
				t.Errorf("deploy/README.md Operations: no table row for %s%s", r.Record, r.Alert)
			}
		}
	}
}
