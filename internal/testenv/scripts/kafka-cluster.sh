#!/usr/bin/env bash
# A three-node Apache Kafka cluster on loopback for the tests that need real
# replication (the chaos test): three combined KRaft broker+controller
# nodes, replication factor 3 for every topic, min.insync.replicas=2, the
# default replica.lag.time.max.ms (kafka/cluster.properties). It runs from
# the same jars as kafka.sh (whose helpers it uses); the single broker of
# kafka.sh stays for the fast tests.
#
#   kafka-cluster.sh up          fresh cluster: new data, new free ports;
#                                prints the bootstrap list (comma-separated)
#   kafka-cluster.sh down        stop every node (SIGTERM, SIGKILL after 30s)
#   kafka-cluster.sh start ID    start node ID (1, 2 or 3) again with its data
#                                and ports (after stop or kill)
#   kafka-cluster.sh stop ID     SIGTERM node ID and wait (SIGKILL after 30s)
#   kafka-cluster.sh kill ID     SIGKILL node ID: no controlled shutdown
#   kafka-cluster.sh status      "node ID running ADDR pid N" or "node ID stopped ADDR"
#   kafka-cluster.sh addr [ID]   the bootstrap list, or the address of node ID
#   kafka-cluster.sh log ID [N]  the last N (default 100) lines of a node's log
#
# The state lives in $IDEMSTREAM_TESTENV_DIR/kafka-cluster/node-ID/ (and the
# jars in $IDEMSTREAM_TESTENV_DIR/kafka-libs, shared with kafka.sh). Every
# node has a heap of at most 448 MB.
set -euo pipefail

cluster_scripts_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=kafka.sh
KAFKA_SH_LIBRARY=1 source "$cluster_scripts_dir/kafka.sh"

nodes=(1 2 3)
cluster_dir="$state_dir/kafka-cluster"

node_dir() { echo "$cluster_dir/node-$1"; }

check_id() {
  case "${1:-}" in
    1 | 2 | 3) ;;
    *) die "node id ${1:-(none)}: want 1, 2 or 3" ;;
  esac
}

node_pid() {
  local f
  f="$(node_dir "$1")/kafka.pid"
  [ -f "$f" ] && cat "$f"
}

node_running() {
  local pid d
  d=$(node_dir "$1")
  pid=$(node_pid "$1") || return 1
  [ -n "$pid" ] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $d/server.properties"
}

node_addr() { echo "127.0.0.1:$(cat "$(node_dir "$1")/broker.port")"; }

bootstrap() {
  [ -f "$cluster_dir/addr" ] || die "no cluster was set up in $cluster_dir (run: kafka-cluster.sh up)"
  cat "$cluster_dir/addr"
}

node_log_tail() {
  local f n="${2:-100}"
  f="$(node_dir "$1")/server.log"
  if [ -f "$f" ]; then
    echo "---- last $n lines of $f" >&2
    tail -n "$n" "$f" >&2
    echo "----" >&2
  fi
}

node_java_opts() {
  local d
  d=$(node_dir "$1")
  echo -Xms128m -Xmx448m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -XX:TieredStopAtLevel=1 -Xss512k \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$d/log4j2.properties" -Dkafka.logs.dir="$d/logs"
}

# spawn starts node $1 in the background; it does not wait.
spawn() {
  local d java libs_dir pid
  d=$(node_dir "$1")
  java=$(java_bin)
  libs_dir="$libs_root/$(cat "$cluster_dir/version")"
  [ -f "$libs_dir/.complete" ] || die "the jars of Kafka $(cat "$cluster_dir/version") are missing from $libs_dir"
  echo "==== start $(date -Is)" >>"$d/server.log"
  # shellcheck disable=SC2046
  (cd "$d" && exec nohup "$java" $(node_java_opts "$1") -cp "$libs_dir/*" kafka.Kafka "$d/server.properties" \
    >>"$d/server.log" 2>&1 </dev/null) &
  pid=$!
  echo "$pid" >"$d/kafka.pid"
}

# await waits until node $1 answers Metadata with a registered broker and
# finds a group coordinator (kafka.sh's probe); on failure it prints the
# node's log.
await() {
  local d pid deadline
  d=$(node_dir "$1")
  pid=$(node_pid "$1")
  deadline=$(($(date +%s) + start_timeout))
  while :; do
    if ! alive "$pid"; then
      echo "kafka-cluster.sh: node $1 (pid $pid) exited while starting" >&2
      node_log_tail "$1" 60
      return 1
    fi
    if probe "$(cat "$d/broker.port")" 2>/dev/null; then
      return 0
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "kafka-cluster.sh: node $1 on $(node_addr "$1") did not answer within ${start_timeout}s" >&2
      node_log_tail "$1" 60
      return 1
    fi
    sleep 0.2
  done
}

node_stop() {
  local pid deadline
  if ! node_running "$1"; then
    rm -f "$(node_dir "$1")/kafka.pid"
    return 0
  fi
  pid=$(node_pid "$1")
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$(($(date +%s) + stop_timeout))
  while node_running "$1"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "kafka-cluster.sh: node $1 (pid $pid) did not stop within ${stop_timeout}s of SIGTERM: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  while node_running "$1"; do sleep 0.05; done
  rm -f "$(node_dir "$1")/kafka.pid"
  echo "kafka-cluster: node $1 stopped (pid $pid)" >&2
}

node_kill() {
  local pid
  if node_running "$1"; then
    pid=$(node_pid "$1")
    kill -KILL "$pid" 2>/dev/null || true
    while node_running "$1"; do sleep 0.05; done
    echo "kafka-cluster: node $1 killed (pid $pid)" >&2
  fi
  rm -f "$(node_dir "$1")/kafka.pid"
}

do_down() {
  local id
  [ -d "$cluster_dir" ] || return 0
  # SIGTERM to all at once: a node that waits for its peers to take its
  # partitions over would otherwise wait for a node already gone.
  for id in "${nodes[@]}"; do
    if node_running "$id"; then kill -TERM "$(node_pid "$id")" 2>/dev/null || true; fi
  done
  for id in "${nodes[@]}"; do node_stop "$id"; done
}

cluster_up() {
  check_java
  ensure_libs
  do_down >/dev/null 2>&1 || true
  local attempt id started
  for attempt in 1 2 3; do
    rm -rf "$cluster_dir"
    mkdir -p "$cluster_dir"
    echo "$version" >"$cluster_dir/version"
    # Six distinct free ports: a broker and a controller port per node.
    local ports=() p voters="" addrs=""
    while [ ${#ports[@]} -lt 6 ]; do
      p=$(free_port)
      case " ${ports[*]} " in *" $p "*) continue ;; esac
      ports+=("$p")
    done
    for id in "${nodes[@]}"; do
      [ -n "$voters" ] && voters+=","
      voters+="$id@127.0.0.1:${ports[$((2 * id - 1))]}"
      [ -n "$addrs" ] && addrs+=","
      addrs+="127.0.0.1:${ports[$((2 * id - 2))]}"
    done
    echo "$addrs" >"$cluster_dir/addr"
    local cluster_id
    cluster_id=$(python3 -c 'import base64,os
while True:
    s = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
    if not s.startswith("-"): print(s); break')
    for id in "${nodes[@]}"; do
      local d
      d=$(node_dir "$id")
      mkdir -p "$d/data" "$d/logs"
      echo "${ports[$((2 * id - 2))]}" >"$d/broker.port"
      echo "${ports[$((2 * id - 1))]}" >"$d/controller.port"
      sed -e "s|@NODE_ID@|$id|g" -e "s|@VOTERS@|$voters|g" -e "s|@BROKER_PORT@|${ports[$((2 * id - 2))]}|g" \
        -e "s|@CONTROLLER_PORT@|${ports[$((2 * id - 1))]}|g" -e "s|@DATA_DIR@|$d/data|g" \
        "$static_dir/cluster.properties" >"$d/server.properties"
      cp "$static_dir/log4j2.properties" "$d/log4j2.properties"
      # shellcheck disable=SC2046
      if ! "$(java_bin)" $(node_java_opts "$id") -cp "$libs/*" kafka.tools.StorageTool format --ignore-formatted \
        -t "$cluster_id" -c "$d/server.properties" >"$d/format.log" 2>&1; then
        echo "kafka-cluster.sh: formatting $d/data failed:" >&2
        cat "$d/format.log" >&2
        return 1
      fi
    done
    started=$(date +%s.%N)
    # All three at once: a node serves clients only once the controllers
    # have a quorum, two of three.
    for id in "${nodes[@]}"; do spawn "$id"; done
    local ok=1
    for id in "${nodes[@]}"; do
      if ! await "$id"; then
        ok=
        break
      fi
    done
    if [ -n "$ok" ]; then
      echo "kafka $version cluster (3 KRaft broker+controller nodes, RF 3, min.insync.replicas=2) on $addrs, up in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s" >&2
      bootstrap
      return 0
    fi
    do_down >/dev/null 2>&1 || true
    if grep -qs 'Address already in use' "$cluster_dir"/node-*/server.log && [ "$attempt" -lt 3 ]; then
      echo "kafka-cluster.sh: a port was taken; trying new ones" >&2
      continue
    fi
    return 1
  done
}

node_start() {
  local started
  if node_running "$1"; then
    node_addr "$1"
    return
  fi
  check_java
  started=$(date +%s.%N)
  spawn "$1"
  if ! await "$1"; then
    node_kill "$1"
    return 1
  fi
  echo "kafka-cluster: node $1 on $(node_addr "$1") up again in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s" >&2
  node_addr "$1"
}

case "${1:-}" in
  up) cluster_up ;;
  down) do_down ;;
  start)
    check_id "${2:-}"
    node_start "$2"
    ;;
  stop)
    check_id "${2:-}"
    node_stop "$2"
    ;;
  kill)
    check_id "${2:-}"
    node_kill "$2"
    ;;
  status)
    for id in "${nodes[@]}"; do
      if node_running "$id"; then
        echo "node $id running $(node_addr "$id") pid $(node_pid "$id")"
      else
        echo "node $id stopped $(node_addr "$id")"
      fi
    done
    ;;
  addr)
    if [ -n "${2:-}" ]; then
      check_id "$2"
      node_addr "$2"
    else
      bootstrap
    fi
    ;;
  log)
    check_id "${2:-}"
    node_log_tail "$2" "${3:-100}" 2>&1
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
