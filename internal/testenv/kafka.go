package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// KafkaEnv names the variable that holds the brokers of the shared test
// Kafka cluster, comma-separated host:port. scripts/test.sh (make test)
// starts a real broker (scripts/kafka.sh) and sets it.
const KafkaEnv = "IDEMSTREAM_TEST_KAFKA"

// KafkaBrokers returns the brokers named by IDEMSTREAM_TEST_KAFKA, once
// they answer a Metadata request; without the variable, on the container
// path, a broker in a container. Otherwise the test skips, or fails when
// Required. Every test shares the one broker: name topics and groups with
// UniqueName.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	env := os.Getenv(KafkaEnv)
	if strings.TrimSpace(env) == "" {
		if k := containerKafka(t); k != nil {
			return k.Brokers
		}
		unavailable(t, "no Kafka broker: run `make test` (it starts one), or set %s=host:port", KafkaEnv)
	}
	var brokers []string
	for _, b := range strings.Split(env, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if err := waitKafka(brokers, 15*time.Second); err != nil {
		t.Fatalf("%s=%s: %v", KafkaEnv, env, err)
	}
	return brokers
}

// waitKafka polls Metadata until the cluster lists a broker.
func waitKafka(brokers []string, timeout time.Duration) error {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}})
		cancel()
		if err == nil && len(md.Brokers) > 0 {
			return nil
		}
		if err == nil {
			err = errors.New("the cluster lists no broker")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to Metadata within %v: %w", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CreateTopics creates the topics with the given number of partitions and
// one replica each, and waits until every partition has a leader. A topic
// that exists already is accepted when it has that many partitions.
func CreateTopics(t testing.TB, brokers []string, partitions int, names ...string) {
	t.Helper()
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	req := &kafka.CreateTopicsRequest{}
	for _, name := range names {
		req.Topics = append(req.Topics, kafka.TopicConfig{
			Topic: name, NumPartitions: partitions, ReplicationFactor: 1,
		})
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
	var last error
	for {
		last = topicsReady(ctx, client, partitions, names)
		if last == nil {
			return
		}
		var fatal *wrongPartitions
		if errors.As(last, &fatal) {
			t.Fatalf("create topics: %v", last)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topics %v not ready within 30s: %v", names, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type wrongPartitions struct {
	topic      string
	have, want int
}

func (e *wrongPartitions) Error() string {
	return fmt.Sprintf("topic %s exists with %d partitions, not %d", e.topic, e.have, e.want)
}

// topicsReady tells why the topics are not all ready yet, or nil.
func topicsReady(ctx context.Context, client *kafka.Client, partitions int, names []string) error {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
	if err != nil {
		return err
	}
	found := make(map[string]kafka.Topic, len(md.Topics))
	for _, topic := range md.Topics {
		found[topic.Name] = topic
	}
	for _, name := range names {
		topic, ok := found[name]
		switch {
		case !ok:
			return fmt.Errorf("topic %s: not in metadata", name)
		case topic.Error != nil:
			return fmt.Errorf("topic %s: %w", name, topic.Error)
		case len(topic.Partitions) == 0:
			return fmt.Errorf("topic %s: no partitions yet", name)
		case len(topic.Partitions) != partitions:
			return &wrongPartitions{topic: name, have: len(topic.Partitions), want: partitions}
		}
		for _, p := range topic.Partitions {
			if p.Error != nil {
				return fmt.Errorf("topic %s partition %d: %w", name, p.ID, p.Error)
			}
			if p.Leader.Host == "" { // no leader: kafka-go leaves a zero Broker
				return fmt.Errorf("topic %s partition %d: no leader", name, p.ID)
			}
		}
	}
	// Metadata names a leader a moment before that leader serves the
	// partition (a produce then fails with NOT_LEADER_OR_FOLLOWER): wait
	// until each leader answers ListOffsets for its partitions too.
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, name := range names {
		for p := range partitions {
			req.Topics[name] = append(req.Topics[name], kafka.LastOffsetOf(p))
		}
	}
	res, err := client.ListOffsets(ctx, req)
	if err != nil {
		return err
	}
	for _, name := range names {
		if len(res.Topics[name]) != partitions {
			return fmt.Errorf("topic %s: ListOffsets answered for %d partitions of %d", name, len(res.Topics[name]), partitions)
		}
		for _, p := range res.Topics[name] {
			if p.Error != nil {
				return fmt.Errorf("topic %s partition %d: %w", name, p.Partition, p.Error)
			}
		}
	}
	return nil
}

var (
	runID   = newRunID()
	nameSeq atomic.Uint64
)

func newRunID() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return strconv.FormatInt(time.Now().Unix()%100000, 36) + hex.EncodeToString(b[:])
}

// UniqueName returns a topic or group name, made of base and the test's
// name, that no other test and no other run uses on the shared broker. It
// uses only letters, digits and '-' (valid for topics, and free of Kafka's
// '.'/'_' metric-name collisions).
func UniqueName(t testing.TB, base string) string {
	t.Helper()
	name := sanitize(base) + "-" + sanitize(t.Name())
	if len(name) > 180 {
		name = name[:180]
	}
	return fmt.Sprintf("%s-%s-%d", name, runID, nameSeq.Add(1))
}

func sanitize(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if ok {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.Trim(b.String(), "-")
}

// KafkaSASLBrokers returns the SASL_PLAINTEXT listener of the test broker
// (IDEMSTREAM_TEST_KAFKA_SASL, set by scripts/servers.sh): PLAIN,
// SCRAM-SHA-256 and SCRAM-SHA-512 for user KafkaSASLUser.
func KafkaSASLBrokers(t testing.TB) []string {
	t.Helper()
	addr := strings.TrimSpace(os.Getenv("IDEMSTREAM_TEST_KAFKA_SASL"))
	if addr == "" && strings.TrimSpace(os.Getenv(KafkaEnv)) == "" {
		if k := containerKafka(t); k != nil {
			return k.SASLBrokers
		}
	}
	if addr == "" {
		unavailable(t, "no SASL listener: run `make test` (its broker has one), or set IDEMSTREAM_TEST_KAFKA_SASL=host:port")
	}
	return strings.Split(addr, ",")
}

// The test broker's SASL user (scripts/kafka.sh, kafka/server.properties).
const (
	KafkaSASLUser     = "idemstream"
	KafkaSASLPassword = "idemstream-test-secret"
)

// KafkaTLSBrokers returns the TLS listener of the test broker and the file
// of the CA that signed its certificate (IDEMSTREAM_TEST_KAFKA_TLS and
// IDEMSTREAM_TEST_KAFKA_TLS_CA, set by scripts/servers.sh).
func KafkaTLSBrokers(t testing.TB) (brokers []string, caFile string) {
	t.Helper()
	addr := strings.TrimSpace(os.Getenv("IDEMSTREAM_TEST_KAFKA_TLS"))
	caFile = os.Getenv("IDEMSTREAM_TEST_KAFKA_TLS_CA")
	if addr == "" && strings.TrimSpace(os.Getenv(KafkaEnv)) == "" {
		if k := containerKafka(t); k != nil {
			return k.TLSBrokers, k.CAFile
		}
	}
	if addr == "" || caFile == "" {
		unavailable(t, "no TLS listener: run `make test` (its broker has one), or set IDEMSTREAM_TEST_KAFKA_TLS=host:port and IDEMSTREAM_TEST_KAFKA_TLS_CA=file")
	}
	return strings.Split(addr, ","), caFile
}
