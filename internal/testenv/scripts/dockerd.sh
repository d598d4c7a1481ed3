#!/usr/bin/env bash
# A private Docker daemon for the container path of the tests, on machines
# where no daemon runs (CI). It creates no network interface and touches no
# firewall: no bridge (--bridge=none), no iptables, no masquerading, so
# containers can only use the host's network (which is how testenv runs
# them, listening on 127.0.0.1).
#
#   dockerd.sh start    start the daemon (idempotent); prints DOCKER_HOST
#   dockerd.sh stop     stop it (SIGTERM, SIGKILL after 30s) and remove
#                       every container it still has
#   dockerd.sh host     print DOCKER_HOST=unix://SOCK for this daemon
#
# Its state lives in $IDEMSTREAM_TESTENV_DIR/docker (default: $PWD/.testenv):
# data-root (images, kept between runs), exec-root, docker.sock, dockerd.pid.
# Installs Debian's docker.io when dockerd is missing.
set -euo pipefail

state_dir="${IDEMSTREAM_TESTENV_DIR:-$PWD/.testenv}"
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)
dir="$state_dir/docker"
sock="$dir/docker.sock"
# The exec root holds unix sockets: keep its path short (108 bytes).
exec_root="/run/idemstream-docker-$(printf '%s' "$dir" | sha256sum | cut -c1-12)"

die() {
  echo "dockerd.sh: $*" >&2
  exit 1
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

ensure_installed() {
  if command -v dockerd >/dev/null && command -v docker >/dev/null; then
    return
  fi
  echo "installing docker.io from Debian's packages" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends docker.io >/dev/null
}

running() {
  [ -f "$dir/dockerd.pid" ] && kill -0 "$(cat "$dir/dockerd.pid")" 2>/dev/null
}

answers() {
  DOCKER_HOST="unix://$sock" timeout 5 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

# check_networks removes any network but host and none: a bridge would have
# an address in a private range, which must never exist on these machines.
check_networks() {
  local n
  for n in $(DOCKER_HOST="unix://$sock" docker network ls --format '{{.Name}}'); do
    case "$n" in
      host | none) ;;
      *)
        echo "dockerd.sh: removing network $n (only host and none may exist)" >&2
        DOCKER_HOST="unix://$sock" docker network rm "$n" >/dev/null || true
        ;;
    esac
  done
}

do_start() {
  ensure_installed
  mkdir -p "$dir/data"
  if running && answers; then
    check_networks
    echo "DOCKER_HOST=unix://$sock"
    return
  fi
  as_root mkdir -p "$exec_root"
  rm -f "$sock" "$dir/dockerd.pid"
  echo "==== start $(date -Is)" >>"$dir/dockerd.log"
  # containerd comes with docker.io; dockerd starts its own.
  as_root nohup dockerd \
    --bridge=none --iptables=false --ip-masq=false \
    --data-root "$dir/data" --exec-root "$exec_root" \
    -H "unix://$sock" --pidfile "$dir/dockerd.pid" \
    >>"$dir/dockerd.log" 2>&1 </dev/null &
  local deadline=$(($(date +%s) + 60))
  until answers; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      tail -n 30 "$dir/dockerd.log" >&2
      die "dockerd did not answer on $sock within 60s"
    fi
    sleep 0.2
  done
  check_networks
  echo "dockerd $(DOCKER_HOST="unix://$sock" docker version --format '{{.Server.Version}}') on unix://$sock (no bridge, host network only)" >&2
  echo "DOCKER_HOST=unix://$sock"
}

do_stop() {
  if ! running; then
    return 0
  fi
  local pid
  pid=$(cat "$dir/dockerd.pid")
  if answers; then
    local ids
    ids=$(DOCKER_HOST="unix://$sock" docker ps -aq)
    if [ -n "$ids" ]; then
      echo "dockerd.sh: removing containers left behind: $ids" >&2
      # shellcheck disable=SC2086
      DOCKER_HOST="unix://$sock" docker rm -f $ids >/dev/null || true
    fi
    check_networks
  fi
  as_root kill -TERM "$pid" 2>/dev/null || true
  local deadline=$(($(date +%s) + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      as_root kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
  rm -f "$dir/dockerd.pid"
  # The daemon keeps a reference to the host's network namespace there:
  # unmount it (the namespace itself is untouched), then remove the rest.
  local ns
  for ns in "$exec_root"/netns/*; do
    [ -e "$ns" ] && as_root umount "$ns" 2>/dev/null || true
  done
  as_root rm -rf --one-file-system "$exec_root" || true
  echo "dockerd stopped (pid $pid)" >&2
}

case "${1:-}" in
  start) do_start ;;
  stop) do_stop ;;
  host) echo "DOCKER_HOST=unix://$sock" ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
