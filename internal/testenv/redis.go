package testenv

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Required reports whether missing servers must fail the tests.
func Required() bool { return os.Getenv("IDEMSTREAM_REQUIRE_SERVERS") == "1" }

// unavailable skips or fails, as Required says.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// RedisAddr returns the address of a Redis server for tests that only
// read and write keys: IDEMSTREAM_TEST_REDIS when set, else a private
// server started for the test.
func RedisAddr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("IDEMSTREAM_TEST_REDIS"); addr != "" {
		return addr
	}
	return StartRedis(t, RedisConfig{}).Addr
}

// ValkeyAddr returns the address of a Valkey 8.1 (or later) server, the
// one with SET … IFEQ: IDEMSTREAM_TEST_VALKEY when set, else a private
// server started for the test (valkey-server on PATH, or a container).
func ValkeyAddr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("IDEMSTREAM_TEST_VALKEY"); addr != "" {
		return addr
	}
	return StartRedis(t, RedisConfig{Valkey: true}).Addr
}

// RedisConfig selects the server and the persistence of a private server.
type RedisConfig struct {
	// Valkey runs valkey-server instead of redis-server.
	Valkey bool
	// AppendOnly with appendfsync always: every acknowledged write survives
	// a restart.
	AppendOnly bool
	// Password, when set, is required of clients (requirepass).
	Password string
	// TLS serves TLS only, with a certificate for 127.0.0.1 signed by a
	// throwaway CA (RedisServer.CAFile).
	TLS bool
	// Args are passed to redis-server as they are.
	Args []string
}

// RedisServer is a private redis-server process that a test can stop,
// restart, freeze and thaw.
type RedisServer struct {
	Addr string
	// CAFile is the CA to trust for a TLS server.
	CAFile string
	t      testing.TB
	bin    string
	dir    string
	port   int
	cfg    RedisConfig
	cmd    *exec.Cmd
	done   chan struct{}
	box    *box // the container, on the container path
	// started is set once the server ran: from then on it keeps its port.
	started bool
}

// StartRedis starts a private redis-server on a free loopback port, with
// its files in a temporary directory, and stops it when the test ends.
func StartRedis(t testing.TB, cfg RedisConfig) *RedisServer {
	t.Helper()
	if startIn(t) == Containers {
		return startRedisContainer(t, cfg)
	}
	bin, err := exec.LookPath(cfg.serverName())
	if err != nil {
		if cfg.Valkey {
			unavailable(t, "valkey-server not found (internal/testenv/scripts/servers.sh starts one, or set IDEMSTREAM_TEST_VALKEY)")
		}
		unavailable(t, "redis-server not found (apt-get install redis-server, or set IDEMSTREAM_TEST_REDIS)")
	}
	s := &RedisServer{t: t, bin: bin, dir: t.TempDir(), port: freePort(t), cfg: cfg}
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	if cfg.TLS {
		ca, cert, key := writeCerts(t, s.dir)
		s.CAFile = ca
		s.cfg.Args = append(s.cfg.Args, "--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no")
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

func (c RedisConfig) serverName() string {
	if c.Valkey {
		return "valkey-server"
	}
	return "redis-server"
}

// Start starts the server (again, after Stop, with the same files and port).
func (s *RedisServer) Start() {
	s.t.Helper()
	if s.box != nil {
		s.boxCall("start", s.box.start)
		s.waitBox()
		return
	}
	for attempt := 0; ; attempt++ {
		err := s.startProcess()
		if err == nil {
			s.started = true
			return
		}
		// A port found free was taken by another process before the
		// server bound it (packages run side by side): a server that
		// never ran yet takes another.
		if s.started || attempt == 4 || !strings.Contains(err.Error(), "Address already in use") {
			s.t.Fatalf("%v", err)
		}
		s.port = freePort(s.t)
		s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	}
}

// startProcess runs redis-server once and waits for it to answer.
func (s *RedisServer) startProcess() error {
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}
	if s.cfg.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if s.cfg.Password != "" {
		args = append(args, "--requirepass", s.cfg.Password)
	}
	args = append(args, s.cfg.Args...)
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.SysProcAttr = ChildProcAttr()
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := s.ping(); err == nil || (s.cfg.Password != "" && strings.Contains(err.Error(), "NOAUTH")) {
			return nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			_ = os.Remove(filepath.Join(s.dir, "redis.log"))
			s.cmd = nil
			return fmt.Errorf("redis-server exited at start: %s", strings.TrimSpace(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer PING within 10s", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server with SIGTERM and waits for it. Idempotent.
func (s *RedisServer) Stop() {
	if s.box != nil {
		s.boxCall("stop", func() error { return s.box.stop(10 * time.Second) })
		return
	}
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// Kill stops the server with SIGKILL: no shutdown save, no goodbye.
func (s *RedisServer) Kill() {
	if s.box != nil {
		s.boxCall("kill", s.box.kill)
		return
	}
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open, nothing
// answers.
func (s *RedisServer) Pause() {
	if s.box != nil {
		s.boxCall("pause", s.box.pause)
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGSTOP)
}

// Resume thaws a paused server.
func (s *RedisServer) Resume() {
	if s.box != nil {
		s.boxCall("unpause", s.box.unpause)
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
}

// FreeAddr returns a loopback address with a port nobody listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(freePort(t))
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *RedisServer) ping() error {
	if !s.cfg.TLS {
		return ping(s.Addr)
	}
	pem, err := os.ReadFile(s.CAFile)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	d := &net.Dialer{Timeout: 200 * time.Millisecond}
	c, err := tls.DialWithDialer(d, "tcp", s.Addr, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	if err != nil {
		return err
	}
	c.Close()
	return nil
}

// ping speaks just enough RESP to know the server is up, so that this
// package needs no client library.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// StartRedisCluster starts a Redis Cluster of three masters on loopback
// (no replicas), waits until every node reports cluster_state:ok, and
// stops it when the test ends. It returns the nodes' addresses.
func StartRedisCluster(t testing.TB) []string {
	t.Helper()
	if startIn(t) == Containers {
		return redisClusterContainer(t)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		unavailable(t, "redis-cli not found (apt-get install redis-tools)")
	}
	var addrs []string
	for range 3 {
		s := StartRedis(t, RedisConfig{Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"}})
		addrs = append(addrs, s.Addr)
	}
	create := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...)
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range addrs {
		for {
			host, port, _ := strings.Cut(a, ":")
			out, err := exec.Command(cli, "-h", host, "-p", port, "cluster", "info").Output()
			if err == nil && strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redis cluster node %s not ok within 30s: %s", a, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return addrs
}

// StartRedisSentinel starts a master and one Sentinel that monitors it as
// "mymaster", and stops both when the test ends. It returns the Sentinel's
// address: clients find the master through it.
func StartRedisSentinel(t testing.TB) (sentinel string) {
	t.Helper()
	if startIn(t) == Containers {
		return redisSentinelContainer(t)
	}
	master := StartRedis(t, RedisConfig{})
	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\nsentinel down-after-milliseconds mymaster 5000\n",
		port, dir, master.port)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return startSentinel(t, master.bin, conf, dir, port)
}

// startSentinel runs `redis-server CONF --sentinel` until the test ends and
// returns its address once it answers.
func startSentinel(t testing.TB, bin, conf, dir string, port int) string {
	t.Helper()
	cmd := exec.Command(bin, conf, "--sentinel", "--logfile", filepath.Join(dir, "sentinel.log"))
	cmd.SysProcAttr = ChildProcAttr()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis sentinel: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	sentinelDirs.Store(addr, dir)
	deadline := time.Now().Add(10 * time.Second)
	for ping(addr) != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("redis sentinel on %s did not answer within 10s: %s", addr, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr
}
