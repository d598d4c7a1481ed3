package testenv

import (
	"bufio"
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

// RedisConfig selects the persistence of a private server.
type RedisConfig struct {
	// AppendOnly with appendfsync always: every acknowledged write survives
	// a restart.
	AppendOnly bool
}

// RedisServer is a private redis-server process that a test can stop,
// restart, freeze and thaw.
type RedisServer struct {
	Addr string
	t    testing.TB
	bin  string
	dir  string
	port int
	cfg  RedisConfig
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis starts a private redis-server on a free loopback port, with
// its files in a temporary directory, and stops it when the test ends.
func StartRedis(t testing.TB, cfg RedisConfig) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found (apt-get install redis-server, or set IDEMSTREAM_TEST_REDIS)")
	}
	s := &RedisServer{t: t, bin: bin, dir: t.TempDir(), port: freePort(t), cfg: cfg}
	s.Addr = "127.0.0.1:" + strconv.Itoa(s.port)
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server (again, after Stop, with the same files and port).
func (s *RedisServer) Start() {
	s.t.Helper()
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
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr); err == nil {
			return
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server exited at start: %s", strings.TrimSpace(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s did not answer PING within 10s", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server with SIGTERM and waits for it. Idempotent.
func (s *RedisServer) Stop() {
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
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Pause freezes the server (SIGSTOP): connections stay open, nothing
// answers.
func (s *RedisServer) Pause() { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume thaws a paused server.
func (s *RedisServer) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
