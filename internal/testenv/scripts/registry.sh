#!/usr/bin/env bash
# A real Confluent-compatible schema registry for the integration tests:
# Apicurio Registry (its Confluent API under /apis/ccompat/v7), the built
# application that Maven fetches from Maven Central
# (internal/testenv/registry/pom.xml), run with the machine's Java 17.
#
#   registry.sh fetch         only install it (once); prints its directory
#   registry.sh up [PORT]     a fresh registry: empty database, PORT or a
#                             free port; waits until it answers; prints its URL
#   registry.sh start [PORT]  start it again with the same database (and the
#                             port of the last start unless PORT is given)
#   registry.sh stop          SIGTERM and wait (SIGKILL after 30s); idempotent
#   registry.sh status        "running URL pid N" (exit 0) or "stopped" (exit 3)
#   registry.sh url           the URL of the last start
#   registry.sh log [N]       the last N (default 100) lines of its log
#
# The URL is the base of the Confluent API: http://127.0.0.1:PORT/apis/ccompat/v7.
# Schemas live in an H2 database file (no other server), so they and their
# ids survive stop and start.
#
# The installation lives in $IDEMSTREAM_TESTENV_DIR (default: $PWD/.testenv):
#   registry/VERSION/    the runner jar and its lib/, reused by every later run
# and one registry's state in $IDEMSTREAM_REGISTRY_DIR (default:
# $IDEMSTREAM_TESTENV_DIR/registry/run): data/ (the database), registry.log,
# registry.pid, port.
# IDEMSTREAM_REGISTRY_VERSION picks the version (default: default_version);
# IDEMSTREAM_REGISTRY_START_TIMEOUT the seconds to wait for it to answer;
# IDEMSTREAM_REGISTRY_OWNER a pid whose exit stops the registry (the test
# binary that started it: no registry outlives a killed test run).
set -euo pipefail

# The newest 3.x whose classes run on Java 17 (3.1 and later need Java 21).
default_version=3.0.9
version="${IDEMSTREAM_REGISTRY_VERSION:-$default_version}"
start_timeout="${IDEMSTREAM_REGISTRY_START_TIMEOUT:-90}"
stop_timeout=30

scripts_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pom="$scripts_dir/../registry/pom.xml"
state_dir="${IDEMSTREAM_TESTENV_DIR:-$PWD/.testenv}"
mkdir -p "$state_dir/registry"
state_dir=$(cd "$state_dir" && pwd)
install_root="$state_dir/registry"
app="$install_root/$version"
dir="${IDEMSTREAM_REGISTRY_DIR:-$install_root/run}"

die() {
  echo "registry.sh: $*" >&2
  exit 1
}

java_bin() {
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
    echo "$JAVA_HOME/bin/java"
  elif command -v java >/dev/null; then
    command -v java
  else
    die "no java found: Apicurio Registry $version needs Java 17 or later (apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
  fi
}

check_java() {
  local java major
  java=$(java_bin)
  major=$("$java" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}' | awk -F. '{print ($1 == "1") ? $2 : $1}')
  if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    die "Apicurio Registry $version needs Java 17 or later; $java is ${major:-of an unknown version} (set JAVA_HOME)"
  fi
}

# ensure_app unpacks the registry once per version (and pom) into
# registry/VERSION; later runs ask nothing of Maven.
ensure_app() {
  local stamp want
  want="$version $(sha256sum "$pom" | cut -d' ' -f1)"
  stamp="$app/.complete"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return
  fi
  command -v mvn >/dev/null || die "mvn not found: it fetches the registry (apt-get install maven)"
  (
    # One download at a time per state directory.
    flock 9
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
      exit 0
    fi
    echo "fetching Apicurio Registry $version from Maven Central (once; cached in $app)" >&2
    rm -rf "$app.tmp"
    if ! mvn -B -q -Dstyle.color=never -f "$pom" dependency:unpack \
      -Dregistry.version="$version" -Dregistry.dir="$app.tmp" >"$install_root/mvn-$version.log" 2>&1; then
      echo "registry.sh: mvn could not fetch Apicurio Registry $version; the end of its output:" >&2
      tail -n 40 "$install_root/mvn-$version.log" >&2
      exit 1
    fi
    [ -f "$app.tmp/apicurio-registry-app-$version-runner.jar" ] ||
      die "mvn ran but $app.tmp has no apicurio-registry-app-$version-runner.jar"
    rm -rf "$app"
    mv "$app.tmp" "$app"
    echo "$want" >"$stamp"
  ) 9>"$install_root/.lock"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

url() {
  [ -f "$dir/port" ] || die "no registry was started in $dir"
  echo "http://127.0.0.1:$(cat "$dir/port")/apis/ccompat/v7"
}

pid_of() { cat "$dir/registry.pid" 2>/dev/null || true; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

running() { alive "$(pid_of)"; }

# answers: GET /subjects is 200 once the storage is ready.
answers() {
  python3 - "$1" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/subjects", timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
}

log_tail() {
  echo "---- the last $1 lines of $dir/registry.log" >&2
  tail -n "$1" "$dir/registry.log" >&2 || true
}

# launch starts java in the background on $dir/port and waits until the
# Confluent API answers.
launch() {
  local java started pid port
  java=$(java_bin)
  port=$(cat "$dir/port")
  mkdir -p "$dir/data" "$dir/tmp"
  started=$(date +%s.%N)
  echo "==== start $(date -Is) port $port" >>"$dir/registry.log"
  # Serial GC and a capped heap: a test registry holds a few schemas, and
  # the machine runs Kafka and the tests beside it.
  (cd "$dir" && exec nohup "$java" -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -XX:+ExitOnOutOfMemoryError -Djava.io.tmpdir="$dir/tmp" \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
    -Dapicurio.storage.kind=sql -Dapicurio.storage.sql.kind=h2 \
    -Dapicurio.datasource.url="jdbc:h2:file:$dir/data/registry" \
    -Dapicurio.import.work-dir="$dir/tmp" -Dapicurio.storage.snapshot.location="$dir/tmp" \
    -jar "$app/apicurio-registry-app-$version-runner.jar" >>"$dir/registry.log" 2>&1 </dev/null) &
  pid=$!
  echo "$pid" >"$dir/registry.pid"
  watch_owner "$pid"
  local deadline=$(($(date +%s) + start_timeout))
  while ! answers "$(url)" 2>/dev/null; do
    if ! alive "$pid"; then
      echo "registry.sh: the registry (pid $pid) exited while starting" >&2
      log_tail 40
      return 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "registry.sh: the registry on $(url) did not answer within ${start_timeout}s" >&2
      log_tail 40
      do_stop >/dev/null 2>&1 || true
      return 1
    fi
    sleep 0.1
  done
  echo "apicurio registry $version (pid $pid) on $(url), up in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s" >&2
}

# watch_owner stops the registry when IDEMSTREAM_REGISTRY_OWNER exits, so
# that a test binary killed before its cleanup leaves no registry behind.
watch_owner() {
  local pid="$1" owner="${IDEMSTREAM_REGISTRY_OWNER:-}"
  [ -n "$owner" ] || return 0
  (
    while alive "$owner" && alive "$pid"; do sleep 1; done
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
  ) </dev/null >/dev/null 2>&1 &
}

# start PORT|"" FRESH: FRESH empties the database first.
do_start() {
  local port="$1" fresh="$2"
  check_java
  ensure_app
  if running; then
    if [ -z "$port" ] || [ "$port" = "$(cat "$dir/port")" ]; then
      [ "$fresh" = 1 ] || {
        url
        return
      }
    fi
    do_stop >/dev/null 2>&1
  fi
  mkdir -p "$dir"
  if [ "$fresh" = 1 ]; then
    rm -rf "$dir/data" "$dir/tmp"
  fi
  if [ -n "$port" ]; then
    echo "$port" >"$dir/port"
  elif [ ! -f "$dir/port" ]; then
    free_port >"$dir/port"
  fi
  launch
  url
}

do_stop() {
  local pid
  pid=$(pid_of)
  if ! alive "$pid"; then
    rm -f "$dir/registry.pid"
    echo "registry: not running" >&2
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$(($(date +%s) + stop_timeout))
  while alive "$pid"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "registry.sh: the registry (pid $pid) did not stop within ${stop_timeout}s of SIGTERM: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      while alive "$pid"; do sleep 0.05; done
      break
    fi
    sleep 0.05
  done
  rm -f "$dir/registry.pid"
  echo "registry: stopped (pid $pid)" >&2
}

case "${1:-}" in
  fetch)
    check_java
    ensure_app
    echo "$app"
    ;;
  up) do_start "${2:-}" 1 ;;
  start) do_start "${2:-}" 0 ;;
  stop) do_stop ;;
  status)
    if running; then
      echo "running $(url) pid $(pid_of)"
    else
      echo stopped
      exit 3
    fi
    ;;
  url) url ;;
  log) log_tail "${2:-100}" 2>&1 ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    echo "default_version: $default_version" >&2
    exit 2
    ;;
esac
