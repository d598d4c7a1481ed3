#!/usr/bin/env bash
# Builds the three container images of the tests' container path locally,
# for machines whose Docker daemon reaches no image registry: a Debian root
# file system made by debootstrap from Debian's packages (redis-server;
# valkey-server, from trixie, the first Debian with Valkey 8.1 and its
# SET … IFEQ; or a headless JRE plus Kafka's jars, which Maven fetches from
# Maven Central through kafka.sh), imported with `docker import` and
# tagged. An image that exists already is reused.
#
#   images.sh build   build what is missing; prints the three variables the
#                     tests read, IDEMSTREAM_REDIS_IMAGE=...,
#                     IDEMSTREAM_VALKEY_IMAGE=... and IDEMSTREAM_KAFKA_IMAGE=...
#   images.sh names   print those three lines only
#   images.sh rm      remove the three images
#
# The images are laid out like the official ones as far as the tests use
# them: redis-server and redis-cli on PATH and /data; Kafka's jars in
# /opt/kafka/libs and java on PATH. On a machine that reaches a registry
# the tests use the official redis and apache/kafka images instead, with no
# build at all. Needs root (debootstrap, chroot) and a daemon (DOCKER_HOST).
# IDEMSTREAM_KAFKA_VERSION picks Kafka's version (as for kafka.sh).
set -euo pipefail

scripts_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
state_dir="${IDEMSTREAM_TESTENV_DIR:-$PWD/.testenv}"
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)
work="$state_dir/images"
suite=bookworm
mirror="${IDEMSTREAM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
kafka_version="${IDEMSTREAM_KAFKA_VERSION:-$(sed -n 's/^default_version=//p' "$scripts_dir/kafka.sh")}"
redis_image="${IDEMSTREAM_REDIS_IMAGE:-idemstream-testenv/redis:$suite}"
valkey_suite=trixie
valkey_image="${IDEMSTREAM_VALKEY_IMAGE:-idemstream-testenv/valkey:$valkey_suite}"
kafka_image="${IDEMSTREAM_KAFKA_IMAGE:-idemstream-testenv/kafka:$kafka_version}"

die() {
  echo "images.sh: $*" >&2
  exit 1
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

have_image() {
  docker image inspect "$1" >/dev/null 2>&1
}

ensure_debootstrap() {
  command -v debootstrap >/dev/null && return
  echo "installing debootstrap from Debian's packages" >&2
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

# rootfs NAME PACKAGES [SUITE]: a minimal Debian (bookworm unless SUITE) in
# $work/NAME with PACKAGES.
rootfs() {
  local name="$1" packages="$2" root="$work/$1" suite="${3:-$suite}"
  ensure_debootstrap
  mkdir -p "$work/cache"
  as_root rm -rf "$root"
  echo "debootstrap $suite ($packages) into $root" >&2
  if ! as_root debootstrap --variant=minbase --include="$packages" --cache-dir="$work/cache" \
    "$suite" "$root" "$mirror" >"$work/$name.log" 2>&1; then
    tail -n 30 "$work/$name.log" >&2
    die "debootstrap of $name failed (log: $work/$name.log)"
  fi
  # Nothing of the package manager's caches goes into the image.
  as_root rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"* "$root/usr/share/doc" "$root/usr/share/man"
}

# import NAME IMAGE: the root file system of NAME as IMAGE.
import() {
  local root="$work/$1" image="$2"
  as_root tar -C "$root" -c . | docker import --change 'WORKDIR /data' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$image" >/dev/null
  as_root rm -rf "$root"
  echo "built $image ($(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}'))" >&2
}

build_redis() {
  if have_image "$redis_image"; then
    echo "reusing $redis_image" >&2
    return
  fi
  local started=$SECONDS
  rootfs redis redis-server,redis-tools
  as_root mkdir -p "$work/redis/data"
  import redis "$redis_image"
  echo "redis image: $((SECONDS - started))s" >&2
}

build_valkey() {
  if have_image "$valkey_image"; then
    echo "reusing $valkey_image" >&2
    return
  fi
  local started=$SECONDS
  rootfs valkey valkey-server,valkey-tools "$valkey_suite"
  as_root mkdir -p "$work/valkey/data"
  import valkey "$valkey_image"
  echo "valkey image: $((SECONDS - started))s" >&2
}

build_kafka() {
  if have_image "$kafka_image"; then
    echo "reusing $kafka_image" >&2
    return
  fi
  local started=$SECONDS libs
  libs=$(IDEMSTREAM_TESTENV_DIR="$state_dir" IDEMSTREAM_KAFKA_VERSION="$kafka_version" "$scripts_dir/kafka.sh" fetch)
  [ -f "$libs/kafka_2.13-$kafka_version.jar" ] || die "kafka.sh fetch gave $libs without kafka_2.13-$kafka_version.jar"
  rootfs kafka openjdk-17-jre-headless
  as_root mkdir -p "$work/kafka/opt/kafka/libs" "$work/kafka/data"
  as_root cp "$libs"/*.jar "$work/kafka/opt/kafka/libs/"
  import kafka "$kafka_image"
  echo "kafka image: $((SECONDS - started))s" >&2
}

names() {
  echo "IDEMSTREAM_REDIS_IMAGE=$redis_image"
  echo "IDEMSTREAM_VALKEY_IMAGE=$valkey_image"
  echo "IDEMSTREAM_KAFKA_IMAGE=$kafka_image"
}

case "${1:-}" in
  build)
    docker version >/dev/null 2>&1 || die "no Docker daemon answers (DOCKER_HOST=${DOCKER_HOST:-unset}); dockerd.sh start gives one"
    mkdir -p "$work"
    (
      # One build at a time per state directory.
      flock 9
      build_redis
      build_valkey
      build_kafka
    ) 9>"$work/.lock"
    names
    ;;
  names) names ;;
  rm) docker image rm "$redis_image" "$valkey_image" "$kafka_image" >/dev/null 2>&1 || true ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
