package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// The images of the container path. On a machine that reaches a registry
// the official images are pulled when missing; where none is reachable,
// scripts/images.sh builds local ones and names them in these variables.
const (
	RedisImageEnv  = "IDEMSTREAM_REDIS_IMAGE"
	ValkeyImageEnv = "IDEMSTREAM_VALKEY_IMAGE"
	KafkaImageEnv  = "IDEMSTREAM_KAFKA_IMAGE"
	// NetworkEnv picks how containers are reached: "bridge" (the usual
	// mapped ports, 127.0.0.1:P on the host to P in the container) or
	// "host" (the host's network, servers listening on 127.0.0.1). By
	// default: bridge when the daemon has a bridge network, else host.
	NetworkEnv = "IDEMSTREAM_TEST_NETWORK"

	defaultRedisImage  = "redis:7"
	defaultValkeyImage = "valkey/valkey:8.1"
	defaultKafkaImage  = "apache/kafka:4.4.0"
)

// Labels on every container testenv starts: they let a later run (or
// scripts) find what an interrupted run left behind.
const (
	labelOwner = "org.idemstream.testenv"
	labelPID   = "org.idemstream.testenv.pid"
	labelHost  = "org.idemstream.testenv.host"
)

func redisImage() string  { return envOr(RedisImageEnv, defaultRedisImage) }
func kafkaImage() string  { return envOr(KafkaImageEnv, defaultKafkaImage) }
func valkeyImage() string { return envOr(ValkeyImageEnv, defaultValkeyImage) }

func envOr(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

// daemon is the Docker daemon of this test binary, found once.
var daemon struct {
	once     sync.Once
	provider *testcontainers.DockerProvider
	cli      client.APIClient
	host     bool // containers on the host's network
	desc     string
	err      error
}

// dockerAnswers reports whether a Docker daemon answers, and says which.
func dockerAnswers() (string, error) {
	daemon.once.Do(connectDocker)
	return daemon.desc, daemon.err
}

func connectDocker() {
	// No reaper container: testenv removes its containers itself, in the
	// tests' cleanup, and sweeps what a killed run left (sweepLeftovers).
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		_ = os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	tclog.SetDefault(tclog.NewNoopLogger())
	probe, err := newProvider()
	if err != nil {
		daemon.err = err
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := probe.Client()
	ver, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		daemon.err = fmt.Errorf("docker daemon does not answer: %w", err)
		return
	}
	nets, err := cli.NetworkList(ctx, client.NetworkListOptions{})
	if err != nil {
		daemon.err = fmt.Errorf("docker network list: %w", err)
		return
	}
	bridge := false
	for _, n := range nets.Items {
		bridge = bridge || n.Name == "bridge"
	}
	switch mode := os.Getenv(NetworkEnv); mode {
	case "host":
		daemon.host = true
	case "bridge":
		if !bridge {
			daemon.err = fmt.Errorf("%s=bridge, but the daemon has no bridge network", NetworkEnv)
			return
		}
	case "":
		daemon.host = !bridge
	default:
		daemon.err = fmt.Errorf("%s=%q is neither host nor bridge", NetworkEnv, mode)
		return
	}
	provider := probe
	if daemon.host {
		// Without a bridge network testcontainers would create one of its
		// own (reaper_default, in a private address range): name the host
		// network as the default instead, so that none is ever created.
		if provider, err = newProvider(testcontainers.DefaultNetwork("host")); err != nil {
			daemon.err = err
			return
		}
		defer probe.Close()
	}
	daemon.provider, daemon.cli = provider, provider.Client()
	reach := "mapped ports on 127.0.0.1"
	if daemon.host {
		reach = "host network"
	}
	daemon.desc = fmt.Sprintf("Docker %s at %s, %s, images %s and %s", ver.Version, cli.DaemonHost(), reach, redisImage(), kafkaImage())
	sweepLeftovers(ctx)
	// No idle connection to the daemon outlives a call: packages that
	// check for leaked goroutines at the end (goleak) see none.
	_ = daemon.cli.Close()
}

// newProvider makes a provider, turning the panics of a machine without
// any Docker configuration into an error.
func newProvider(opts ...testcontainers.DockerProviderOption) (p *testcontainers.DockerProvider, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("no docker host: %v", r)
		}
	}()
	p, err = testcontainers.NewDockerProvider(opts...)
	if err != nil {
		return nil, fmt.Errorf("no docker host: %w", err)
	}
	return p, nil
}

// sweepLeftovers removes the containers of earlier test binaries on this
// machine whose process is gone (killed by a timeout or a signal before its
// cleanup ran).
func sweepLeftovers(ctx context.Context) {
	host, _ := os.Hostname()
	res, err := daemon.cli.ContainerList(ctx, client.ContainerListOptions{
		All: true, Filters: make(client.Filters).Add("label", labelOwner),
	})
	if err != nil {
		return
	}
	for _, c := range res.Items {
		pid, err := strconv.Atoi(c.Labels[labelPID])
		if err != nil || c.Labels[labelHost] != host || processAlive(pid) {
			continue
		}
		_, _ = daemon.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	}
}

// portFree reports whether nothing listens on 127.0.0.1:port now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// boxSpec describes one container: the servers in it listen on ports,
// which are the same numbers on the host (host network, or mapped).
type boxSpec struct {
	name       string // for messages
	image      string
	entrypoint []string
	cmd        []string
	ports      []int
	files      []testcontainers.ContainerFile
}

// box is one running (or stopped) container.
type box struct {
	name string
	c    testcontainers.Container
	id   string
}

// listenAddr is the address servers in a container bind: loopback on the
// host's network, every interface of the container behind mapped ports
// (which are bound to the host's loopback only).
func listenAddr() string {
	if daemon.host {
		return "127.0.0.1"
	}
	return "0.0.0.0"
}

func startBox(ctx context.Context, spec boxSpec) (*box, error) {
	host, _ := os.Hostname()
	req := testcontainers.ContainerRequest{
		Image:      spec.image,
		Entrypoint: spec.entrypoint,
		Cmd:        spec.cmd,
		Files:      spec.files,
		Labels:     map[string]string{labelOwner: "1", labelPID: strconv.Itoa(os.Getpid()), labelHost: host},
	}
	for _, p := range spec.ports {
		req.ExposedPorts = append(req.ExposedPorts, strconv.Itoa(p)+"/tcp")
	}
	req.HostConfigModifier = func(hc *container.HostConfig) {
		if daemon.host {
			hc.NetworkMode = "host"
			return
		}
		hc.PortBindings = network.PortMap{}
		for _, p := range spec.ports {
			hc.PortBindings[network.MustParsePort(strconv.Itoa(p)+"/tcp")] = []network.PortBinding{
				{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(p)},
			}
		}
	}
	c, err := daemon.provider.RunContainer(ctx, req)
	if err != nil {
		if c != nil {
			_ = c.Terminate(context.Background())
		}
		hint := ""
		if strings.Contains(err.Error(), "pull") || strings.Contains(err.Error(), "No such image") {
			hint = " (no registry here? build local images with internal/testenv/scripts/images.sh and set " + RedisImageEnv + " and " + KafkaImageEnv + ")"
		}
		return nil, fmt.Errorf("%s container from %s: %w%s", spec.name, spec.image, err, hint)
	}
	return &box{name: spec.name, c: c, id: c.GetContainerID()}, nil
}

func (b *box) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

// stop stops the container (SIGTERM, SIGKILL after grace).
func (b *box) stop(grace time.Duration) error {
	ctx, cancel := b.ctx()
	defer cancel()
	return b.c.Stop(ctx, &grace)
}

// kill sends SIGKILL and waits until the container has stopped.
func (b *box) kill() error {
	ctx, cancel := b.ctx()
	defer cancel()
	if _, err := daemon.cli.ContainerKill(ctx, b.id, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		return fmt.Errorf("kill %s container: %w", b.name, err)
	}
	for {
		st, err := b.c.State(ctx)
		if err != nil {
			return fmt.Errorf("%s container state: %w", b.name, err)
		}
		if !st.Running {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s container still running after SIGKILL", b.name)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (b *box) start() error {
	ctx, cancel := b.ctx()
	defer cancel()
	return b.c.Start(ctx)
}

func (b *box) pause() error {
	ctx, cancel := b.ctx()
	defer cancel()
	_, err := daemon.cli.ContainerPause(ctx, b.id, client.ContainerPauseOptions{})
	return err
}

func (b *box) unpause() error {
	ctx, cancel := b.ctx()
	defer cancel()
	_, err := daemon.cli.ContainerUnpause(ctx, b.id, client.ContainerUnpauseOptions{})
	return err
}

// running reports whether the container runs, and its exit code if not.
func (b *box) running() (bool, int) {
	ctx, cancel := b.ctx()
	defer cancel()
	st, err := b.c.State(ctx)
	if err != nil {
		return false, -1
	}
	return st.Running, st.ExitCode
}

// exec runs cmd in the container and returns its exit code and output.
func (b *box) exec(cmd ...string) (int, string, error) {
	ctx, cancel := b.ctx()
	defer cancel()
	code, r, err := b.c.Exec(ctx, cmd, tcexec.Multiplexed())
	if err != nil {
		return code, "", err
	}
	out, _ := io.ReadAll(r)
	return code, string(out), nil
}

// logs returns the last lines of the container's output.
func (b *box) logs(n int) string {
	ctx, cancel := b.ctx()
	defer cancel()
	r, err := b.c.Logs(ctx)
	if err != nil {
		return "(no logs: " + err.Error() + ")"
	}
	defer r.Close()
	out, _ := io.ReadAll(r)
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// terminate removes the container and its volumes, whatever its state.
func (b *box) terminate() error {
	ctx, cancel := b.ctx()
	defer cancel()
	// A paused container cannot be stopped.
	_, _ = daemon.cli.ContainerUnpause(ctx, b.id, client.ContainerUnpauseOptions{})
	grace := 5 * time.Second
	err := b.c.Terminate(ctx, testcontainers.StopTimeout(grace))
	_ = daemon.cli.Close() // idle connections, as in connectDocker
	return err
}

// waitUp polls ready until it succeeds, the container exits, or timeout.
func (b *box) waitUp(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if up, code := b.running(); !up {
			return fmt.Errorf("%s container exited (code %d) while starting; its output:\n%s", b.name, code, b.logs(40))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s container not ready within %v: %w; its output:\n%s", b.name, timeout, err, b.logs(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
