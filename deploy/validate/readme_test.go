package validate

import (
	"path/filepath"
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

// TestOneMetricsTable: the metrics and alerts are tabled once, in
// deploy/README.md; every other document links to it. A second copy would
// fall behind unchecked.
func TestOneMetricsTable(t *testing.T) {
	docs, err := filepath.Glob(deployPath("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, deployPath("..", "README.md"))
	metrics := registered(t)
	for _, doc := range docs {
		text := string(readFile(t, doc))
		for name := range metrics {
			if strings.Contains(text, "| `"+name+"` |") {
				t.Errorf("%s has a table row for %s: the metrics table lives in deploy/README.md only", doc, name)
			}
		}
		for _, g := range loadRules(t).Groups {
			for _, r := range g.Rules {
				if r.Alert != "" && strings.Contains(text, "| `"+r.Alert+"` |") {
					t.Errorf("%s has a table row for alert %s: the alerts table lives in deploy/README.md only", doc, r.Alert)
				}
			}
		}
	}
	if len(docs) < 5 {
		t.Errorf("only %d documents checked", len(docs))
	}
}
