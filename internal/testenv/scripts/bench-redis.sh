#!/usr/bin/env bash
# Decisions per second against a real redis-server, next to redis-benchmark's
# pipelined SET on the same server in the same run: the ratio is the figure
# to watch (a decision is a SET NX plus a TIME per batch, or a Lua script
# for keys already seen, and the Go side builds and parses each one).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
source internal/testenv/scripts/servers.sh
ensure_redis_installed
out=$(mktemp)
trap 'rm -f "$out"; servers_stop' EXIT
servers_start redis
addr="$IDEMSTREAM_TEST_REDIS"
port="${addr##*:}"
# Two clients: BenchmarkDecide runs GOMAXPROCS (2 here) callers in parallel.
# Values of 256 bytes: a stored entry is about that long (the SET default of
# 3 bytes is printed too, for reference, and not used for the ratio).
echo "== redis-benchmark: SET, 2 clients, pipeline 100 and 1000, 256-byte values"
for pipeline in 100 1000; do
  rps=$(redis-benchmark -h 127.0.0.1 -p "$port" -t set -n 2000000 -P "$pipeline" -c 2 -r 1000000 -d 256 -q --csv \
    | awk -F'"' '$2=="SET"{print $4}')
  echo "set pipeline=$pipeline $rps" | tee -a "$out"
done
rps=$(redis-benchmark -h 127.0.0.1 -p "$port" -t set -n 2000000 -P 1000 -c 2 -r 1000000 -q --csv | awk -F'"' '$2=="SET"{print $4}')
echo "(reference: 3-byte values, pipeline 1000: $rps SET/s)"
redis-cli -p "$port" flushall >/dev/null
echo "== idemstream decide (GOMAXPROCS callers, one batch per call)"
go test ./dedupe/redisstore -run '^$' -bench BenchmarkDecide -benchtime 3s -count "${COUNT:-3}" | tee -a "$out"
awk '
  /^set pipeline=/ { if ($3 > set) set = $3 }
  /BenchmarkDecide\/batch=(100|1000)-/ { for (i = 1; i <= NF; i++) if ($(i+1) == "decisions/s" && $i > best) best = $i }
  END { if (set > 0) printf "best batched decisions/s %.0f / best pipelined SET/s %.0f = %.0f%%\n", best, set, 100 * best / set }
' "$out"
