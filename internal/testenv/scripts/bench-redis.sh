#!/usr/bin/env bash
# Decisions per second against a real redis-server, next to redis-benchmark's
# pipelined SET on the same server in the same run: the ratio is the figure
# to watch (a decision is a SET NX plus a TIME per batch, or a Lua script
# for keys already seen, and the Go side builds and parses each one).
set -euo pipefail
shopt -s inherit_errexit
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

# What a plain write costs Redis: its CPU (INFO cpu, every thread) per
# pipelined SET of an entry-sized value with an expiry, on new keys (NX,
# as many as a load round creates, from an empty keyspace as a round
# starts) and on existing ones (XX). With most records first copies, a
# store that writes each new key once costs the server at least the NX
# figure per first copy, and once more when it marks the key done.
server_cpu() {
  redis-cli -p "$port" info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2; n++ } END { if (n != 2) exit 1; printf "%.6f", s }'
}
value=$(head -c 400 /dev/zero | tr '\0' x)
expires=$(( ($(date +%s) + 3600) * 1000 ))
writes=250000
echo "== server CPU per plain write: SET of 400-byte values with PXAT, 2 clients, pipeline 500"
floor() { # mode key-range count
  local before after errors
  redis-cli -p "$port" config resetstat >/dev/null
  before=$(server_cpu)
  redis-benchmark -h 127.0.0.1 -p "$port" -n "$3" -P 500 -c 2 -r "$2" -q --csv \
    SET "floor:{p:9f8a2c1d-3e4f-4a5b-8c6d-__rand_int__}" "$value" "$1" PXAT "$expires" >/dev/null
  after=$(server_cpu)
  # redis-benchmark prints error replies and goes on: any failed SET
  # makes the figure meaningless.
  errors=$(redis-cli -p "$port" info errorstats | grep -c '^errorstat_' || true)
  if [ "$errors" != 0 ]; then
    echo "bench-redis: SET $1 got error replies:" >&2
    redis-cli -p "$port" info errorstats >&2
    exit 1
  fi
  awk -v a="$before" -v b="$after" -v n="$3" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }'
}
keys() { redis-cli -p "$port" dbsize; }
nx=$(floor NX 1000000000 "$writes")
created=$(keys)
redis-cli -p "$port" flushall >/dev/null
# Ten writes per key of a range of 100,000 leave all but a handful
# existing before the XX run.
floor NX 100000 $((10 * 100000)) >/dev/null
existing=$(keys)
xx=$(floor XX 100000 "$writes")
echo "SET NX (new keys, $created created): $nx µs per write; SET XX (over $existing existing keys): $xx µs per write" | tee -a "$out"
redis-cli -p "$port" flushall >/dev/null

echo "== idemstream decide (GOMAXPROCS callers, one batch per call)"
go test ./dedupe/redisstore -run '^$' -bench BenchmarkDecide -benchtime 3s -count "${COUNT:-3}" | tee -a "$out"
awk '
  /^set pipeline=/ { if ($3 > set) set = $3 }
  /BenchmarkDecide\/batch=(100|1000)-/ { for (i = 1; i <= NF; i++) if ($(i+1) == "decisions/s" && $i > best) best = $i }
  END { if (set > 0) printf "best batched decisions/s %.0f / best pipelined SET/s %.0f = %.0f%%\n", best, set, 100 * best / set }
' "$out"
