package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

// brokerScript is kafka.sh with the state directory of one broker.
type brokerScript struct {
	path string
	dir  string               // its IDEMSTREAM_TESTENV_DIR
	k    *testenv.KafkaServer // instead of the script: a broker in a container
}

// chaosBroker returns the broker of the test and the script that restarts
// it, or why the restart must be skipped.
//
// When the test servers were started by internal/testenv/scripts
// (IDEMSTREAM_TESTENV_DIR names their state, with the broker's jars), the
// test starts a private broker with the same script and jars (`kafka.sh up`
// in a temporary state directory, a few seconds) and restarts that one:
// `go test ./...` runs packages in parallel, and restarting the shared
// broker would break the tests of other packages that use it meanwhile.
// Otherwise it uses the shared broker (IDEMSTREAM_TEST_KAFKA) and skips
// the restart.
func chaosBroker(t *testing.T, root string) ([]string, *brokerScript, string) {
	t.Helper()
	if os.Getenv(testenv.KafkaEnv) == "" && testenv.ServerSource(t) == testenv.Containers {
		k := testenv.StartKafka(t)
		return k.Brokers, &brokerScript{k: k, dir: "a container"}, ""
	}
	script := filepath.Join(root, "internal", "testenv", "scripts", "kafka.sh")
	shared := os.Getenv("IDEMSTREAM_TESTENV_DIR")
	if shared == "" {
		return testenv.KafkaBrokers(t), nil, "IDEMSTREAM_TESTENV_DIR is not set: the broker of IDEMSTREAM_TEST_KAFKA was not started by internal/testenv/scripts, and the test has no jars to start its own"
	}
	libs := filepath.Join(shared, "kafka-libs")
	if st, err := os.Stat(libs); err != nil || !st.IsDir() {
		return testenv.KafkaBrokers(t), nil, fmt.Sprintf("%s has no kafka-libs: no jars to start a private broker with", shared)
	}
	libs, _ = filepath.Abs(libs)
	dir := t.TempDir()
	if err := os.Symlink(libs, filepath.Join(dir, "kafka-libs")); err != nil {
		t.Fatal(err)
	}
	s := &brokerScript{path: script, dir: dir}
	t.Cleanup(func() {
		if out, err := s.run(60*time.Second, "stop"); err != nil {
			t.Errorf("kafka.sh stop of the private broker: %v: %s", err, out)
		}
	})
	if out, err := s.run(150*time.Second, "up"); err != nil {
		t.Fatalf("kafka.sh up (private broker in %s): %v\n%s", dir, err, out)
	}
	out, err := s.run(10*time.Second, "addr")
	if err != nil {
		t.Fatalf("kafka.sh addr: %v: %s", err, out)
	}
	return []string{strings.TrimSpace(out)}, s, ""
}

func (s *brokerScript) run(timeout time.Duration, args ...string) (string, error) {
	if s.k != nil {
		switch args[0] {
		case "stop":
			return "", s.k.Stop()
		case "start":
			return "", s.k.Start()
		}
		return "", fmt.Errorf("%s: not supported on a broker in a container", args[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{s.path}, args...)...)
	cmd.Env = append(os.Environ(), "IDEMSTREAM_TESTENV_DIR="+s.dir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// groupProgress reads the end offsets of topic and the group's committed
// offsets.
func groupProgress(ctx context.Context, client *kafka.Client, group, topic string, partitions int) (ends, committed map[int]int64, err error) {
	var reqs []kafka.OffsetRequest
	var ids []int
	for p := range partitions {
		reqs = append(reqs, kafka.LastOffsetOf(p))
		ids = append(ids, p)
	}
	lo, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, nil, fmt.Errorf("list offsets: %w", err)
	}
	ends = map[int]int64{}
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("list offsets of partition %d: %w", po.Partition, po.Error)
		}
		ends[po.Partition] = po.LastOffset
	}
	of, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return nil, nil, fmt.Errorf("offset fetch: %w", err)
	}
	if of.Error != nil {
		return nil, nil, fmt.Errorf("offset fetch: %w", of.Error)
	}
	committed = map[int]int64{}
	for _, po := range of.Topics[topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("offset fetch of partition %d: %w", po.Partition, po.Error)
		}
		committed[po.Partition] = po.CommittedOffset
	}
	if len(ends) != partitions || len(committed) != partitions {
		return nil, nil, fmt.Errorf("answers for %d and %d partitions, want %d", len(ends), len(committed), partitions)
	}
	return ends, committed, nil
}

// waitCommitted polls until the group has committed at least target on
// every partition (target nil: the end of every partition, read at each
// poll). It returns how long that took, or an error naming the partitions
// behind when the deadline passes.
func waitCommitted(ctx context.Context, client *kafka.Client, group, topic string, partitions int, target map[int]int64, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var last string
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ends, committed, err := groupProgress(qctx, client, group, topic, partitions)
		cancel()
		if err == nil {
			want := target
			if want == nil {
				want = ends
			}
			var behind []string
			for p := range partitions {
				if w := want[p]; w > 0 && committed[p] < w {
					behind = append(behind, fmt.Sprintf("p%d committed %d of %d", p, committed[p], w))
				}
			}
			if len(behind) == 0 {
				return time.Since(start), nil
			}
			sort.Strings(behind)
			last = strings.Join(behind, ", ")
		} else {
			last = err.Error()
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("group %s not caught up after %v: %s", group, timeout, last)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// endOffsets reads the end of every partition, retrying while the broker
// is coming back.
func endOffsets(ctx context.Context, client *kafka.Client, topic string, partitions int, timeout time.Duration) (map[int]int64, error) {
	start := time.Now()
	for {
		var reqs []kafka.OffsetRequest
		for p := range partitions {
			reqs = append(reqs, kafka.LastOffsetOf(p))
		}
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lo, err := client.ListOffsets(qctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
		cancel()
		if err == nil {
			out := map[int]int64{}
			for _, po := range lo.Topics[topic] {
				if po.Error == nil {
					out[po.Partition] = po.LastOffset
				}
			}
			if len(out) == partitions {
				return out, nil
			}
			err = fmt.Errorf("end offsets of %d partitions of %d", len(out), partitions)
		}
		if time.Since(start) > timeout {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// groupStable reports whether the group is Stable with n members, each
// with an assignment: a generation is running, no rebalance is pending.
func groupStable(ctx context.Context, client *kafka.Client, group string, n int) bool {
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	res, err := client.DescribeGroups(qctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil || len(res.Groups) != 1 {
		return false
	}
	g := res.Groups[0]
	if g.Error != nil || g.GroupState != "Stable" || len(g.Members) != n {
		return false
	}
	for _, m := range g.Members {
		if len(m.MemberAssignments.Topics) == 0 {
			return false
		}
	}
	return true
}

// waitSettled polls until a generation runs with every instance in it:
// each instance answers /readyz (a restarted one only once it has joined,
// which waits for the killed member's session to time out) and the group
// is Stable. Stable alone is not enough: right after a restart the group
// is still Stable with the dead member, until the new one's JoinGroup.
func waitSettled(ctx context.Context, fl *fleet, client *kafka.Client, group string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if fl.ready() && groupStable(ctx, client, group, len(fl.slots)) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}
