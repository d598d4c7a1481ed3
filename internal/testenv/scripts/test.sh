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

# Where the servers come from (IDEMSTREAM_TEST_SERVERS, see
# internal/testenv/servers.go): auto takes containers when a Docker daemon
# answers, else local processes. Every test binary gets the decision.
servers=$(choose_servers) || exit 2
export IDEMSTREAM_TEST_SERVERS="$servers"
case "$servers" in
  containers)
    # The tests start their containers themselves and remove them when
    # they end; what a killed test binary left goes here.
    trap remove_leftover_containers EXIT
    # The replication and failover tests run their Redis servers as local
    # processes on either path (a proxy sits between master and replica).
    ensure_redis_installed
    ;;
  processes)
    trap servers_stop EXIT
    servers_start
    ;;
esac
# The schema registry and the Java encoder run as local processes on
# either path: installed here (once, then reused), so that no test waits
# on Maven.
internal/testenv/scripts/registry.sh fetch >/dev/null
internal/testenv/scripts/serde.sh build >/dev/null
# The real-server tests must run here, not skip.
export IDEMSTREAM_REQUIRE_SERVERS=1

# The chaos test (internal/chaos) alone takes 12-15 minutes: more than go
# test's default 10-minute limit allows for a loaded machine.
go test -race -count=1 -timeout 60m "$@" ./...

# The deployment files (rules, dashboard, manifests, compose) are checked
# in a module of their own, so that the product's go.mod stays lean.
deploy/validate/run.sh
