package testenv

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// startRedisContainer is StartRedis on the container path: the same
// server, configuration and port, in a container that the handle stops,
// kills, freezes (docker pause) and starts again with the same data.
func startRedisContainer(t testing.TB, cfg RedisConfig) *RedisServer {
	t.Helper()
	s := &RedisServer{t: t, dir: t.TempDir(), port: freePort(t), cfg: cfg}
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	args := []string{
		cfg.serverName(), "--bind", listenAddr(), "--dir", "/data", "--save", "", "--daemonize", "no",
		"--loglevel", "warning", "--protected-mode", "no",
	}
	var files []testcontainers.ContainerFile
	if cfg.TLS {
		ca, cert, key := writeCerts(t, s.dir)
		s.CAFile = ca
		for _, f := range [][2]string{{ca, "/tls/ca.crt"}, {cert, "/tls/server.crt"}, {key, "/tls/server.key"}} {
			files = append(files, testcontainers.ContainerFile{HostFilePath: f[0], ContainerFilePath: f[1], FileMode: 0o644})
		}
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", "/tls/server.crt", "--tls-key-file", "/tls/server.key", "--tls-ca-cert-file", "/tls/ca.crt", "--tls-auth-clients", "no")
	} else {
		args = append(args, "--port", strconv.Itoa(s.port))
	}
	if cfg.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if cfg.Password != "" {
		args = append(args, "--requirepass", cfg.Password)
	}
	args = append(args, cfg.Args...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	image := redisImage()
	if cfg.Valkey {
		image = valkeyImage()
	}
	b, err := startBox(ctx, boxSpec{name: "redis", image: image, cmd: args, ports: []int{s.port}, files: files})
	if err != nil {
		t.Fatalf("start redis: %v", err)
	}
	s.box = b
	t.Cleanup(func() {
		if err := b.terminate(); err != nil {
			t.Errorf("remove redis container: %v", err)
		}
	})
	s.waitBox()
	return s
}

// waitBox waits until the container's server answers PING.
func (s *RedisServer) waitBox() {
	s.t.Helper()
	err := s.box.waitUp(30*time.Second, func() error {
		err := s.ping()
		if err != nil && s.cfg.Password != "" && strings.Contains(err.Error(), "NOAUTH") {
			return nil
		}
		return err
	})
	if err != nil {
		s.t.Fatalf("redis-server on %s: %v", s.Addr, err)
	}
}

func (s *RedisServer) boxCall(what string, f func() error) {
	s.t.Helper()
	if err := f(); err != nil {
		s.t.Fatalf("%s redis container: %v", what, err)
	}
}

// redisClusterContainer runs the three masters of StartRedisCluster in one
// container, so that they reach each other on its loopback whether the
// container has the host's network or mapped ports.
func redisClusterContainer(t testing.TB) []string {
	t.Helper()
	var ports []int
	seen := map[int]bool{}
	for len(ports) < 3 {
		// The cluster bus listens on port+10000: keep both free.
		p := freePort(t)
		if p+10000 > 65535 || seen[p] || !portFree(p+10000) {
			continue
		}
		seen[p] = true
		ports = append(ports, p)
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	var addrs []string
	for _, p := range ports {
		fmt.Fprintf(&script, "mkdir -p /data/%d && redis-server --port %d --bind %s --protected-mode no --dir /data/%d "+
			"--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 --cluster-announce-ip 127.0.0.1 "+
			"--save '' --appendonly no --daemonize yes --logfile /data/%d/redis.log\n", p, p, listenAddr(), p, p)
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	for _, p := range ports {
		fmt.Fprintf(&script, "until redis-cli -p %d ping >/dev/null 2>&1; do sleep 0.05; done\n", p)
	}
	fmt.Fprintf(&script, "redis-cli --cluster create %s --cluster-replicas 0 --cluster-yes\n", strings.Join(addrs, " "))
	script.WriteString("touch /data/created\nexec sleep infinity\n")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var exposed []int
	for _, p := range ports {
		exposed = append(exposed, p, p+10000)
	}
	b, err := startBox(ctx, boxSpec{name: "redis-cluster", image: redisImage(),
		entrypoint: []string{"/bin/sh", "-c", script.String()}, ports: exposed})
	if err != nil {
		t.Fatalf("start redis cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := b.terminate(); err != nil {
			t.Errorf("remove redis cluster container: %v", err)
		}
	})
	err = b.waitUp(60*time.Second, func() error {
		for _, p := range ports {
			code, out, err := b.exec("redis-cli", "-p", strconv.Itoa(p), "cluster", "info")
			if err != nil {
				return err
			}
			if code != 0 || !strings.Contains(out, "cluster_state:ok") {
				return fmt.Errorf("node %d: %s", p, firstLine(out))
			}
		}
		for _, a := range addrs {
			if err := ping(a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redis cluster: %v", err)
	}
	return addrs
}

// redisSentinelContainer runs the master and the Sentinel of
// StartRedisSentinel in one container: the Sentinel names the master as
// 127.0.0.1:PORT, which the host reaches too.
func redisSentinelContainer(t testing.TB) string {
	t.Helper()
	master, sentinel := freePort(t), freePort(t)
	for sentinel == master {
		sentinel = freePort(t)
	}
	script := fmt.Sprintf(`set -e
redis-server --port %[1]d --bind %[3]s --protected-mode no --dir /data --save '' --appendonly no --daemonize yes --logfile /data/master.log
until redis-cli -p %[1]d ping >/dev/null 2>&1; do sleep 0.05; done
printf 'port %[2]d\nbind %[3]s\nprotected-mode no\ndir /data\nsentinel monitor mymaster 127.0.0.1 %[1]d 1\nsentinel down-after-milliseconds mymaster 5000\n' >/data/sentinel.conf
exec redis-server /data/sentinel.conf --sentinel
`, master, sentinel, listenAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := startBox(ctx, boxSpec{name: "redis-sentinel", image: redisImage(),
		entrypoint: []string{"/bin/sh", "-c", script}, ports: []int{master, sentinel}})
	if err != nil {
		t.Fatalf("start redis sentinel: %v", err)
	}
	t.Cleanup(func() {
		if err := b.terminate(); err != nil {
			t.Errorf("remove redis sentinel container: %v", err)
		}
	})
	addr := "127.0.0.1:" + strconv.Itoa(sentinel)
	err = b.waitUp(30*time.Second, func() error {
		if err := ping("127.0.0.1:" + strconv.Itoa(master)); err != nil {
			return err
		}
		return ping(addr)
	})
	if err != nil {
		t.Fatalf("redis sentinel: %v", err)
	}
	return addr
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
