#!/usr/bin/env bash
# Decisions per second against a real redis-server, next to redis-benchmark's
# pipelined SET on the same server in the same run: the ratio is the figure
# to watch (each decision is a Lua script, not a SET).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
source internal/testenv/scripts/servers.sh
ensure_redis_installed
trap servers_stop EXIT
servers_start redis
addr="$IDEMSTREAM_TEST_REDIS"
port="${addr##*:}"

echo "== redis-benchmark: SET, pipeline 100 and 1000, 1 and 8 clients"
for clients in 1 8; do
  for pipeline in 100 1000; do
    redis-benchmark -h 127.0.0.1 -p "$port" -t set -n 2000000 -P "$pipeline" -c "$clients" -r 1000000 -q --csv \
      | sed "s/^/clients=$clients pipeline=$pipeline /"
  done
done
echo "== idemstream decide (one connection, batches)"
go test ./dedupe/redisstore -run '^$' -bench BenchmarkDecide -benchtime 3s -count "${COUNT:-3}"
