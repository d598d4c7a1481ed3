#!/usr/bin/env bash
# The whole test suite, as the README and CI run it: checks formatting and
# vet, starts the servers the integration tests need (installing them when
# missing), runs every test with the race detector, and stops the servers
# whatever happens.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
# shellcheck source=servers.sh
source internal/testenv/scripts/servers.sh

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.testenv/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
go vet ./...

trap servers_stop EXIT
servers_start
# The real-server tests must run here, not skip.
export IDEMSTREAM_REQUIRE_SERVERS=1

# The chaos test (internal/chaos) alone takes 5-8 minutes: more than go
# test's default 10-minute limit allows for a loaded machine.
go test -race -count=1 -timeout 30m "$@" ./...

# The deployment files (rules, dashboard, manifests, compose) are checked
# in a module of their own, so that the product's go.mod stays lean.
deploy/validate/run.sh
