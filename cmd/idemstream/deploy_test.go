package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemstream/idemstream/consumer"
)

// The Kubernetes grace period after SIGTERM covers what run takes to stop
// with the flags the Deployment passes: every pipeline's stop
// (consumer.StopTimeout of the drain timeout), then the metrics server's
// shutdown, with a margin of at least 5 s but not so much that a hung pod
// holds its partitions for minutes.
func TestGracePeriodCoversTheShutdown(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					Grace      int `yaml:"terminationGracePeriodSeconds"`
					Containers []struct {
						Args []string `yaml:"args"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("deployment.yaml: %d containers, want 1", len(pod.Containers))
	}
	drain := consumer.DefaultDrainTimeout
	args := pod.Containers[0].Args
	for i, a := range args {
		if a == "--drain-timeout" && i+1 < len(args) {
			if drain, err = time.ParseDuration(args[i+1]); err != nil {
				t.Fatalf("deployment.yaml: --drain-timeout %q: %v", args[i+1], err)
			}
		}
	}
	need := consumer.StopTimeout(drain) + httpShutdownTimeout
	grace := time.Duration(pod.Grace) * time.Second
	if grace < need+5*time.Second || grace > need+30*time.Second {
		t.Errorf("deployment.yaml: terminationGracePeriodSeconds %d; run stops within %v (drain %v): want %v to %v",
			pod.Grace, need, drain, need+5*time.Second, need+30*time.Second)
	}
}
