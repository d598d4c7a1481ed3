package validate

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/frontdoor"
	"github.com/idemstream/idemstream/schemas"
)

// root is the repository root, deployDir its deploy/ directory.
var (
	root      = filepath.Join("..", "..")
	deployDir = filepath.Join("..")
)

func deployPath(parts ...string) string {
	return filepath.Join(append([]string{deployDir}, parts...)...)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// metric is one family that idemstream registers.
type metric struct {
	Name   string
	Type   dto.MetricType
	Labels []string
	Help   string
}

// registered lists the metric families of consumer.NewMetrics, with every
// vector touched once so that it shows in Gather. The collectors are
// caught as NewMetrics registers them: a metric added to consumer.Metrics
// is covered without a change here.
func registered(t *testing.T) map[string]metric {
	t.Helper()
	reg := prometheus.NewRegistry()
	caught := &catching{Registerer: reg}
	if _, err := consumer.NewMetrics(caught, "test"); err != nil {
		t.Fatalf("consumer.NewMetrics: %v", err)
	}
	if _, err := frontdoor.NewMetrics(caught); err != nil {
		t.Fatalf("frontdoor.NewMetrics: %v", err)
	}
	for _, c := range caught.collectors {
		get := reflect.ValueOf(c).MethodByName("GetMetricWithLabelValues")
		if !get.IsValid() {
			continue
		}
		touched := false
		for n := 0; n <= 6 && !touched; n++ {
			args := make([]reflect.Value, n)
			for j := range args {
				args[j] = reflect.ValueOf("x")
			}
			out := get.Call(args)
			touched = out[1].IsNil()
		}
		if !touched {
			t.Fatalf("%T: could not create a child with 0..6 labels", c)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]metric{}
	for _, fam := range fams {
		mt := metric{Name: fam.GetName(), Type: fam.GetType(), Help: fam.GetHelp()}
		if len(fam.Metric) > 0 {
			for _, lp := range fam.Metric[0].Label {
				mt.Labels = append(mt.Labels, lp.GetName())
			}
			sort.Strings(mt.Labels)
		}
		out[mt.Name] = mt
	}
	return out
}

// promParser parses PromQL as Prometheus does by default.
var promParser = parser.NewParser(parser.Options{})

// selectorsOf returns the vector selectors of an expression.
func selectorsOf(expr parser.Expr) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == "__name__" {
			return m.Value
		}
	}
	return ""
}

// allowedExternal are series that do not come from idemstream itself.
var allowedExternal = map[string][]string{
	"up": {"job", "instance"},
}

// targetLabels are added by Prometheus to every scraped series.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// knownLabelValues are the values the documentation defines for enumerated labels.
var knownLabelValues = map[string][]string{
	"outcome": {"first", "replay", "conflict", "invalid", "failed"},
	"reason":  {"conflict", "missing_key", "invalid_key", "malformed_payload", "payload_too_large", "invalid_schema", "unknown_schema", "incompatible_schema", "non_finite_number", "handler_failed"},
	"op":      {"decide", "complete", "lookup"},
}

// checkExpr parses expr and checks every metric it selects: it must be
// registered by idemstream (a histogram's _bucket, _count and _sum map to
// the histogram), produced by a recording rule in recorded, or allowed as
// external; every label matcher must name a label the metric has, and an
// equality matcher on an enumerated label a value the documentation defines. It returns
// the names it found.
func checkExpr(t *testing.T, where, expr string, metrics map[string]metric, recorded map[string]bool) []string {
	t.Helper()
	e, err := promParser.ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: PromQL does not parse: %v\n%s", where, err, expr)
		return nil
	}
	var names []string
	for _, vs := range selectorsOf(e) {
		name := selectorName(vs)
		if name == "" {
			t.Errorf("%s: selector %s has no metric name", where, vs)
			continue
		}
		names = append(names, name)
		var labels []string
		switch {
		case recorded[name]:
			continue // labels of recorded series are checked where they are made
		case allowedExternal[name] != nil:
			labels = allowedExternal[name]
		default:
			m, ok := metrics[name]
			base, suffix := histogramBase(name)
			if !ok && suffix != "" {
				if hm, hok := metrics[base]; hok && hm.Type == dto.MetricType_HISTOGRAM {
					m, ok = hm, true
					if suffix == "_bucket" {
						labels = append(labels, "le")
					}
				}
			}
			if !ok {
				t.Errorf("%s: metric %q is not registered by idemstream (consumer.NewMetrics) nor made by a recording rule", where, name)
				continue
			}
			if m.Type == dto.MetricType_HISTOGRAM && suffix == "" {
				t.Errorf("%s: histogram %q used without _bucket, _count or _sum (classic histograms have no bare series)", where, name)
			}
			labels = append(labels, m.Labels...)
		}
		labels = append(labels, targetLabels...)
		for _, lm := range vs.LabelMatchers {
			if lm.Name == "__name__" {
				continue
			}
			if !contains(labels, lm.Name) {
				t.Errorf("%s: %s has no label %q (it has %v)", where, name, lm.Name, labels)
			}
			if vals, ok := knownLabelValues[lm.Name]; ok && lm.Type.String() == "=" && !contains(vals, lm.Value) {
				t.Errorf("%s: %s{%s=%q}: %q is not one of %v", where, name, lm.Name, lm.Value, lm.Value, vals)
			}
			if vals, ok := knownLabelValues[lm.Name]; ok && lm.Type.String() == "=~" && regexp.MustCompile(`^[a-z_|]+$`).MatchString(lm.Value) {
				for _, alt := range strings.Split(lm.Value, "|") {
					if !contains(vals, alt) {
						t.Errorf("%s: %s{%s=~%q}: %q is not one of %v", where, name, lm.Name, lm.Value, alt, vals)
					}
				}
			}
		}
	}
	return names
}

func histogramBase(name string) (base, suffix string) {
	for _, s := range []string{"_bucket", "_count", "_sum"} {
		if strings.HasSuffix(name, s) {
			return strings.TrimSuffix(name, s), s
		}
	}
	return name, ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// loadConfig checks that data is a valid idemstream configuration.
func loadConfig(t *testing.T, where string, data []byte) *schemas.Config {
	t.Helper()
	cfg, err := schemas.Parse(data, deployDir)
	if err != nil {
		t.Fatalf("%s: not a valid idemstream config: %v", where, err)
	}
	return cfg
}

// catching is a Registerer that keeps what is registered on it.
type catching struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (c *catching) Register(col prometheus.Collector) error {
	c.collectors = append(c.collectors, col)
	return c.Registerer.Register(col)
}

func (c *catching) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}
