#!/usr/bin/env bash
# Installs, starts and stops the real servers of the integration tests.
# Sourced by test.sh and the benchmark scripts. A server named by its
# IDEMSTREAM_TEST_* variable is used as it is: nothing is started for it.
state_dir="${IDEMSTREAM_TESTENV_DIR:-$PWD/.testenv}"
mkdir -p "$state_dir"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# ensure_redis_installed installs redis-server (and redis-benchmark) from
# Debian's packages when the machine lacks them.
ensure_redis_installed() {
  if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
    return
  fi
  echo "installing redis-server from Debian's packages" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server redis-tools >/dev/null
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

start_redis() {
  if [ -n "${IDEMSTREAM_TEST_REDIS:-}" ]; then
    echo "using the Redis server at $IDEMSTREAM_TEST_REDIS" >&2
    return
  fi
  ensure_redis_installed
  local port dir
  port=$(free_port)
  dir="$state_dir/redis"
  # A server an interrupted run left behind goes first: starting is
  # idempotent.
  if [ -f "$dir/redis.pid" ]; then
    kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save "" --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 1 100); do
    if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
      export IDEMSTREAM_TEST_REDIS="127.0.0.1:$port"
      echo "redis-server $(redis-server --version | awk '{print $3}') on $IDEMSTREAM_TEST_REDIS" >&2
      started_redis_pidfile="$dir/redis.pid"
      return
    fi
    sleep 0.1
  done
  echo "redis-server did not answer on port $port; its log:" >&2
  cat "$dir/redis.log" >&2
  return 1
}

# ensure_valkey_root makes $state_dir/valkey-root, a minimal Debian trixie
# with valkey-server (8.1, the first with SET … IFEQ; bookworm has none),
# by debootstrap from Debian's packages, once.
ensure_valkey_root() {
  valkey_root="$state_dir/valkey-root"
  [ -x "$valkey_root/usr/bin/valkey-server" ] && return
  if ! command -v debootstrap >/dev/null; then
    echo "installing debootstrap from Debian's packages" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  echo "debootstrap trixie (valkey-server) into $valkey_root" >&2
  as_root rm -rf "$valkey_root.tmp"
  if ! as_root debootstrap --variant=minbase --include=valkey-server trixie "$valkey_root.tmp" \
    "${IDEMSTREAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$state_dir/valkey-root.log" 2>&1; then
    tail -n 30 "$state_dir/valkey-root.log" >&2
    echo "debootstrap of valkey-server failed (log: $state_dir/valkey-root.log)" >&2
    return 1
  fi
  as_root mv "$valkey_root.tmp" "$valkey_root"
}

start_valkey() {
  if [ -n "${IDEMSTREAM_TEST_VALKEY:-}" ]; then
    echo "using the Valkey server at $IDEMSTREAM_TEST_VALKEY" >&2
    return
  fi
  ensure_valkey_root
  local port pidfile="$valkey_root/run/valkey-testenv.pid"
  port=$(free_port)
  if [ -f "$pidfile" ]; then
    as_root kill "$(cat "$pidfile")" 2>/dev/null || true
    as_root rm -f "$pidfile"
  fi
  as_root chroot "$valkey_root" valkey-server --port "$port" --bind 127.0.0.1 --dir /tmp --save "" \
    --appendonly no --daemonize yes --pidfile /run/valkey-testenv.pid --logfile /tmp/valkey-testenv.log
  for _ in $(seq 1 100); do
    if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
      export IDEMSTREAM_TEST_VALKEY="127.0.0.1:$port"
      echo "valkey-server $(redis-cli -p "$port" info server | sed -n 's/^valkey_version:\([0-9.]*\).*/\1/p') on $IDEMSTREAM_TEST_VALKEY" >&2
      started_valkey_pidfile="$pidfile"
      return
    fi
    sleep 0.1
  done
  echo "valkey-server did not answer on port $port; its log:" >&2
  cat "$valkey_root/tmp/valkey-testenv.log" >&2
  return 1
}

stop_valkey() {
  if [ -n "${started_valkey_pidfile:-}" ] && [ -f "$started_valkey_pidfile" ]; then
    as_root kill "$(cat "$started_valkey_pidfile")" 2>/dev/null || true
    as_root rm -f "$started_valkey_pidfile"
    started_valkey_pidfile=
    unset IDEMSTREAM_TEST_VALKEY
  fi
}

stop_redis() {
  if [ -n "${started_redis_pidfile:-}" ] && [ -f "$started_redis_pidfile" ]; then
    kill "$(cat "$started_redis_pidfile")" 2>/dev/null || true
    rm -f "$started_redis_pidfile"
  fi
}

# start_kafka starts a real Kafka broker (KRaft, broker+controller in one
# JVM, on free loopback ports) with scripts/kafka.sh, from jars that Maven
# fetches once, and exports IDEMSTREAM_TEST_KAFKA=127.0.0.1:PORT. It also
# exports IDEMSTREAM_TESTENV_DIR, so that a test can run
# `kafka.sh stop|kill|start|status` on the same broker (same data, same port).
start_kafka() {
  if [ -n "${IDEMSTREAM_TEST_KAFKA:-}" ]; then
    echo "using the Kafka broker at $IDEMSTREAM_TEST_KAFKA" >&2
    return
  fi
  local kafka_sh addr
  kafka_sh="$(dirname "${BASH_SOURCE[0]}")/kafka.sh"
  # Set first: stop_kafka then stops a broker that an interrupted `up` left.
  started_kafka=1
  addr=$(IDEMSTREAM_TESTENV_DIR="$state_dir" "$kafka_sh" up) || return 1
  export IDEMSTREAM_TEST_KAFKA="$addr"
  IDEMSTREAM_TESTENV_DIR=$(cd "$state_dir" && pwd)
  export IDEMSTREAM_TESTENV_DIR
  # The same broker's SASL listener (PLAIN and SCRAM users of kafka.sh).
  if [ -f "$state_dir/kafka/sasl_addr" ]; then
    IDEMSTREAM_TEST_KAFKA_SASL=$(cat "$state_dir/kafka/sasl_addr")
    export IDEMSTREAM_TEST_KAFKA_SASL
  fi
  # And its TLS listener, with the CA that signed its certificate.
  if [ -f "$state_dir/kafka/tls_addr" ]; then
    IDEMSTREAM_TEST_KAFKA_TLS=$(cat "$state_dir/kafka/tls_addr")
    IDEMSTREAM_TEST_KAFKA_TLS_CA="$IDEMSTREAM_TESTENV_DIR/kafka/tls/ca.crt"
    export IDEMSTREAM_TEST_KAFKA_TLS IDEMSTREAM_TEST_KAFKA_TLS_CA
  fi
}

stop_kafka() {
  if [ -n "${started_kafka:-}" ]; then
    IDEMSTREAM_TESTENV_DIR="$state_dir" "$(dirname "${BASH_SOURCE[0]}")/kafka.sh" stop || true
    started_kafka=
    unset IDEMSTREAM_TEST_KAFKA IDEMSTREAM_TEST_KAFKA_SASL IDEMSTREAM_TEST_KAFKA_TLS IDEMSTREAM_TEST_KAFKA_TLS_CA
  fi
}

# servers_start [names...]: start the named servers (default: all).
servers_start() {
  local names=("$@")
  [ ${#names[@]} -eq 0 ] && names=(redis valkey kafka)
  for name in "${names[@]}"; do
    "start_$name"
  done
}

servers_stop() {
  stop_kafka
  stop_valkey
  stop_redis
}

# choose_servers prints where the tests' servers come from (containers,
# processes or external) for IDEMSTREAM_TEST_SERVERS (default auto), and
# says so in one line on stderr.
choose_servers() {
  local want="${IDEMSTREAM_TEST_SERVERS:-auto}"
  case "$want" in
    auto)
      if docker_answers; then
        echo "servers: containers (IDEMSTREAM_TEST_SERVERS=auto, Docker answers at ${DOCKER_HOST:-the default socket}; images ${IDEMSTREAM_REDIS_IMAGE:-redis:7}, ${IDEMSTREAM_KAFKA_IMAGE:-apache/kafka:4.4.0})" >&2
        echo containers
      else
        echo "servers: local processes (IDEMSTREAM_TEST_SERVERS=auto, no Docker daemon answers)" >&2
        echo processes
      fi
      ;;
    containers)
      if ! docker_answers; then
        echo "IDEMSTREAM_TEST_SERVERS=containers, but no Docker daemon answers (DOCKER_HOST=${DOCKER_HOST:-unset})" >&2
        return 1
      fi
      echo "servers: containers (IDEMSTREAM_TEST_SERVERS=containers)" >&2
      echo containers
      ;;
    processes | external)
      echo "servers: $want (IDEMSTREAM_TEST_SERVERS=$want)" >&2
      echo "$want"
      ;;
    *)
      echo "IDEMSTREAM_TEST_SERVERS=$want is none of auto, containers, processes, external" >&2
      return 1
      ;;
  esac
}

docker_answers() {
  command -v docker >/dev/null && timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

# remove_leftover_containers removes the test containers of this machine
# whose test binary is gone (labels set by internal/testenv), and any
# network but host, none and bridge that a run may have left.
remove_leftover_containers() {
  docker_answers || return 0
  local host id pid
  host=$(hostname)
  for id in $(docker ps -aq --filter label=org.idemstream.testenv --filter "label=org.idemstream.testenv.host=$host"); do
    pid=$(docker inspect --format '{{index .Config.Labels "org.idemstream.testenv.pid"}}' "$id" 2>/dev/null) || continue
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      echo "removing container $id that test process $pid left" >&2
      docker rm -f -v "$id" >/dev/null || true
    fi
  done
  if docker network inspect reaper_default >/dev/null 2>&1; then
    echo "removing network reaper_default" >&2
    docker network rm reaper_default >/dev/null || true
  fi
}
