// Package testenv gives integration tests real servers: Redis (a single
// server, a Cluster, a Sentinel set) and Apache Kafka, as handles that a
// test can stop, kill, freeze and start again.
//
// Where they come from is chosen once per test binary by
// IDEMSTREAM_TEST_SERVERS (see [ServersEnv]): servers named by the
// IDEMSTREAM_TEST_* variables first; else containers through
// testcontainers-go when a Docker daemon answers (images from
// IDEMSTREAM_REDIS_IMAGE and IDEMSTREAM_KAFKA_IMAGE, the official ones by
// default, built locally by scripts/images.sh where no registry is
// reachable); else local processes (redis-server from Debian's packages,
// Kafka from scripts/kafka.sh, both installed by scripts/test.sh).
//
// Containers never need a reaper: each is removed in the cleanup of the
// test (or, for the Kafka broker that a package's tests share, when [Main]
// ends the binary), and one that a killed binary left is removed by the
// next run (labels name the process that started it). On a daemon without
// a bridge network they use the host's network, so that testcontainers
// never creates a network of its own.
//
// For the tests that need real replication there is a private three-node
// KRaft cluster ([StartKafkaCluster], scripts/kafka-cluster.sh: replication
// factor 3, min.insync.replicas=2), always as local processes, whose nodes
// a test can stop, kill and start. The cluster takes 15-50 s to start on
// two loaded cores and about 1 GB of memory (3 × 300-350 MB resident under
// the chaos test), so only the chaos test and the cluster's own test use
// it; the fast tests keep the single broker.
//
// When a server can be neither found nor started, tests skip with the
// reason, unless IDEMSTREAM_REQUIRE_SERVERS=1 (set by scripts/test.sh and
// so by CI), which turns the skip into a failure: the real-server proofs
// must never pass vacuously where they are supposed to run.
package testenv
