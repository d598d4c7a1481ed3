package validate

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	dir, err := filepath.Abs(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	details := types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		Environment: types.Mapping{},
	}
	// Schema validation, interpolation and the consistency checks
	// (depends_on targets, volumes, networks) all run, as in `docker compose config`.
	p, err := loader.LoadWithContext(context.Background(), details, func(o *loader.Options) {
		o.SetProjectName("idemstream", true)
		o.ResolvePaths = true
	})
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return p
}

func argv(c types.ShellCommand) string { return strings.Join(c, " ") }

// bindSource returns the host path bound at target in s, if any.
func bindSource(s types.ServiceConfig, target string) string {
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == target {
			return v.Source
		}
	}
	return ""
}

// TestCompose: compose.yaml loads with compose-go and has the stack the
// README describes, wired to the files of deploy/.
func TestCompose(t *testing.T) {
	p := loadCompose(t)
	svc := func(name string) types.ServiceConfig {
		t.Helper()
		s, ok := p.Services[name]
		if !ok {
			t.Fatalf("compose.yaml: no service %q (have %v)", name, p.ServiceNames())
		}
		return s
	}
	dir, _ := filepath.Abs(deployDir)
	mustExist := func(where, path string) {
		t.Helper()
		if path == "" {
			t.Errorf("%s: not bound", where)
			return
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s: %v", where, err)
		}
	}

	// The idemstream config of the stack.
	cfgPath := filepath.Join(dir, "compose", "idemstream.yaml")
	cfg := loadConfig(t, "compose/idemstream.yaml", readFile(t, cfgPath))
	if cfg.Store.Kind != "redis" || !strings.HasPrefix(cfg.Store.Redis.URL, "redis://redis:6379") {
		t.Errorf("compose/idemstream.yaml: store %s %s, want redis at redis://redis:6379", cfg.Store.Kind, cfg.Store.Redis.URL)
	}
	if !slices.Equal(cfg.Kafka.Brokers, []string{"kafka:9092"}) {
		t.Errorf("compose/idemstream.yaml: brokers %v, want [kafka:9092]", cfg.Kafka.Brokers)
	}

	// Kafka, and the one-shot that creates every topic of the config.
	kafka := svc("kafka")
	// The stack runs the Kafka version the tests run.
	m := regexp.MustCompile(`(?m)^default_version=(\S+)$`).FindSubmatch(readFile(t, filepath.Join(root, "internal", "testenv", "scripts", "kafka.sh")))
	if m == nil {
		t.Fatal("internal/testenv/scripts/kafka.sh: no default_version=")
	}
	for _, name := range []string{"kafka", "kafka-init"} {
		if image := svc(name).Image; image != "apache/kafka:"+string(m[1]) {
			t.Errorf("%s: image %s, want apache/kafka:%s, the version the tests run", name, image, m[1])
		}
	}
	if env := kafka.Environment["KAFKA_PROCESS_ROLES"]; env == nil || *env != "broker,controller" {
		t.Error("kafka: want a single KRaft node (KAFKA_PROCESS_ROLES=broker,controller)")
	}
	if kafka.HealthCheck == nil {
		t.Error("kafka: no healthcheck")
	}
	init := svc("kafka-init")
	script := argv(init.Entrypoint) + " " + argv(init.Command)
	if !strings.Contains(script, "/opt/kafka/bin/kafka-topics.sh") || !strings.Contains(script, "--partitions 6") {
		t.Errorf("kafka-init: want kafka-topics.sh --create ... --partitions 6, got %q", script)
	}
	for _, pl := range cfg.Pipelines {
		for _, topic := range []string{pl.Input, pl.Output, pl.DLQ, pl.Replies} {
			if topic != "" && !strings.Contains(script, topic) {
				t.Errorf("kafka-init does not create topic %s of pipeline %s", topic, pl.Name)
			}
		}
	}
	if dep, ok := init.DependsOn["kafka"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Error("kafka-init: must wait for kafka to be healthy")
	}

	// Redis, durable as dedupe/redisstore/doc.go requires.
	redis := svc("redis")
	rcmd := argv(redis.Command)
	if !strings.HasPrefix(redis.Image, "redis:7") || !strings.Contains(rcmd, "--appendonly yes") || !strings.Contains(rcmd, "--appendfsync always") {
		t.Errorf("redis: image %s command %q, want redis:7 with --appendonly yes --appendfsync always", redis.Image, rcmd)
	}
	if redis.HealthCheck == nil {
		t.Error("redis: no healthcheck")
	}

	// The idemstream replicas: built from deploy/Dockerfile, one config.
	replicas := 0
	for name, s := range p.Services {
		if s.Build == nil || filepath.Base(s.Build.Dockerfile) != "Dockerfile" {
			continue
		}
		if ctx, _ := filepath.Abs(s.Build.Context); ctx != mustAbs(t, root) {
			t.Errorf("%s: build context %s, want the repository root", name, s.Build.Context)
		}
		n := 1
		if s.Deploy != nil && s.Deploy.Replicas != nil {
			n = *s.Deploy.Replicas
		}
		replicas += n
		cmd := argv(s.Command)
		if !strings.HasPrefix(cmd, "run --config ") {
			t.Errorf("%s: command %q, want run --config FILE", name, cmd)
			continue
		}
		target := strings.Fields(cmd)[2]
		if src := bindSource(s, target); src != cfgPath {
			t.Errorf("%s: %s is bound from %q, want %s", name, target, src, cfgPath)
		}
		for dep, cond := range map[string]string{"kafka-init": types.ServiceConditionCompletedSuccessfully, "redis": types.ServiceConditionHealthy} {
			if d, ok := s.DependsOn[dep]; !ok || d.Condition != cond {
				t.Errorf("%s: must depend on %s (%s)", name, dep, cond)
			}
		}
	}
	if replicas != 3 {
		t.Errorf("compose.yaml: %d idemstream replicas, want 3 (one consumer group)", replicas)
	}

	// Prometheus with the rules, Grafana with the provisioning.
	prom := svc("prometheus")
	mustExist("prometheus prometheus.yml", bindSource(prom, "/etc/prometheus/prometheus.yml"))
	mustExist("prometheus rules", bindSource(prom, "/etc/prometheus/rules/idemstream.yaml"))
	if src := bindSource(prom, "/etc/prometheus/rules/idemstream.yaml"); src != filepath.Join(dir, "prometheus", "rules.yaml") {
		t.Errorf("prometheus: rules bound from %s, want deploy/prometheus/rules.yaml", src)
	}
	graf := svc("grafana")
	mustExist("grafana provisioning", bindSource(graf, "/etc/grafana/provisioning"))
	mustExist("grafana dashboard", bindSource(graf, "/var/lib/grafana/dashboards/idemstream/dashboard.json"))
	checkPrometheusConfig(t, p)
}

func mustAbs(t *testing.T, path string) string {
	t.Helper()
	a, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// promConfig is the part of prometheus.yml the stack depends on; unknown
// fields are errors, so a typo does not pass unnoticed.
type promConfig struct {
	Global struct {
		ScrapeInterval     string `json:"scrape_interval"`
		EvaluationInterval string `json:"evaluation_interval"`
	} `json:"global"`
	RuleFiles     []string `json:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `json:"job_name"`
		MetricsPath   string `json:"metrics_path,omitempty"`
		StaticConfigs []struct {
			Targets []string `json:"targets"`
		} `json:"static_configs"`
	} `json:"scrape_configs"`
}

// checkPrometheusConfig: prometheus.yml loads the mounted rules and scrapes
// every idemstream replica of the compose file under job="idemstream".
func checkPrometheusConfig(t *testing.T, p *types.Project) {
	t.Helper()
	var pc promConfig
	if err := yaml.UnmarshalStrict(readFile(t, deployPath("prometheus", "prometheus.yml")), &pc); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	matched := false
	for _, pattern := range pc.RuleFiles {
		if ok, err := filepath.Match(pattern, "/etc/prometheus/rules/idemstream.yaml"); err != nil {
			t.Errorf("prometheus.yml rule_files %q: %v", pattern, err)
		} else if ok {
			matched = true
		}
	}
	if !matched {
		t.Errorf("prometheus.yml: rule_files %v do not load /etc/prometheus/rules/idemstream.yaml", pc.RuleFiles)
	}
	var targets []string
	for _, sc := range pc.ScrapeConfigs {
		if sc.JobName != "idemstream" {
			continue
		}
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("prometheus.yml: metrics_path %s", sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	var want []string
	for name, s := range p.Services {
		if s.Build != nil {
			want = append(want, name+":9464")
		}
	}
	slices.Sort(targets)
	slices.Sort(want)
	if !slices.Equal(targets, want) {
		t.Errorf("prometheus.yml: job idemstream scrapes %v, the compose replicas are %v", targets, want)
	}
}
