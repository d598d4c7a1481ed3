package validate

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// manifests are the decoded objects of deploy/kubernetes.
type manifests struct {
	deployment     *appsv1.Deployment
	configMap      *corev1.ConfigMap
	service        *corev1.Service
	namespace      *corev1.Namespace
	pdb            *policyv1.PodDisruptionBudget
	serviceMonitor *monitoringv1.ServiceMonitor
	prometheusRule *monitoringv1.PrometheusRule
	kinds          []string
}

// decodeStrict decodes one object into the API type of its kind; unknown
// or duplicate fields are errors.
func (m *manifests) decodeStrict(where string, doc []byte) error {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	var obj any
	switch meta.APIVersion + " " + meta.Kind {
	case "apps/v1 Deployment":
		m.deployment = &appsv1.Deployment{}
		obj = m.deployment
	case "v1 ConfigMap":
		m.configMap = &corev1.ConfigMap{}
		obj = m.configMap
	case "v1 Service":
		m.service = &corev1.Service{}
		obj = m.service
	case "v1 Namespace":
		m.namespace = &corev1.Namespace{}
		obj = m.namespace
	case "policy/v1 PodDisruptionBudget":
		m.pdb = &policyv1.PodDisruptionBudget{}
		obj = m.pdb
	case "monitoring.coreos.com/v1 ServiceMonitor":
		m.serviceMonitor = &monitoringv1.ServiceMonitor{}
		obj = m.serviceMonitor
	case "monitoring.coreos.com/v1 PrometheusRule":
		m.prometheusRule = &monitoringv1.PrometheusRule{}
		obj = m.prometheusRule
	default:
		return fmt.Errorf("%s: unexpected object %s %s", where, meta.APIVersion, meta.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return fmt.Errorf("%s (%s): %w", where, meta.Kind, err)
	}
	m.kinds = append(m.kinds, meta.Kind)
	return nil
}

// TestKubernetesFiles: every manifest file decodes strictly on its own
// (so `kubectl apply -f` works file by file too).
func TestKubernetesFiles(t *testing.T) {
	files, err := filepath.Glob(deployPath("kubernetes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifests
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		for i, doc := range strings.Split(string(readFile(t, f)), "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			if err := m.decodeStrict(fmt.Sprintf("%s#%d", filepath.Base(f), i), []byte(doc)); err != nil {
				t.Error(err)
			}
		}
	}
	checkManifests(t, &m)
}

// TestKustomization: `kubectl apply -k deploy/kubernetes` builds, lists
// every manifest file, and what it builds passes the same checks.
func TestKustomization(t *testing.T) {
	dir, err := filepath.Abs(deployPath("kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build deploy/kubernetes: %v", err)
	}
	var m manifests
	for _, r := range res.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.decodeStrict("kustomize "+r.CurId().String(), doc); err != nil {
			t.Error(err)
		}
		if r.GetKind() != "Namespace" && r.GetNamespace() != "idemstream" {
			t.Errorf("%s: namespace %q, want idemstream", r.CurId(), r.GetNamespace())
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if n := len(res.Resources()); n != len(files)-1 {
		t.Errorf("kustomization builds %d objects, the directory has %d manifest files: list every file in resources", n, len(files)-1)
	}
	checkManifests(t, &m)
}

func checkManifests(t *testing.T, m *manifests) {
	t.Helper()
	if m.deployment == nil || m.configMap == nil || m.service == nil || m.pdb == nil || m.serviceMonitor == nil || m.prometheusRule == nil {
		t.Fatalf("missing objects; have %v", m.kinds)
	}
	d := m.deployment
	spec := d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("Deployment: replicas %v, want 3 (one consumer group)", d.Spec.Replicas)
	}
	if !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("Deployment: selector %v does not match the pod labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds < 30 {
		t.Errorf("Deployment: terminationGracePeriodSeconds %v: SIGTERM needs time to drain", spec.TerminationGracePeriodSeconds)
	}
	if psc := spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("Deployment: pod securityContext.runAsNonRoot must be true")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("Deployment: %d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]

	// Security.
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Error("container: no securityContext")
	default:
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Error("container: readOnlyRootFilesystem must be true")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("container: allowPrivilegeEscalation must be false")
		}
		if sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Error("container: capabilities must drop ALL and add none")
		}
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("container: no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("container: no %s limit", r)
		}
	}
	// Memory: the request holds the load run's peak RSS (225 MB at most,
	// docs/benchmarks.md) with some headroom; GOMEMLIMIT is about 90% of
	// the limit, so that the runtime collects harder before the kernel
	// kills.
	const peakRSS = 225 << 20
	if req := c.Resources.Requests[corev1.ResourceMemory]; req.Value() < peakRSS*11/10 {
		t.Errorf("container: memory request %s, want at least %d MiB (the measured peak RSS and a tenth more)", req.String(), peakRSS*11/10>>20)
	}
	limit := c.Resources.Limits[corev1.ResourceMemory]
	var memLimit string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			memLimit = e.Value
		}
	}
	if goLimit, err := parseGoMemLimit(memLimit); err != nil {
		t.Errorf("container: GOMEMLIMIT %q: %v", memLimit, err)
	} else if ratio := float64(goLimit) / float64(limit.Value()); ratio < 0.85 || ratio > 0.95 {
		t.Errorf("container: GOMEMLIMIT %s is %.0f%% of the memory limit %s, want about 90%%", memLimit, ratio*100, limit.String())
	}

	// The config file: the args name the mounted ConfigMap key, and it loads.
	if len(c.Args) < 3 || c.Args[0] != "run" || c.Args[1] != "--config" {
		t.Fatalf("container: args %v, want run --config FILE ...", c.Args)
	}
	cfgPath := c.Args[2]
	var mountVolume string
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == filepath.Dir(cfgPath) {
			mountVolume = vm.Name
		}
	}
	var cmName string
	for _, v := range spec.Volumes {
		if v.Name == mountVolume && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	if cmName != m.configMap.Name {
		t.Errorf("container: %s is not mounted from ConfigMap %s (volume %q, ConfigMap %q)", cfgPath, m.configMap.Name, mountVolume, cmName)
	}
	data, ok := m.configMap.Data[filepath.Base(cfgPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", m.configMap.Name, filepath.Base(cfgPath))
	}
	cfg := loadConfig(t, "ConfigMap "+m.configMap.Name, []byte(data))

	// Port, probes and the metrics address of the config agree.
	_, portStr, err := net.SplitHostPort(cfg.Metrics.Addr)
	if err != nil {
		t.Fatalf("config metrics.addr %q: %v", cfg.Metrics.Addr, err)
	}
	port, _ := strconv.Atoi(portStr)
	var metricsPort *corev1.ContainerPort
	for i := range c.Ports {
		if c.Ports[i].Name == "metrics" {
			metricsPort = &c.Ports[i]
		}
	}
	if metricsPort == nil || int(metricsPort.ContainerPort) != port {
		t.Fatalf("container: no port named metrics on %d (metrics.addr %s): %+v", port, cfg.Metrics.Addr, c.Ports)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("container: no HTTP %s probe", name)
		case p.HTTPGet.Path != path:
			t.Errorf("container: %s probe path %s, want %s", name, p.HTTPGet.Path, path)
		case p.HTTPGet.Port != intstr.FromString("metrics") && p.HTTPGet.Port != intstr.FromInt32(int32(port)):
			t.Errorf("container: %s probe port %s, want metrics", name, p.HTTPGet.Port.String())
		}
	}
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("readiness", c.ReadinessProbe, "/readyz")

	// Service.
	s := m.service
	if !selects(s.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("Service: selector %v does not select the pods %v", s.Spec.Selector, d.Spec.Template.Labels)
	}
	var svcPort *corev1.ServicePort
	for i := range s.Spec.Ports {
		if s.Spec.Ports[i].Name == "metrics" {
			svcPort = &s.Spec.Ports[i]
		}
	}
	if svcPort == nil || (svcPort.TargetPort != intstr.FromString("metrics") && svcPort.TargetPort.IntValue() != port) {
		t.Errorf("Service: no port named metrics that targets the container's metrics port: %+v", s.Spec.Ports)
	}

	// PodDisruptionBudget.
	p := m.pdb
	if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget: maxUnavailable %v, want 1", p.Spec.MaxUnavailable)
	}
	if p.Spec.Selector == nil || !selects(p.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Error("PodDisruptionBudget: selector does not select the pods")
	}
	// A Redis outage makes every pod unready at once: the default policy
	// (IfHealthyBudget) would then block every node drain until it ends.
	if pol := p.Spec.UnhealthyPodEvictionPolicy; pol == nil || *pol != policyv1.AlwaysAllow {
		t.Errorf("PodDisruptionBudget: unhealthyPodEvictionPolicy %v, want AlwaysAllow", pol)
	}

	// ServiceMonitor.
	sm := m.serviceMonitor
	if !selects(sm.Spec.Selector.MatchLabels, s.Labels) {
		t.Errorf("ServiceMonitor: selector %v does not select the Service's labels %v", sm.Spec.Selector.MatchLabels, s.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor: endpoints %+v, want port metrics, path /metrics", sm.Spec.Endpoints)
	}
	// The rules select job="idemstream": the operator names the job after the Service.
	if s.Name != "idemstream" || sm.Spec.JobLabel != "" {
		t.Errorf("Service %q / jobLabel %q: the job label would not be \"idemstream\" as rules.yaml expects", s.Name, sm.Spec.JobLabel)
	}
}

// selects reports whether every label of sel is in labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestKustomizationListsEveryFile: a manifest added to deploy/kubernetes
// but not to kustomization.yaml is an error.
func TestKustomizationListsEveryFile(t *testing.T) {
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(readFile(t, deployPath("kubernetes", "kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(deployPath("kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") && e.Name() != "kustomization.yaml" {
			files = append(files, e.Name())
		}
	}
	sort.Strings(files)
	sort.Strings(k.Resources)
	if !reflect.DeepEqual(files, k.Resources) {
		t.Errorf("kustomization.yaml resources %v, files %v", k.Resources, files)
	}
}

// parseGoMemLimit reads a GOMEMLIMIT value as the Go runtime does: a number
// of bytes with an optional B, KiB, MiB, GiB or TiB suffix.
func parseGoMemLimit(v string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}
	shift := uint(0)
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			v, shift = n, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("want a positive number of bytes with B, KiB, MiB, GiB or TiB")
	}
	return n << shift, nil
}
