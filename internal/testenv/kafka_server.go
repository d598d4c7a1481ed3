package testenv

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
)

// The broker configuration that scripts/kafka.sh uses, so that a broker in
// a container has the same listeners, users and settings as a process.
//
//go:embed kafka/server.properties kafka/log4j2.properties
var kafkaFiles embed.FS

// KafkaServer is a real Kafka broker (KRaft, broker and controller in one
// node) that a test can stop, kill and start again with the same data and
// ports, wherever it runs: a container or a local process.
type KafkaServer struct {
	// Brokers is the PLAINTEXT listener.
	Brokers []string
	// SASLBrokers is the SASL_PLAINTEXT listener (PLAIN, SCRAM-SHA-256,
	// SCRAM-SHA-512 for KafkaSASLUser).
	SASLBrokers []string
	// TLSBrokers is the TLS listener, with a certificate for 127.0.0.1
	// signed by the CA in CAFile.
	TLSBrokers []string
	CAFile     string

	box    *box   // on the container path
	script string // kafka.sh, on the process path
	dir    string // its IDEMSTREAM_TESTENV_DIR
}

// StartKafka starts a private broker for the test, and removes it when the
// test ends. Tests that only produce and consume share one broker through
// KafkaBrokers; a broker of its own is for tests that stop or kill it.
func StartKafka(t testing.TB) *KafkaServer {
	t.Helper()
	var k *KafkaServer
	var err error
	switch startIn(t) {
	case Containers:
		k, err = startKafkaContainer(t, t.TempDir())
	default:
		k, err = startKafkaProcess(t)
	}
	if k != nil {
		t.Cleanup(func() {
			if err := k.remove(); err != nil {
				t.Errorf("remove kafka broker: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatalf("start kafka: %v", err)
	}
	return k
}

// Stop stops the broker with SIGTERM (controlled shutdown) and waits.
func (k *KafkaServer) Stop() error {
	if k.box != nil {
		return k.box.stop(30 * time.Second)
	}
	_, err := k.run(60*time.Second, "stop")
	return err
}

// Kill stops the broker with SIGKILL: no controlled shutdown.
func (k *KafkaServer) Kill() error {
	if k.box != nil {
		return k.box.kill()
	}
	_, err := k.run(30*time.Second, "kill")
	return err
}

// Start starts a stopped or killed broker again, with the same data and
// ports, and waits until it serves clients, and every partition it had
// has a leader that answers: a restarted broker answers Metadata before
// it leads its partitions again, and a produce in between fails with
// "topic partition has no leader".
func (k *KafkaServer) Start() error {
	if k.box != nil {
		if err := k.box.start(); err != nil {
			return err
		}
		if err := k.box.waitUp(120*time.Second, k.ready); err != nil {
			return err
		}
	} else if _, err := k.run(150*time.Second, "start"); err != nil {
		return err
	}
	return k.waitLeaders(60 * time.Second)
}

// waitLeaders polls until every partition of every topic on the broker
// has a leader that answers ListOffsets (topicsReady).
func (k *KafkaServer) waitLeaders(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Timeout: 5 * time.Second}
	for {
		err := k.leadersReady(ctx, client)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("partitions without a serving leader %v after the restart: %w", timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (k *KafkaServer) leadersReady(ctx context.Context, client *kafka.Client) error {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return err
	}
	// topicsReady checks topics of one partition count at a time.
	byCount := map[int][]string{}
	for _, topic := range md.Topics {
		byCount[len(topic.Partitions)] = append(byCount[len(topic.Partitions)], topic.Name)
	}
	for n, names := range byCount {
		if err := topicsReady(ctx, client, n, names); err != nil {
			return err
		}
	}
	return nil
}

func (k *KafkaServer) remove() error {
	if k.box != nil {
		return k.box.terminate()
	}
	_, err := k.run(60*time.Second, "stop")
	return err
}

func (k *KafkaServer) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{k.script}, args...)...)
	cmd.Env = append(os.Environ(), "IDEMSTREAM_TESTENV_DIR="+k.dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kafka.sh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// ready: the broker answers Metadata and has a group coordinator (the
// first one creates __consumer_offsets; waiting here spares the first
// consumer group a retry).
func (k *KafkaServer) ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Timeout: 2 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
	if err != nil {
		return err
	}
	if len(md.Brokers) == 0 {
		return errors.New("no broker registered yet")
	}
	fc, err := client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: "idemstream-testenv-probe", KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err != nil {
		return err
	}
	return fc.Error
}

// repoDir is the root of the source tree (the tests run from it).
func repoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// startKafkaProcess is kafka.sh up in a private state directory, with the
// jars of the shared one (fetched through Maven once).
func startKafkaProcess(t testing.TB) (*KafkaServer, error) {
	t.Helper()
	root := repoDir()
	script := filepath.Join(root, "internal", "testenv", "scripts", "kafka.sh")
	shared := os.Getenv("IDEMSTREAM_TESTENV_DIR")
	if shared == "" {
		shared = filepath.Join(root, ".testenv")
	}
	fetch := &KafkaServer{script: script, dir: shared}
	if _, err := fetch.run(20*time.Minute, "fetch"); err != nil {
		unavailable(t, "no Kafka jars for a private broker: %v", err)
	}
	libs, err := filepath.Abs(filepath.Join(shared, "kafka-libs"))
	if err != nil {
		return nil, err
	}
	k := &KafkaServer{script: script, dir: t.TempDir()}
	if err := os.Symlink(libs, filepath.Join(k.dir, "kafka-libs")); err != nil {
		return nil, err
	}
	addr, err := k.run(150*time.Second, "up")
	if err != nil {
		return k, err
	}
	k.Brokers = []string{lastLine(addr)}
	for _, l := range []struct {
		file string
		to   *[]string
	}{{"sasl_addr", &k.SASLBrokers}, {"tls_addr", &k.TLSBrokers}} {
		b, err := os.ReadFile(filepath.Join(k.dir, "kafka", l.file))
		if err != nil {
			return k, err
		}
		*l.to = []string{strings.TrimSpace(string(b))}
	}
	k.CAFile = filepath.Join(k.dir, "kafka", "tls", "ca.crt")
	return k, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// startKafkaContainer starts a broker from the Kafka image: Kafka's jars
// in /opt/kafka/libs and java on PATH, as in the official apache/kafka
// image and in the one scripts/images.sh builds. Its certificates go to
// dir, which must outlive the broker.
func startKafkaContainer(t testing.TB, dir string) (*KafkaServer, error) {
	t.Helper()
	ports := map[int]bool{}
	next := func() int {
		for {
			p := freePort(t)
			if !ports[p] {
				ports[p] = true
				return p
			}
		}
	}
	bport, cport, sport, tport := next(), next(), next(), next()
	props, err := kafkaFiles.ReadFile("kafka/server.properties")
	if err != nil {
		return nil, err
	}
	logCfg, err := kafkaFiles.ReadFile("kafka/log4j2.properties")
	if err != nil {
		return nil, err
	}
	text := strings.NewReplacer(
		"@BROKER_PORT@", strconv.Itoa(bport), "@CONTROLLER_PORT@", strconv.Itoa(cport),
		"@SASL_PORT@", strconv.Itoa(sport), "@SSL_PORT@", strconv.Itoa(tport),
		"@TLS_DIR@", "/tmp/idemstream", "@DATA_DIR@", "/tmp/kafka-data",
	).Replace(string(props))
	if !daemon.host {
		// Behind mapped ports the broker listens on the container's
		// interfaces and still advertises the host's loopback.
		var lines []string
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "listeners=") {
				line = strings.ReplaceAll(line, "//127.0.0.1:", "//0.0.0.0:")
			}
			lines = append(lines, line)
		}
		text = strings.Join(lines, "\n")
	}
	ca, cert, key := writeCerts(t, dir)
	var pem []byte
	for _, f := range []string{key, cert, ca} {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		pem = append(pem, b...)
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	clusterID := base64.RawURLEncoding.EncodeToString(id)
	if strings.HasPrefix(clusterID, "-") {
		clusterID = "A" + clusterID[1:]
	}
	scram := fmt.Sprintf("[name=%s,password=%s]", KafkaSASLUser, KafkaSASLPassword)
	script := fmt.Sprintf(`set -e
cd /tmp
opts="-Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true -Dlog4j2.configurationFile=/tmp/idemstream/log4j2.properties"
if [ ! -f /tmp/kafka-data/meta.properties ]; then
  java $opts -cp '/opt/kafka/libs/*' kafka.tools.StorageTool format --ignore-formatted -t %s -c /tmp/idemstream/server.properties \
    --add-scram 'SCRAM-SHA-256=%s' --add-scram 'SCRAM-SHA-512=%s'
fi
exec java $opts -cp '/opt/kafka/libs/*' kafka.Kafka /tmp/idemstream/server.properties
`, clusterID, scram, scram)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, err := startBox(ctx, boxSpec{
		name: "kafka", image: kafkaImage(), entrypoint: []string{"/bin/sh", "-c", script},
		ports: []int{bport, sport, tport},
		files: []testcontainers.ContainerFile{
			{Reader: strings.NewReader(text), ContainerFilePath: "/tmp/idemstream/server.properties", FileMode: 0o644},
			{Reader: strings.NewReader(string(logCfg)), ContainerFilePath: "/tmp/idemstream/log4j2.properties", FileMode: 0o644},
			{Reader: strings.NewReader(string(pem)), ContainerFilePath: "/tmp/idemstream/server.pem", FileMode: 0o644},
		},
	})
	if err != nil {
		return nil, err
	}
	k := &KafkaServer{
		Brokers:     []string{"127.0.0.1:" + strconv.Itoa(bport)},
		SASLBrokers: []string{"127.0.0.1:" + strconv.Itoa(sport)},
		TLSBrokers:  []string{"127.0.0.1:" + strconv.Itoa(tport)},
		CAFile:      ca,
		box:         b,
	}
	if err := b.waitUp(120*time.Second, k.ready); err != nil {
		return k, err
	}
	return k, nil
}

// The broker that the tests of one binary share on the container path
// (the process path's is started by scripts/servers.sh and named by
// IDEMSTREAM_TEST_KAFKA).
var sharedKafka struct {
	sync.Mutex
	k       *KafkaServer
	err     error
	perTest map[testing.TB]*KafkaServer
}

// containerKafka returns the shared broker on the container path, or nil
// on the others. Without Main (see there) each test gets its own.
func containerKafka(t testing.TB) *KafkaServer {
	t.Helper()
	if ServerSource(t) != Containers {
		return nil
	}
	sharedKafka.Lock()
	defer sharedKafka.Unlock()
	if sharedKafka.k != nil || sharedKafka.err != nil {
		if sharedKafka.err != nil {
			t.Fatalf("the shared kafka broker did not start: %v", sharedKafka.err)
		}
		return sharedKafka.k
	}
	if k := sharedKafka.perTest[t]; k != nil {
		return k
	}
	dir, err := os.MkdirTemp("", "idemstream-kafka-")
	if err != nil {
		t.Fatal(err)
	}
	k, err := startKafkaContainer(t, dir)
	cleanup := func() {
		if k != nil {
			_ = k.remove()
		}
		_ = os.RemoveAll(dir)
	}
	if onBinaryExit(cleanup) {
		sharedKafka.k, sharedKafka.err = k, err
	} else {
		if sharedKafka.perTest == nil {
			sharedKafka.perTest = map[testing.TB]*KafkaServer{}
		}
		sharedKafka.perTest[t] = k
		t.Cleanup(func() {
			sharedKafka.Lock()
			delete(sharedKafka.perTest, t)
			sharedKafka.Unlock()
			cleanup()
		})
	}
	if err != nil {
		t.Fatalf("start kafka: %v", err)
	}
	return k
}
