package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// KafkaCluster is a private three-node Apache Kafka cluster (KRaft, each
// node broker and controller) on loopback, run by scripts/kafka-cluster.sh:
// replication factor 3, min.insync.replicas=2, replica.lag.time.max.ms at
// its default. A test may stop, kill and start its nodes; with acks=all a
// write survives one node down.
type KafkaCluster struct {
	// Brokers is the bootstrap list, one address per node.
	Brokers []string
	// StartedIn is how long `kafka-cluster.sh up` took, formatting included.
	StartedIn time.Duration
	t         testing.TB
	script    string
	dir       string // its IDEMSTREAM_TESTENV_DIR
	nodes     map[int]string
}

// ClusterNodes is the number of nodes of a KafkaCluster; node ids run
// from 1 to ClusterNodes.
const ClusterNodes = 3

// StartKafkaCluster starts a private cluster in a temporary directory and
// stops it when the test ends. The jars come from the kafka-libs of
// IDEMSTREAM_TESTENV_DIR, or of the module's .testenv (Maven fetches them
// once when neither has them). Without Java the test skips, or fails when
// Required.
func StartKafkaCluster(t testing.TB) *KafkaCluster {
	t.Helper()
	if _, err := exec.LookPath("java"); err != nil && os.Getenv("JAVA_HOME") == "" {
		unavailable(t, "no java: the Kafka cluster needs Java 17 (apt-get install openjdk-17-jre-headless)")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	shared := os.Getenv("IDEMSTREAM_TESTENV_DIR")
	if shared == "" {
		shared = filepath.Join(root, ".testenv")
	}
	libs, err := filepath.Abs(filepath.Join(shared, "kafka-libs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(libs, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &KafkaCluster{t: t, script: filepath.Join(root, "internal", "testenv", "scripts", "kafka-cluster.sh"), dir: t.TempDir(), nodes: map[int]string{}}
	if err := os.Symlink(libs, filepath.Join(c.dir, "kafka-libs")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := c.run(2*time.Minute, "down"); err != nil {
			t.Errorf("kafka-cluster.sh down: %v: %s", err, out)
		}
	})
	began := time.Now()
	out, err := c.run(5*time.Minute, "up")
	if err != nil {
		t.Fatalf("kafka-cluster.sh up (state in %s): %v\n%s", c.dir, err, out)
	}
	c.StartedIn = time.Since(began)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	c.Brokers = strings.Split(strings.TrimSpace(lines[len(lines)-1]), ",")
	if len(c.Brokers) != ClusterNodes {
		t.Fatalf("kafka-cluster.sh up printed %q: want %d addresses", lines[len(lines)-1], ClusterNodes)
	}
	for i, b := range c.Brokers {
		c.nodes[i+1] = b
	}
	return c
}

// moduleRoot walks up from the working directory to the go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func (c *KafkaCluster) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{c.script}, args...)...)
	cmd.Env = append(os.Environ(), "IDEMSTREAM_TESTENV_DIR="+c.dir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Addr is the address of node id.
func (c *KafkaCluster) Addr(id int) string { return c.nodes[id] }

// Dir is the cluster's state directory (node-N/server.log are the logs).
func (c *KafkaCluster) Dir() string { return filepath.Join(c.dir, "kafka-cluster") }

// Kill SIGKILLs node id (no controlled shutdown) and waits until it is gone.
func (c *KafkaCluster) Kill(id int) error { return c.node("kill", id, time.Minute) }

// Stop stops node id with SIGTERM (a controlled shutdown) and waits.
func (c *KafkaCluster) Stop(id int) error { return c.node("stop", id, 2*time.Minute) }

// Start starts node id again, with its data and ports, and waits until it
// answers.
func (c *KafkaCluster) Start(id int) error { return c.node("start", id, 3*time.Minute) }

func (c *KafkaCluster) node(verb string, id int, timeout time.Duration) error {
	if _, ok := c.nodes[id]; !ok {
		return fmt.Errorf("kafka cluster: no node %d", id)
	}
	out, err := c.run(timeout, verb, fmt.Sprint(id))
	if err != nil {
		return fmt.Errorf("kafka-cluster.sh %s %d: %w: %s", verb, id, err, strings.TrimSpace(out))
	}
	return nil
}

// Leader returns the node id that leads topic's partition now.
func (c *KafkaCluster) Leader(ctx context.Context, topic string, partition int) (int, error) {
	client := &kafka.Client{Addr: kafka.TCP(c.Brokers...), Timeout: 5 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	for _, tp := range md.Topics {
		if tp.Name != topic {
			continue
		}
		if tp.Error != nil {
			return 0, fmt.Errorf("metadata of %s: %w", topic, tp.Error)
		}
		for _, p := range tp.Partitions {
			if p.ID == partition {
				if p.Error != nil {
					return 0, fmt.Errorf("metadata of %s/%d: %w", topic, partition, p.Error)
				}
				if p.Leader.Host == "" {
					return 0, fmt.Errorf("%s/%d has no leader", topic, partition)
				}
				return p.Leader.ID, nil
			}
		}
	}
	return 0, fmt.Errorf("metadata names no partition %s/%d", topic, partition)
}

// CreateTopics creates the topics with the given number of partitions and
// three replicas each, and waits until every partition has a leader and
// all three replicas in sync.
func (c *KafkaCluster) CreateTopics(t testing.TB, partitions int, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(c.Brokers...), Timeout: 10 * time.Second}
	req := &kafka.CreateTopicsRequest{}
	for _, name := range names {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: name, NumPartitions: partitions, ReplicationFactor: ClusterNodes})
	}
	res, err := client.CreateTopics(ctx, req)
	if err != nil {
		t.Fatalf("create topics %v: %v", names, err)
	}
	for name, err := range res.Errors {
		if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			t.Fatalf("create topic %s: %v", name, err)
		}
	}
	for {
		last := topicsReady(ctx, client, partitions, names)
		if last == nil {
			last = c.inSync(ctx, names)
		}
		if last == nil {
			return
		}
		var fatal *wrongPartitions
		if errors.As(last, &fatal) {
			t.Fatalf("create topics: %v", last)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topics %v not ready within a minute: %v", names, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// InSync reports why some partition of the topics has fewer than three
// replicas in sync, or nil: after a node's restart, the cluster is whole
// again once its replicas have caught up.
func (c *KafkaCluster) InSync(ctx context.Context, topics ...string) error {
	return c.inSync(ctx, topics)
}

func (c *KafkaCluster) inSync(ctx context.Context, names []string) error {
	client := &kafka.Client{Addr: kafka.TCP(c.Brokers...), Timeout: 5 * time.Second}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
	if err != nil {
		return err
	}
	for _, tp := range md.Topics {
		if tp.Error != nil {
			return fmt.Errorf("topic %s: %w", tp.Name, tp.Error)
		}
		for _, p := range tp.Partitions {
			if len(p.Isr) < ClusterNodes {
				return fmt.Errorf("topic %s partition %d: %d replicas in sync of %d", tp.Name, p.ID, len(p.Isr), ClusterNodes)
			}
		}
	}
	return nil
}
