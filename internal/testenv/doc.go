// Package testenv gives integration tests real servers: a redis-server
// started from the machine's binary (installed from Debian's packages by
// scripts/test.sh), or the server named by IDEMSTREAM_TEST_REDIS.
//
// When a server can be neither found nor started, tests skip with the
// reason, unless IDEMSTREAM_REQUIRE_SERVERS=1 (set by scripts/test.sh and
// so by CI), which turns the skip into a failure: the real-server proofs
// must never pass vacuously where they are supposed to run.
package testenv
