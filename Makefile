# The README's commands. `make test` is what CI runs.
.PHONY: test demo build fuzz bench vet load bench-redis chaos

test:
	./internal/testenv/scripts/test.sh

demo:
	go run ./cmd/idemstream demo

build:
	go build -o bin/idemstream ./cmd/idemstream

vet:
	gofmt -l $$(git ls-files '*.go')
	go vet ./...

# Fuzz the canonicalizer for a while (FUZZTIME=10m make fuzz).
FUZZTIME ?= 60s
fuzz:
	go test ./dedupe -run '^$$' -fuzz FuzzCanonical -fuzztime $(FUZZTIME)

# Canonicalization against gowebpki/jcs in one run; compare runs with benchstat.
bench:
	go test ./dedupe -run '^$$' -bench 'Fingerprint|JCS' -benchmem -count 6 | tee bench.txt

# Throughput of the strict pipeline against a bare kafka-go loop, on real
# servers (LOAD_RECORDS=200000 make load for a longer run).
LOAD_RECORDS ?= 50000
load:
	bash -c 'source internal/testenv/scripts/servers.sh && trap servers_stop EXIT && servers_start && \
	  IDEMSTREAM_LOAD=1 IDEMSTREAM_LOAD_RECORDS=$(LOAD_RECORDS) go test ./consumer -run TestLoadStrictPipelineVsBareLoop -count=1 -v -timeout 30m | grep -E "load_test|ok|FAIL"'

# Redis decisions per second next to redis-benchmark's pipelined SET.
bench-redis:
	./internal/testenv/scripts/bench-redis.sh

# The full chaos run (a backlog of 30,000 keys on a private three-node Kafka cluster,
# default timings, 6 minutes of faults); the short variant runs in
# `make test`. It starts its own cluster and redis-server.
chaos:
	IDEMSTREAM_REQUIRE_SERVERS=1 IDEMSTREAM_CHAOS=full go test -count=1 -race -run TestChaos -v -timeout 45m ./internal/chaos/
