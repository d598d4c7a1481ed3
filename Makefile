# The README's commands. `make test` is what CI runs.
.PHONY: test demo build fuzz bench vet

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
