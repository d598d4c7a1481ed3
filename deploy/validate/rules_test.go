package validate

import (
	"flag"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite generated files (deploy/kubernetes/prometheusrule.yaml)")

func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	groups, errs := rulefmt.ParseFile(deployPath("prometheus", "rules.yaml"), false, model.LegacyValidation, promParser, logger)
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return groups
}

// recordedNames are the series the rules record.
func recordedNames(groups *rulefmt.RuleGroups) map[string]bool {
	out := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	return out
}

var recordName = regexp.MustCompile(`^idemstream:[a-z0-9_]+:[a-z0-9_]+$`)

// TestRules: rules.yaml is a strict, valid rule file; every expression
// parses and selects only metrics idemstream registers (or that a rule
// records); recording rules follow level:metric:operations; every alert has
// a severity and the summary, description and runbook annotations.
func TestRules(t *testing.T) {
	groups := loadRules(t)
	metrics := registered(t)
	recorded := recordedNames(groups)
	var nRecord, nAlert int
	have := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := r.Record + r.Alert
			where := "rules.yaml " + g.Name + "/" + name
			checkExpr(t, where, r.Expr, metrics, recorded)
			if r.Record != "" {
				nRecord++
				if !recordName.MatchString(r.Record) {
					t.Errorf("%s: recording rule name should be idemstream:<metric>:<operations>", where)
				}
				continue
			}
			nAlert++
			have[r.Alert] = true
			if sev := r.Labels["severity"]; sev != "critical" && sev != "warning" {
				t.Errorf("%s: severity label %q, want critical or warning", where, sev)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %q annotation", where, a)
				}
			}
			if time.Duration(r.For) < time.Minute {
				t.Errorf("%s: for: %v; an alert that fires on one evaluation pages on noise", where, r.For)
			}
		}
	}
	// The recording rule the documentation names, defined exactly as documented.
	dup := findRule(groups, "idemstream:duplicate_rate:ratio_rate5m")
	if dup == nil {
		t.Fatal("no recording rule idemstream:duplicate_rate:ratio_rate5m")
	}
	compact := strings.Join(strings.Fields(dup.Expr), " ")
	if !strings.Contains(compact, `rate(idemstream_records_total{outcome="replay"}[5m])`) ||
		!strings.Contains(compact, `rate(idemstream_records_total{outcome=~"first|replay|conflict"}[5m])`) {
		t.Errorf("duplicate rate must be replay / (first + replay + conflict), got:\n%s", dup.Expr)
	}
	for _, rec := range []string{"idemstream:conflict_rate:ratio_rate5m", "idemstream:dlq_records:rate5m", "idemstream:consumer_lag:sum"} {
		if findRule(groups, rec) == nil {
			t.Errorf("no recording rule %s", rec)
		}
	}
	for _, a := range []string{"IdemstreamInstanceDown", "IdemstreamStoreErrors", "IdemstreamStoreForgot", "IdemstreamLagHigh", "IdemstreamLagGrowing",
		"IdemstreamDLQBurst", "IdemstreamConflictSpike"} {
		if !have[a] {
			t.Errorf("no alert %s", a)
		}
	}
	t.Logf("%d recording rules, %d alerts", nRecord, nAlert)
}

func findRule(groups *rulefmt.RuleGroups, record string) *rulefmt.Rule {
	for gi := range groups.Groups {
		for ri := range groups.Groups[gi].Rules {
			if groups.Groups[gi].Rules[ri].Record == record {
				return &groups.Groups[gi].Rules[ri]
			}
		}
	}
	return nil
}

const prometheusRuleHeader = `# GENERATED from deploy/prometheus/rules.yaml; edit that file, then run
#   cd deploy/validate && go test -run TestPrometheusRule -update
# The same recording and alert rules as a Prometheus Operator resource.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: idemstream
  labels:
    app.kubernetes.io/name: idemstream
    app.kubernetes.io/component: consumer
spec:
`

// prometheusRuleFor embeds the groups of rules.yaml, comments and all,
// under spec: of a PrometheusRule.
func prometheusRuleFor(t *testing.T, rules []byte) []byte {
	t.Helper()
	s := string(rules)
	i := strings.Index(s, "\ngroups:")
	if i < 0 {
		t.Fatal("rules.yaml: no top-level groups:")
	}
	var b strings.Builder
	b.WriteString(prometheusRuleHeader)
	for _, line := range strings.SplitAfter(s[i+1:], "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString("  ")
		}
		b.WriteString(line)
	}
	return []byte(b.String())
}

// TestPrometheusRule: deploy/kubernetes/prometheusrule.yaml carries exactly
// the groups of rules.yaml and decodes strictly into the operator's type.
func TestPrometheusRule(t *testing.T) {
	path := deployPath("kubernetes", "prometheusrule.yaml")
	want := prometheusRuleFor(t, readFile(t, deployPath("prometheus", "rules.yaml")))
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := readFile(t, path)
	if string(got) != string(want) {
		t.Fatalf("%s is stale: run `cd deploy/validate && go test -run TestPrometheusRule -update`", path)
	}
	var pr monitoringv1.PrometheusRule
	if err := yaml.UnmarshalStrict(got, &pr); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Errorf("%s: %s/%s", path, pr.APIVersion, pr.Kind)
	}
	groups := loadRules(t)
	if len(pr.Spec.Groups) != len(groups.Groups) {
		t.Fatalf("%s: %d groups, rules.yaml has %d", path, len(pr.Spec.Groups), len(groups.Groups))
	}
	for i, g := range groups.Groups {
		pg := pr.Spec.Groups[i]
		if pg.Name != g.Name || len(pg.Rules) != len(g.Rules) {
			t.Errorf("group %d: %s with %d rules, rules.yaml has %s with %d", i, pg.Name, len(pg.Rules), g.Name, len(g.Rules))
			continue
		}
		for j, r := range g.Rules {
			pr := pg.Rules[j]
			if pr.Record != r.Record || pr.Alert != r.Alert || pr.Expr.String() != r.Expr {
				t.Errorf("group %s rule %d differs from rules.yaml", g.Name, j)
			}
		}
	}
}
