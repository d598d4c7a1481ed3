package main

import (
	"context"
	"io"
	"net/http"
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

// runInBackground starts run with cfg and its metrics on a free address;
// the returned stop ends it and returns its exit code.
func runInBackground(t *testing.T, cfg string) (addr string, stderr *syncBuffer, stop func() int) {
	t.Helper()
	addr = testenv.FreeAddr(t)
	stderr = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"run", "--config", cfg, "--metrics-addr", addr, "--log-format", "text"}, strings.NewReader(""), io.Discard, stderr, func(string) string { return "" })
	}()
	stopped := false
	stop = func() int {
		if stopped {
			return 0
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(30 * time.Second):
			t.Fatal("run did not stop within 30s")
			return -1
		}
	}
	t.Cleanup(func() { stop() })
	return addr, stderr, stop
}

// readyz polls /readyz until its body satisfies ok, and fails the test
// after deadline.
func readyzUntil(t *testing.T, addr string, deadline time.Duration, stderr *syncBuffer, what string, ok func(status int, body string) bool) string {
	t.Helper()
	end := time.Now().Add(deadline)
	var status int
	var body string
	for {
		status, body = 0, ""
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			status, body = resp.StatusCode, string(b)
		}
		if ok(status, body) {
			return body
		}
		if time.Now().After(end) {
			t.Fatalf("/readyz never %s within %v; last %d %q; stderr:\n%s", what, deadline, status, body, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A Redis that does not answer at start is never a reason to run
// unchecked: run stays not ready and starts no pipeline until the check
// can run, then checks, passes and starts.
func TestRunWaitsUntilRedisCanBeChecked(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true})
	srv.Stop()
	cfg := writeFile(t, t.TempDir(), "c.yaml", "kafka: {brokers: ['127.0.0.1:1']}\n"+
		"store: {redis: {url: 'redis://"+srv.Addr+"/0'}}\n"+
		"pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n")
	addr, stderr, stop := runInBackground(t, cfg)
	readyzUntil(t, addr, 20*time.Second, stderr, "said the settings could not be checked", func(status int, body string) bool {
		return status == http.StatusServiceUnavailable && strings.Contains(body, "store settings: redis settings could not be checked")
	})
	// Tried again after the backoff, and still nothing started: a
	// pipeline would read its topics' metadata from the broker nobody
	// listens on, and say so.
	for deadline := time.Now().Add(20 * time.Second); strings.Count(stderr.String(), "not starting until they are") < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the check was not tried again within 20s:\n%s", stderr.String())
		}
	}
	if out := stderr.String(); strings.Contains(out, "redis settings checked") || strings.Contains(out, "reading topic metadata") {
		t.Fatalf("started while Redis was down:\n%s", out)
	}
	srv.Start()
	readyzUntil(t, addr, 30*time.Second, stderr, "dropped the settings problem", func(_ int, body string) bool {
		return body != "" && !strings.Contains(body, "store settings")
	})
	if !strings.Contains(stderr.String(), "redis settings checked") {
		t.Errorf("no log line says the settings were checked:\n%s", stderr.String())
	}
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "reading topic metadata"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no pipeline started once the check passed:\n%s", stderr.String())
		}
	}
	if code := stop(); code != exitOK {
		t.Errorf("run exited %d, want 0:\n%s", code, stderr.String())
	}
}

// A server that refuses the check itself is no outage: run refuses at
// once, exit 2, instead of waiting for ever. Without a password the server
// answers NOAUTH; with a wrong one WRONGPASS, whose message ends "or user
// is disabled" and must not pass for a server that forbids CONFIG.
func TestRunRefusesWhenRedisRefusesTheLogin(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true, Password: "s3cret"})
	for _, tc := range []struct {
		name, extra, password, want string
	}{
		{"no password", "", "", "NOAUTH"},
		{"wrong password", ", password_env: REDIS_PASSWORD", "wrong", "WRONGPASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeFile(t, t.TempDir(), "c.yaml", "kafka: {brokers: ['127.0.0.1:1']}\n"+
				"store: {redis: {url: 'redis://"+srv.Addr+"/0'"+tc.extra+"}}\n"+
				"pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stderr syncBuffer
			getenv := func(k string) string {
				if k == "REDIS_PASSWORD" {
					return tc.password
				}
				return ""
			}
			code := run(ctx, []string{"run", "--config", cfg, "--metrics-addr", testenv.FreeAddr(t)}, strings.NewReader(""), io.Discard, &stderr, getenv)
			out := stderr.String()
			if code != exitUsage || !strings.Contains(out, "store.redis") || !strings.Contains(out, tc.want) || strings.Contains(out, "redis settings checked") {
				t.Fatalf("run exited %d, want %d naming store.redis and %s; stderr:\n%s", code, exitUsage, tc.want, out)
			}
		})
	}
}
