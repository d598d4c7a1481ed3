package testenv

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// ServersEnv names the variable that chooses where the tests' servers come
// from:
//
//	auto        (the default) servers named by IDEMSTREAM_TEST_REDIS,
//	            IDEMSTREAM_TEST_KAFKA, ... first; the rest from containers
//	            when a Docker daemon answers, else from local processes
//	containers  servers the tests start are containers (testcontainers-go)
//	processes   servers the tests start are local processes (redis-server
//	            on PATH; Kafka from scripts/kafka.sh, started by make test)
//	external    only the servers named by the IDEMSTREAM_TEST_* variables;
//	            a test that needs a private server skips
//
// In every mode a server named by its IDEMSTREAM_TEST_* variable is used as
// it is.
const ServersEnv = "IDEMSTREAM_TEST_SERVERS"

// Source says where the servers that the tests start come from.
type Source string

// The sources of servers.
const (
	Containers Source = "containers"
	Processes  Source = "processes"
	External   Source = "external"
)

var (
	sourceOnce sync.Once
	source     Source
	sourceErr  error
)

// ServerSource returns where this test binary's servers come from,
// deciding once (and saying which, in one line on stderr, under auto).
func ServerSource(t testing.TB) Source {
	t.Helper()
	sourceOnce.Do(func() { source, sourceErr = resolveSource() })
	if sourceErr != nil {
		t.Fatalf("%s: %v", ServersEnv, sourceErr)
	}
	return source
}

func resolveSource() (Source, error) {
	want := strings.TrimSpace(os.Getenv(ServersEnv))
	switch want {
	case "", "auto":
		if why, err := dockerAnswers(); err == nil {
			fmt.Fprintf(os.Stderr, "testenv: %s=auto: servers in containers (%s)\n", ServersEnv, why)
			return Containers, nil
		} else {
			fmt.Fprintf(os.Stderr, "testenv: %s=auto: servers as local processes (no Docker daemon: %v)\n", ServersEnv, err)
			return Processes, nil
		}
	case string(Containers):
		if _, err := dockerAnswers(); err != nil {
			return "", fmt.Errorf("containers asked for, but %w", err)
		}
		return Containers, nil
	case string(Processes), string(External):
		return Source(want), nil
	default:
		return "", fmt.Errorf("%q is none of auto, containers, processes, external", want)
	}
}

// startIn returns where a server that a test starts for itself comes
// from. Under external there is none: the test skips, or fails when
// Required.
func startIn(t testing.TB) Source {
	t.Helper()
	src := ServerSource(t)
	if src == External {
		unavailable(t, "%s=external: this test needs a server of its own, and only the IDEMSTREAM_TEST_* servers are used", ServersEnv)
	}
	return src
}

// shared holds the servers that live as long as the test binary (one Kafka
// broker per package), when the package's TestMain runs through Main.
var shared struct {
	sync.Mutex
	main     bool // Main runs the tests: shared servers end with the binary
	cleanups []func()
}

// Main runs a package's tests and then stops the servers they shared, also
// when the binary is interrupted (SIGINT, SIGTERM). Use it as TestMain in
// packages whose tests share a Kafka broker: without it each test that asks
// for a broker gets one of its own (correct, only slower).
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	shared.Lock()
	shared.main = true
	shared.Unlock()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		stopShared()
		fmt.Fprintf(os.Stderr, "testenv: %v: shared servers stopped\n", s)
		os.Exit(1)
	}()
	code := m.Run()
	signal.Stop(sig)
	stopShared()
	os.Exit(code)
}

// onBinaryExit registers f to run when the test binary ends (through Main),
// and reports whether it will; without Main nothing is registered.
func onBinaryExit(f func()) bool {
	shared.Lock()
	defer shared.Unlock()
	if !shared.main {
		return false
	}
	shared.cleanups = append(shared.cleanups, f)
	return true
}

func stopShared() {
	shared.Lock()
	fs := shared.cleanups
	shared.cleanups = nil
	shared.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
