// Package testenv gives integration tests real servers: a redis-server
// started from the machine's binary (installed from Debian's packages by
// scripts/test.sh), or the server named by IDEMSTREAM_TEST_REDIS; the
// shared Apache Kafka broker of scripts/kafka.sh (IDEMSTREAM_TEST_KAFKA);
// and, for the tests that need real replication, a private three-node
// KRaft cluster ([StartKafkaCluster], scripts/kafka-cluster.sh:
// replication factor 3, min.insync.replicas=2) whose nodes a test can
// stop, kill and start. The cluster takes 15-50 s to start on two loaded
// cores and about 1 GB of memory (3 × 300-350 MB resident under the chaos
// test), so only the chaos test and the cluster's own test use it; the
// fast tests keep the single broker.
//
// When a server can be neither found nor started, tests skip with the
// reason, unless IDEMSTREAM_REQUIRE_SERVERS=1 (set by scripts/test.sh and
// so by CI), which turns the skip into a failure: the real-server proofs
// must never pass vacuously where they are supposed to run.
package testenv
