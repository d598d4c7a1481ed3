# The README's commands. `make test` is what CI runs.
.PHONY: test demo build fuzz bench vet load latency crash-latency bench-redis bench-audit chaos

test:
	./internal/testenv/scripts/test.sh

demo:
	go run ./cmd/idemstream demo

build:
	go build -o bin/idemstream ./cmd/idemstream

vet:
	gofmt -l $$(git ls-files '*.go')
	go vet ./...

# Fuzz the canonicalizer, then the Avro and Protobuf decoders, each for
# FUZZTIME (FUZZTIME=10m make fuzz).
FUZZTIME ?= 60s
fuzz:
	go test ./dedupe -run '^$$' -fuzz FuzzCanonical -fuzztime $(FUZZTIME)
	go test ./decode -run '^$$' -fuzz '^FuzzAvroDecode$$' -fuzztime $(FUZZTIME)
	go test ./decode -run '^$$' -fuzz '^FuzzAvroSchema$$' -fuzztime $(FUZZTIME)
	go test ./decode -run '^$$' -fuzz '^FuzzProtoDecode$$' -fuzztime $(FUZZTIME)
	go test ./decode -run '^$$' -fuzz '^FuzzAvroCanonicalSame$$' -fuzztime $(FUZZTIME)

# Canonicalization against gowebpki/jcs, and one claim fingerprinted as
# Avro and as JSON, in one run; compare runs with benchstat.
bench:
	go test ./dedupe ./decode -run '^$$' -bench 'Fingerprint|JCS' -benchmem -count 6 | tee bench.txt

# Throughput of `idemstream run` against the strongest kafka-go passthrough
# (internal/load/passthrough) over one backlog on the same real broker and
# Redis, each from process start to lag 0 (the passthrough warmed up
# LOAD_WARMUPS times, then
# LOAD_ROUNDS idemstream runs with a passthrough run before the first and
# after each); prints the rates, each round's ratio and their median,
# Redis CPU per record and peak RSS (LOAD_RECORDS=20000 make load for a
# quick run; LOAD_REDIS_AOF=1 for a Redis with appendfsync always;
# LOAD_PASSTHROUGH_ARGS='--overlap-commit' to try the passthrough's flags;
# LOAD_PREFILL=N puts N other entries in Redis first, as a window holds).
# LOAD_STREAMS=1 adds the Kafka Streams peer (internal/load/streams; needs
# javac and mvn) over the same backlog. After each round two floor runs of
# the passthrough (a fingerprint per record; a fingerprint and a SET NX)
# show what the least idempotent consumer costs; LOAD_FLOOR=0 leaves them out.
# LOAD_PAYLOAD=avro (json by default) also writes the backlog in Avro behind a
# schema registry and, after each idemstream run, runs one over it with
# `payload: avro` (J A J A ...), and prints the Avro/JSON rate ratio.
# LOAD_PROFILE=dir takes CPU profiles of each idemstream run into dir
# (metrics.pprof), for `go tool pprof -top dir/<run>-*.pprof`;
# LOAD_PROFILE_KIND=allocs takes what each second allocated instead.
LOAD_RECORDS ?= 325000
LOAD_ROUNDS ?= 3
LOAD_WARMUPS ?= 6
LOAD_PREFILL ?= 0
LOAD_REDIS_AOF ?=
LOAD_PASSTHROUGH_ARGS ?=
LOAD_STREAMS ?=
LOAD_FLOOR ?= 1
LOAD_PAYLOAD ?= json
LOAD_ENTRY_FORMAT ?=
LOAD_PROFILE ?=
LOAD_PROFILE_KIND ?= cpu
load:
	bash -c 'source internal/testenv/scripts/servers.sh && trap servers_stop EXIT && servers_start && \
	  IDEMSTREAM_LOAD=1 IDEMSTREAM_LOAD_RECORDS=$(LOAD_RECORDS) IDEMSTREAM_LOAD_ROUNDS=$(LOAD_ROUNDS) IDEMSTREAM_LOAD_WARMUPS=$(LOAD_WARMUPS) IDEMSTREAM_LOAD_PREFILL=$(LOAD_PREFILL) IDEMSTREAM_LOAD_REDIS_AOF=$(LOAD_REDIS_AOF) IDEMSTREAM_LOAD_STREAMS=$(LOAD_STREAMS) IDEMSTREAM_LOAD_FLOOR=$(LOAD_FLOOR) IDEMSTREAM_LOAD_PAYLOAD=$(LOAD_PAYLOAD) IDEMSTREAM_LOAD_ENTRY_FORMAT=$(LOAD_ENTRY_FORMAT) IDEMSTREAM_LOAD_PROFILE=$(LOAD_PROFILE) IDEMSTREAM_LOAD_PROFILE_KIND=$(LOAD_PROFILE_KIND) \
	  IDEMSTREAM_LOAD_PASSTHROUGH_ARGS="$(LOAD_PASSTHROUGH_ARGS)" \
	  go test ./internal/load -run TestThroughput -count=1 -v -timeout 40m'

# Latency added at a fixed rate (half the fastest of eight passthrough runs
# over a backlog measured first, or LATENCY_RATE records/s) for LATENCY_DURATION:
# p50 and p99 from record time to result seen, passthrough and idemstream.
LATENCY_RATE ?=
LATENCY_DURATION ?= 30s
latency:
	bash -c 'source internal/testenv/scripts/servers.sh && trap servers_stop EXIT && servers_start && \
	  IDEMSTREAM_LATENCY=1 IDEMSTREAM_LATENCY_RATE=$(LATENCY_RATE) IDEMSTREAM_LATENCY_DURATION=$(LATENCY_DURATION) IDEMSTREAM_LOAD_ENTRY_FORMAT=$(LOAD_ENTRY_FORMAT) \
	  go test ./internal/load -run TestLatency -count=1 -v -timeout 40m'

# What a crashed member costs: CRASH_RATE commands/s on three members of
# one group (IDEMSTREAM_INSTANCE_ID=member-N, default timings), each in
# turn SIGKILLed and restarted 3 s later, one kill every 10 s after a 10 s
# warm-up for CRASH_DURATION; prints, from the topics' timestamps, result
# latency p50, p99 and max and the longest time without a result (on any
# partition and per partition), and fails unless each key has exactly one
# result. CRASH_PREVIOUS=PATH (the previous release's binary) runs the same
# after this tree's binary and prints both side by side; CRASH_LOGS=DIR
# keeps the members' logs; CRASH_KILLS=0 is the baseline without kills.
CRASH_RATE ?= 3000
CRASH_DURATION ?= 60s
CRASH_PREVIOUS ?=
CRASH_LOGS ?=
CRASH_KILLS ?= 1
crash-latency:
	bash -c 'source internal/testenv/scripts/servers.sh && trap servers_stop EXIT && servers_start redis kafka && \
	  IDEMSTREAM_CRASH=1 IDEMSTREAM_CRASH_RATE=$(CRASH_RATE) IDEMSTREAM_CRASH_DURATION=$(CRASH_DURATION) \
	  IDEMSTREAM_CRASH_PREVIOUS="$(CRASH_PREVIOUS)" IDEMSTREAM_LOAD_LOGS="$(CRASH_LOGS)" IDEMSTREAM_CRASH_KILLS=$(CRASH_KILLS) \
	  go test ./internal/load -run TestCrashLatency -count=1 -v -timeout 40m'

# Redis decisions per second next to redis-benchmark's pipelined SET.
bench-redis:
	./internal/testenv/scripts/bench-redis.sh

# `idemstream audit`: the passes in memory, memory per key, and a topic of
# 1,000,000 records of about 1 KB on a real broker next to a plain kafka-go
# read of it (AUDIT_RECORDS=2000000 make bench-audit for a longer run).
AUDIT_RECORDS ?= 1000000
bench-audit:
	go test ./audit -run '^$$' -bench 'Analyzer1K|Replayer1K' -benchmem -count 3 | tee bench-audit.txt
	go test ./audit -run '^$$' -bench 'MemoryPerKey' -benchtime 1x | tee -a bench-audit.txt
	bash -c 'source internal/testenv/scripts/servers.sh && trap servers_stop EXIT && servers_start kafka && \
	  IDEMSTREAM_LOAD_AUDIT=1 IDEMSTREAM_LOAD_AUDIT_RECORDS=$(AUDIT_RECORDS) go test ./audit -run TestLoadAuditVsPlainRead -count=1 -v -timeout 30m | grep -E "load_test|ok|FAIL" | tee -a bench-audit.txt'

# The full chaos run (a backlog of 30,000 keys on a private three-node
# Kafka cluster, default timings, faults one at a time for 17-22 minutes); the short variant
# runs in `make test`. It starts its own cluster and redis-server
# (installed from Debian's packages first if missing).
chaos:
	bash -c 'source internal/testenv/scripts/servers.sh && ensure_redis_installed && \
	  IDEMSTREAM_REQUIRE_SERVERS=1 IDEMSTREAM_CHAOS=full go test -count=1 -race -run TestChaos -v -timeout 75m ./internal/chaos/'
