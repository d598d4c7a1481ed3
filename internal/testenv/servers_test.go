package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestMain(m *testing.M) { Main(m) }

// redisDo sends one command in RESP and returns the first line of the
// answer.
func redisDo(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(line, "$") && !strings.HasPrefix(line, "$-1") {
		line, err = r.ReadString('\n')
	}
	return strings.TrimSpace(line), err
}

// TestRedisHandle drives a private server through every move the tests
// make with it: a write survives a restart with AOF and a SIGKILL, a
// paused server answers nothing and a resumed one answers again.
func TestRedisHandle(t *testing.T) {
	s := StartRedis(t, RedisConfig{AppendOnly: true})
	t.Logf("redis on %s (%s)", s.Addr, ServerSource(t))
	if got, err := redisDo(s.Addr, "SET", "k", "v1"); err != nil || got != "+OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}
	s.Stop()
	if _, err := redisDo(s.Addr, "PING"); err == nil {
		t.Fatal("a stopped server answered PING")
	}
	s.Start()
	if got, err := redisDo(s.Addr, "GET", "k"); err != nil || got != "v1" {
		t.Fatalf("GET after restart: %q, %v; want v1", got, err)
	}
	if got, err := redisDo(s.Addr, "SET", "k", "v2"); err != nil || got != "+OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}
	s.Kill()
	s.Start()
	if got, err := redisDo(s.Addr, "GET", "k"); err != nil || got != "v2" {
		t.Fatalf("GET after SIGKILL (appendfsync always): %q, %v; want v2", got, err)
	}
	s.Pause()
	if got, err := redisDo(s.Addr, "PING"); err == nil {
		t.Fatalf("a paused server answered PING: %q", got)
	}
	s.Resume()
	if got, err := redisDo(s.Addr, "PING"); err != nil || got != "+PONG" {
		t.Fatalf("PING after resume: %q, %v", got, err)
	}
}

func TestRedisPasswordAndTLS(t *testing.T) {
	s := StartRedis(t, RedisConfig{Password: "secret"})
	if got, _ := redisDo(s.Addr, "PING"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Errorf("PING without password: %q, want NOAUTH", got)
	}
	tls := StartRedis(t, RedisConfig{TLS: true})
	if err := tls.ping(); err != nil {
		t.Errorf("TLS handshake with the test CA: %v", err)
	}
}

func TestRedisClusterAndSentinel(t *testing.T) {
	addrs := StartRedisCluster(t)
	if len(addrs) != 3 {
		t.Fatalf("cluster of %d nodes", len(addrs))
	}
	for _, a := range addrs {
		if got, err := redisDo(a, "CLUSTER", "INFO"); err != nil || !strings.HasPrefix(got, "cluster_state:ok") {
			t.Errorf("%s CLUSTER INFO: %q, %v", a, got, err)
		}
	}
	sentinel := StartRedisSentinel(t)
	if got, err := redisDo(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"); err != nil || got != "*2" {
		t.Fatalf("sentinel: %q, %v", got, err)
	}
}

// TestKafkaHandle: a record written before a restart (SIGTERM) and one
// written before a SIGKILL are both read back after the broker comes again,
// on the same address.
func TestKafkaHandle(t *testing.T) {
	k := StartKafka(t)
	topic := UniqueName(t, "handle")
	CreateTopics(t, k.Brokers, 1, topic)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	write := func(v string) {
		t.Helper()
		w := &kafka.Writer{Addr: kafka.TCP(k.Brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: 5 * time.Millisecond}
		defer w.Close()
		if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(v)}); err != nil {
			t.Fatalf("write %s: %v", v, err)
		}
	}
	step := func(name string, f func() error) {
		t.Helper()
		started := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %v", name, time.Since(started).Round(10*time.Millisecond))
	}
	write("before-stop")
	step("stop", k.Stop)
	step("start", k.Start)
	write("before-kill")
	step("kill", k.Kill)
	step("start after kill", k.Start)
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: topic, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	for _, want := range []string{"before-stop", "before-kill"} {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %s: %v", want, err)
		}
		if string(m.Value) != want {
			t.Fatalf("read %q, want %q", m.Value, want)
		}
	}
}
