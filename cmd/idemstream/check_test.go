package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemstream/idemstream/internal/testenv"
)

// run refuses to start on Redis settings that lose state silently: exit 2,
// one line that names the setting and the fix, before any consumer joins.
func TestRunRefusesRedisSettingsThatLoseState(t *testing.T) {
	cases := []struct {
		name  string
		cfg   testenv.RedisConfig
		extra string
		want  []string
	}{
		{"eviction", testenv.RedisConfig{AppendOnly: true, Args: []string{"--maxmemory-policy", "volatile-lru"}}, "",
			[]string{"config: store.redis: ", "maxmemory-policy is volatile-lru", "set maxmemory-policy noeviction", "store.redis.check_server: false starts anyway"}},
		{"no persistence", testenv.RedisConfig{}, "",
			[]string{"config: store.redis: ", "appendonly is no", "set appendonly yes with appendfsync always, or store.redis.min_replicas >= 1"}},
		{"too few replicas", testenv.RedisConfig{AppendOnly: true}, ", min_replicas: 1",
			[]string{"config: store.redis.min_replicas: ", "0 replicas connected, but store.redis.min_replicas is 1", "connect replicas or lower store.redis.min_replicas"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartRedis(t, tc.cfg)
			cfg := writeFile(t, t.TempDir(), "c.yaml", "kafka: {brokers: ['127.0.0.1:1']}\n"+
				"store: {redis: {url: 'redis://"+srv.Addr+"/0'"+tc.extra+"}}\n"+
				"pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stderr syncBuffer
			code := run(ctx, []string{"run", "--config", cfg, "--metrics-addr", testenv.FreeAddr(t)}, strings.NewReader(""), io.Discard, &stderr, func(string) string { return "" })
			if code != exitUsage {
				t.Fatalf("run exited %d, want %d; stderr:\n%s", code, exitUsage, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// check_server: false starts on the same server; the refusal is a choice.
func TestRunCheckServerOff(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	cfg := writeFile(t, t.TempDir(), "c.yaml", "kafka: {brokers: ['127.0.0.1:1']}\n"+
		"store: {redis: {url: 'redis://"+srv.Addr+"/0', check_server: false}}\n"+
		"pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var stderr syncBuffer
	code := run(ctx, []string{"run", "--config", cfg, "--metrics-addr", testenv.FreeAddr(t), "--log-format", "text"}, strings.NewReader(""), io.Discard, &stderr, func(string) string { return "" })
	if code == exitUsage || strings.Contains(stderr.String(), "appendonly") {
		t.Errorf("check_server: false still checked: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "starting") {
		t.Errorf("run did not start:\n%s", stderr.String())
	}
}

// A server that refuses CONFIG (managed services rename or forbid it) is a
// warning naming what could not be verified, and run starts.
func TestRunWarnsWhenRedisRefusesConfig(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{Args: []string{"--rename-command", "CONFIG", ""}})
	cfg := writeFile(t, t.TempDir(), "c.yaml", "kafka: {brokers: ['127.0.0.1:1']}\n"+
		"store: {redis: {url: 'redis://"+srv.Addr+"/0'}}\n"+
		"pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var stderr syncBuffer
	code := run(ctx, []string{"run", "--config", cfg, "--metrics-addr", testenv.FreeAddr(t), "--log-format", "text"}, strings.NewReader(""), io.Discard, &stderr, func(string) string { return "" })
	if code == exitUsage {
		t.Fatalf("run refused a server whose settings it could not read:\n%s", stderr.String())
	}
	for _, w := range []string{"level=WARN", "CONFIG GET refused", "could not verify maxmemory-policy (must be noeviction) nor persistence", "starting"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr does not say %q:\n%s", w, stderr.String())
		}
	}
}
