#!/usr/bin/env bash
# A real Apache Kafka broker for the integration tests: one combined KRaft
# broker+controller on 127.0.0.1, run straight from the jars that Maven
# fetches (internal/testenv/kafka/pom.xml) with the machine's Java.
#
#   kafka.sh up       fresh broker: new data, new free ports; prints its address
#   kafka.sh start    start the broker of the last `up` again, with the same
#                     data and ports (after stop or kill); prints its address
#   kafka.sh stop     SIGTERM and wait (SIGKILL after 30s); idempotent
#   kafka.sh kill     SIGKILL: no controlled shutdown
#   kafka.sh status   "running ADDR pid N" (exit 0) or "stopped" (exit 3)
#   kafka.sh addr     the address of the last `up`
#   kafka.sh log [N]  the last N (default 100) lines of the broker's log
#   kafka.sh fetch    only download the jars; prints their directory
#
# The state lives in $IDEMSTREAM_TESTENV_DIR (default: $PWD/.testenv):
#   kafka/             server.properties, data/, server.log, kafka.pid,
#                      broker.port, controller.port, addr, version
#   kafka-libs/VERSION the jars, reused by every later run (and ~/.m2 too)
# IDEMSTREAM_KAFKA_VERSION picks the version (default: default_version);
# IDEMSTREAM_KAFKA_START_TIMEOUT the seconds to wait for it to answer.
set -euo pipefail

default_version=4.4.0
version="${IDEMSTREAM_KAFKA_VERSION:-$default_version}"
start_timeout="${IDEMSTREAM_KAFKA_START_TIMEOUT:-90}"
stop_timeout=30

scripts_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
static_dir=$(cd "$scripts_dir/../kafka" && pwd)
state_dir="${IDEMSTREAM_TESTENV_DIR:-$PWD/.testenv}"
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)
dir="$state_dir/kafka"
libs_root="$state_dir/kafka-libs"

die() {
  echo "kafka.sh: $*" >&2
  exit 1
}

java_bin() {
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
    echo "$JAVA_HOME/bin/java"
  elif command -v java >/dev/null; then
    command -v java
  else
    die "no java found: Kafka $version needs Java 17 or later (apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
  fi
}

check_java() {
  local java major need=17
  java=$(java_bin)
  case "$version" in 3.*) need=11 ;; esac
  major=$("$java" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}' | awk -F. '{print ($1 == "1") ? $2 : $1}')
  if [ -z "$major" ] || [ "$major" -lt "$need" ]; then
    die "Kafka $version needs Java $need or later; $java is ${major:-of an unknown version} (set JAVA_HOME)"
  fi
}

# ensure_libs downloads the broker's jars once per version (and pom), into
# kafka-libs/VERSION; later runs ask nothing of Maven.
ensure_libs() {
  libs="$libs_root/$version"
  local stamp want
  want="$version $(sha256sum "$static_dir/pom.xml" | cut -d' ' -f1)"
  stamp="$libs/.complete"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return
  fi
  command -v mvn >/dev/null || die "mvn not found: it fetches the Kafka jars (apt-get install maven)"
  mkdir -p "$libs_root"
  (
    # One download at a time per state directory.
    flock 9
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
      exit 0
    fi
    echo "fetching Apache Kafka $version from Maven Central (once; cached in $libs)" >&2
    rm -rf "$libs.tmp"
    if ! mvn -B -q -Dstyle.color=never -f "$static_dir/pom.xml" dependency:copy-dependencies \
      -Dkafka.version="$version" -DoutputDirectory="$libs.tmp" >"$libs_root/mvn-$version.log" 2>&1; then
      echo "kafka.sh: mvn could not fetch Kafka $version; the end of its output:" >&2
      tail -n 40 "$libs_root/mvn-$version.log" >&2
      exit 1
    fi
    [ -f "$libs.tmp/kafka_2.13-$version.jar" ] || die "mvn ran but $libs.tmp has no kafka_2.13-$version.jar"
    rm -rf "$libs"
    mv "$libs.tmp" "$libs"
    echo "$want" >"$stamp"
  ) 9>"$libs_root/.lock"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# probe asks the broker at 127.0.0.1:$1 for its metadata (ApiVersions, then
# a Metadata request) and for a group coordinator, and succeeds once the
# metadata lists a broker (the node has registered with its controller and
# serves clients) and a coordinator is found (consumer groups work).
probe() {
  python3 - "$1" <<'PY'
import socket, struct, sys

port = int(sys.argv[1])

def call(sock, key, ver, corr, body=b""):
    client = b"testenv-probe"
    req = struct.pack(">hhih", key, ver, corr, len(client)) + client + body
    sock.sendall(struct.pack(">i", len(req)) + req)
    size = struct.unpack(">i", recv(sock, 4))[0]
    resp = recv(sock, size)
    if struct.unpack(">i", resp[:4])[0] != corr:
        sys.exit("correlation id mismatch")
    return resp[4:]

def recv(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            sys.exit("connection closed")
        buf += chunk
    return buf

try:
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.settimeout(2)
    # ApiVersions v0: every broker answers it.
    r = call(s, 18, 0, 1)
    err, n = struct.unpack(">hi", r[:6])
    if err:
        sys.exit("ApiVersions error %d" % err)
    versions = {}
    for i in range(n):
        k, lo, hi = struct.unpack(">hhh", r[6 + 6 * i:12 + 6 * i])
        versions[k] = (lo, hi)
    lo, hi = versions.get(3, (99, -1))
    ver = max(lo, 4)
    if ver > min(hi, 8):
        # No non-flexible Metadata version to speak: ApiVersions will do.
        sys.exit(0)
    body = struct.pack(">ib", -1, 0)  # all topics, no auto-creation
    if ver >= 8:
        body += struct.pack(">bb", 0, 0)
    r = call(s, 3, ver, 2, body)
    # throttle_time_ms, then the brokers array
    brokers = struct.unpack(">i", r[4:8])[0]
    if brokers == 0:
        sys.exit("no broker registered yet")
    # A group coordinator: the first call creates __consumer_offsets, and
    # the answer is an error until its partition is loaded. Waiting here
    # spares the first consumer group of every test run a retry.
    lo, hi = versions.get(10, (99, -1))
    key = b"idemstream-testenv-probe"
    if lo == 0:
        r = call(s, 10, 0, 3, struct.pack(">h", len(key)) + key)
        err = struct.unpack(">h", r[:2])[0]
    elif lo <= 1 <= hi:
        r = call(s, 10, 1, 3, struct.pack(">h", len(key)) + key + b"\0")
        err = struct.unpack(">h", r[4:6])[0]
    else:
        err = 0
    sys.exit(0 if err == 0 else "FindCoordinator error %d" % err)
except (OSError, struct.error) as e:
    sys.exit(str(e))
PY
}

# alive: process $1 exists and is not a zombie.
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

pid_of() {
  [ -f "$dir/kafka.pid" ] && cat "$dir/kafka.pid"
}

# running: the pid file names a live java running this directory's broker
# (not a zombie, not a reused pid).
running() {
  local pid
  pid=$(pid_of) || return 1
  [ -n "$pid" ] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $dir/server.properties"
}

addr() {
  [ -f "$dir/addr" ] || die "no broker was set up in $dir (run: kafka.sh up)"
  cat "$dir/addr"
}

log_tail() {
  local n="${1:-100}"
  if [ -f "$dir/server.log" ]; then
    echo "---- last $n lines of $dir/server.log" >&2
    tail -n "$n" "$dir/server.log" >&2
    echo "----" >&2
  fi
}

java_opts() {
  echo -Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$dir/log4j2.properties" -Dkafka.logs.dir="$dir/logs"
}

# launch runs the broker of $dir in the background and waits until it
# answers; on failure it prints the log's tail and leaves nothing running.
launch() {
  local java libs_dir started pid
  java=$(java_bin)
  libs_dir="$libs_root/$(cat "$dir/version")"
  [ -f "$libs_dir/.complete" ] || die "the jars of Kafka $(cat "$dir/version") are missing from $libs_dir"
  started=$(date +%s.%N)
  echo "==== start $(date -Is)" >>"$dir/server.log"
  # shellcheck disable=SC2046
  (cd "$dir" && exec nohup "$java" $(java_opts) -cp "$libs_dir/*" kafka.Kafka "$dir/server.properties" \
    >>"$dir/server.log" 2>&1 </dev/null) &
  pid=$!
  echo "$pid" >"$dir/kafka.pid"
  local deadline=$(($(date +%s) + start_timeout))
  while :; do
    if ! alive "$pid"; then
      echo "kafka.sh: the broker (pid $pid) exited while starting" >&2
      log_tail 60
      return 1
    fi
    if probe "$(cat "$dir/broker.port")" 2>/dev/null; then
      break
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "kafka.sh: the broker on $(addr) did not answer a Metadata request within ${start_timeout}s" >&2
      log_tail 60
      do_stop >/dev/null 2>&1 || true
      return 1
    fi
    sleep 0.2
  done
  echo "kafka $(cat "$dir/version") (KRaft broker+controller, pid $pid) on $(addr), up in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s" >&2
}

# make_certs makes a throwaway CA and a certificate for 127.0.0.1 signed by
# it, for the TLS listener: server.pem (PKCS#8 key and chain) for Kafka,
# ca.crt for the clients.
make_certs() {
  local tls="$1"
  mkdir -p "$tls"
  (
    cd "$tls" &&
      openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=idemstream test CA" &&
      openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" &&
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >san.ext &&
      openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 3650 -extfile san.ext &&
      openssl pkcs8 -topk8 -nocrypt -in server.key -out server.p8 &&
      cat server.p8 server.crt ca.crt >server.pem
  ) >"$tls/openssl.log" 2>&1 || {
    echo "kafka.sh: making the test certificates failed:" >&2
    cat "$tls/openssl.log" >&2
    return 1
  }
}

# up sets up a new broker in $dir: new ports, an empty formatted data
# directory, and starts it.
do_up() {
  check_java
  ensure_libs
  do_stop >/dev/null 2>&1 || true
  local attempt
  for attempt in 1 2 3; do
    rm -rf "$dir"
    mkdir -p "$dir/data" "$dir/logs"
    local bport cport sport
    bport=$(free_port)
    cport=$(free_port)
    while [ "$cport" = "$bport" ]; do cport=$(free_port); done
    sport=$(free_port)
    while [ "$sport" = "$bport" ] || [ "$sport" = "$cport" ]; do sport=$(free_port); done
    local tport
    tport=$(free_port)
    while [ "$tport" = "$bport" ] || [ "$tport" = "$cport" ] || [ "$tport" = "$sport" ]; do tport=$(free_port); done
    make_certs "$dir/tls" || return 1
    echo "127.0.0.1:$tport" >"$dir/tls_addr"
    echo "$bport" >"$dir/broker.port"
    echo "$cport" >"$dir/controller.port"
    echo "127.0.0.1:$bport" >"$dir/addr"
    echo "127.0.0.1:$sport" >"$dir/sasl_addr"
    echo "$version" >"$dir/version"
    sed -e "s|@BROKER_PORT@|$bport|g" -e "s|@CONTROLLER_PORT@|$cport|g" -e "s|@SASL_PORT@|$sport|g" -e "s|@SSL_PORT@|$tport|g" -e "s|@TLS_DIR@|$dir/tls|g" -e "s|@DATA_DIR@|$dir/data|g" \
      "$static_dir/server.properties" >"$dir/server.properties"
    cp "$static_dir/log4j2.properties" "$dir/log4j2.properties"
    local cluster_id
    cluster_id=$(python3 -c 'import base64,os
while True:
    s = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
    if not s.startswith("-"): print(s); break')
    # shellcheck disable=SC2046
    if ! "$(java_bin)" $(java_opts) -cp "$libs/*" kafka.tools.StorageTool format --ignore-formatted \
      -t "$cluster_id" -c "$dir/server.properties" \
      --add-scram 'SCRAM-SHA-256=[name=idemstream,password=idemstream-test-secret]' \
      --add-scram 'SCRAM-SHA-512=[name=idemstream,password=idemstream-test-secret]' >"$dir/format.log" 2>&1; then
      echo "kafka.sh: formatting $dir/data failed:" >&2
      cat "$dir/format.log" >&2
      return 1
    fi
    if launch; then
      addr
      return 0
    fi
    # Another process took a port between free_port and the bind: new ports.
    if grep -q 'Address already in use' "$dir/server.log" && [ "$attempt" -lt 3 ]; then
      echo "kafka.sh: a port was taken; trying new ones" >&2
      continue
    fi
    return 1
  done
}

do_start() {
  if [ ! -f "$dir/server.properties" ]; then
    do_up
    return
  fi
  if running; then
    addr
    return
  fi
  check_java
  launch
  addr
}

do_stop() {
  local pid
  if ! running; then
    rm -f "$dir/kafka.pid"
    echo "kafka: not running" >&2
    return 0
  fi
  pid=$(pid_of)
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$(($(date +%s) + stop_timeout))
  while running; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "kafka.sh: the broker (pid $pid) did not stop within ${stop_timeout}s of SIGTERM: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  # SIGKILL is final, but not instant: wait for the process to be gone.
  while running; do sleep 0.05; done
  rm -f "$dir/kafka.pid"
  echo "kafka: stopped (pid $pid)" >&2
}

do_kill() {
  local pid
  if running; then
    pid=$(pid_of)
    kill -KILL "$pid" 2>/dev/null || true
    while running; do sleep 0.05; done
    echo "kafka: killed (pid $pid)" >&2
  fi
  rm -f "$dir/kafka.pid"
}

# kafka-cluster.sh sources this file for its helpers (java, jars, probe).
if [ -n "${KAFKA_SH_LIBRARY:-}" ]; then
  return 0
fi

case "${1:-}" in
  up) do_up ;;
  start) do_start ;;
  stop) do_stop ;;
  kill) do_kill ;;
  status)
    if running; then
      echo "running $(addr) pid $(pid_of)"
    else
      echo stopped
      exit 3
    fi
    ;;
  addr) addr ;;
  log) log_tail "${2:-100}" 2>&1 ;;
  fetch)
    check_java
    ensure_libs
    echo "$libs"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    echo "default_version: $default_version" >&2
    exit 2
    ;;
esac
