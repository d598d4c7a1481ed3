package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/schemas"
)

// serviceConfig is a one-pipeline configuration on a Redis at addr and a
// Kafka nobody listens on: the settings check needs no broker.
func serviceConfig(t *testing.T, addr string) *schemas.Config {
	t.Helper()
	cfg, err := schemas.Parse([]byte("kafka: {brokers: ['127.0.0.1:1']}\n"+
		"store: {redis: {url: 'redis://"+addr+"/0'}}\n"+
		"pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n"), "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runService runs svc until the test ends.
func runService(t *testing.T, svc *consumer.Service) {
	t.Helper()
	t.Cleanup(func() {
		if err := svc.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	testenv.RunUntilEnd(t, svc.Run)
}

// until polls cond every 20 ms for up to d.
func until(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not %s within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func settingsProblem(svc *consumer.Service) string {
	for _, p := range svc.Ready(context.Background()) {
		if strings.HasPrefix(p, "store settings: ") {
			return p
		}
	}
	return ""
}

// The Redis settings are checked again while the service runs: turned
// unsafe (appendonly off by CONFIG SET), the service reports them on Ready
// and the gauge drops to 0; put back, both recover.
func TestServiceChecksRedisSettingsAgain(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{AppendOnly: true})
	reg := prometheus.NewRegistry()
	logs := &lockedBuffer{}
	svc, err := consumer.NewService(serviceConfig(t, srv.Addr), consumer.ServiceOptions{Registerer: reg, SettingsRecheck: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "idemstream_store_settings_ok" && len(mf.GetMetric()) == 1 {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	if n, _ := testutil.GatherAndCount(reg, "idemstream_store_settings_ok"); n != 1 || gauge() != 0 {
		t.Fatalf("before the first check: %d series at %v, want one at 0", n, gauge())
	}
	runService(t, svc)
	until(t, 20*time.Second, "checked", func() bool { return settingsProblem(svc) == "" && gauge() == 1 })

	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if err := rdb.ConfigSet(context.Background(), "appendonly", "no").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, 20*time.Second, "reported unsafe", func() bool { return settingsProblem(svc) != "" && gauge() == 0 })
	if p := settingsProblem(svc); !strings.Contains(p, "appendonly is no") {
		t.Errorf("Ready does not name the setting: %q", p)
	}
	if err := rdb.ConfigSet(context.Background(), "appendonly", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, 20*time.Second, "reported safe again", func() bool { return settingsProblem(svc) == "" && gauge() == 1 })

	// Redis away: the rechecks get no answer, which says nothing about
	// the settings; Ready names the store itself, the verdict stands.
	srv.Stop()
	storeDown := func() bool {
		for _, p := range svc.Ready(context.Background()) {
			if strings.HasPrefix(p, "store: ") {
				return true
			}
		}
		return false
	}
	until(t, 20*time.Second, "reported the store down", storeDown)
	until(t, 20*time.Second, "past two rechecks without an answer", func() bool {
		return strings.Count(logs.String(), "redis settings could not be checked again") >= 2
	})
	if p := settingsProblem(svc); p != "" || gauge() != 1 {
		t.Errorf("a recheck without an answer changed the verdict: %q, gauge %v", p, gauge())
	}
	srv.Start()
}

// Settings that lose state refuse the start: Run returns the field error
// before any pipeline starts.
func TestServiceRefusesUnsafeRedisSettings(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	svc, err := consumer.NewService(serviceConfig(t, srv.Addr), consumer.ServiceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = svc.Run(ctx)
	var fe *schemas.FieldError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "appendonly is no") {
		t.Fatalf("Run = %v, want a field error naming appendonly", err)
	}
}

// A handler for a pipeline the configuration does not have is a mistake.
func TestServiceRefusesAHandlerForNoPipeline(t *testing.T) {
	cfg := serviceConfig(t, "127.0.0.1:1")
	_, err := consumer.NewService(cfg, consumer.ServiceOptions{Handlers: map[string]consumer.Handler{"q": consumer.HandlerFunc(consumer.Forward)}})
	if err == nil || !strings.Contains(err.Error(), `"q"`) {
		t.Fatalf("NewService = %v, want an error naming pipeline q", err)
	}
}

// lockedBuffer is a log sink the test reads while the service writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A NewService that fails takes its metrics back: the same registry can be
// used again.
func TestFailedNewServiceLeavesTheRegistryAsItWas(t *testing.T) {
	cfg := serviceConfig(t, "127.0.0.1:1")
	reg := prometheus.NewRegistry()
	if _, err := consumer.NewService(cfg, consumer.ServiceOptions{Registerer: reg, SettleWait: time.Hour}); err == nil {
		t.Fatal("NewService accepted a settle wait longer than the lease")
	}
	svc, err := consumer.NewService(cfg, consumer.ServiceOptions{Registerer: reg})
	if err != nil {
		t.Fatalf("NewService on the same registry: %v", err)
	}
	if err := svc.Close(); err != nil {
		t.Fatal(err)
	}
}
