#!/usr/bin/env bash
# The tests' independent producer: a small Java program
# (internal/testenv/serde) that writes Confluent-framed Avro and Protobuf
# records with Apache Avro and protobuf-java, whose jars Maven fetches from
# Maven Central; javac and jar build it.
#
#   serde.sh build   build it unless built from the same pom and sources;
#                    prints the classpath for `java -cp CLASSPATH
#                    io.github.idemstream.testenv.serde.Encode ...`
#   serde.sh run ARGS...  build, then run the encoder (stdin to stdout)
#
# The output lives in $IDEMSTREAM_TESTENV_DIR (default: $PWD/.testenv):
#   serde/  encode.jar, lib/ (the jars), classpath, mvn.log
set -euo pipefail

scripts_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$scripts_dir/../serde" && pwd)
state_dir="${IDEMSTREAM_TESTENV_DIR:-$PWD/.testenv}"
mkdir -p "$state_dir"
state_dir=$(cd "$state_dir" && pwd)
out="$state_dir/serde"
main_class=io.github.idemstream.testenv.serde.Encode

die() {
  echo "serde.sh: $*" >&2
  exit 1
}

jdk_tool() {
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/$1" ]; then
    echo "$JAVA_HOME/bin/$1"
  elif command -v "$1" >/dev/null; then
    command -v "$1"
  else
    die "no $1 found: the encoder needs a JDK 17 or later (apt-get install openjdk-17-jdk-headless, or set JAVA_HOME)"
  fi
}

# ensure_built rebuilds when the pom or a source file changed since the
# last build; later runs ask nothing of Maven.
ensure_built() {
  local want stamp javac jar
  want=$( (cd "$src" && find pom.xml src -type f | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -d' ' -f1)
  stamp="$out/.complete"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return
  fi
  javac=$(jdk_tool javac)
  jar=$(jdk_tool jar)
  command -v mvn >/dev/null || die "mvn not found: it fetches Avro and protobuf-java (apt-get install maven)"
  mkdir -p "$state_dir"
  (
    # One build at a time per state directory.
    flock 9
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
      exit 0
    fi
    echo "building the Java encoder (Avro, protobuf-java from Maven Central; once, in $out)" >&2
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/classes"
    if ! mvn -B -q -Dstyle.color=never -f "$src/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$out.tmp/lib" >"$out.tmp/mvn.log" 2>&1; then
      echo "serde.sh: mvn could not fetch the encoder's jars; the end of its output:" >&2
      tail -n 40 "$out.tmp/mvn.log" >&2
      exit 1
    fi
    find "$src/src/main/java" -name '*.java' -print0 |
      xargs -0 "$javac" --release 17 -encoding UTF-8 -nowarn -d "$out.tmp/classes" -cp "$out.tmp/lib/*" ||
      die "javac failed"
    "$jar" --create --file "$out.tmp/encode.jar" -C "$out.tmp/classes" . || die "jar failed"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    echo "$out/encode.jar:$out/lib/*" >"$out/classpath"
    echo "$want" >"$stamp"
  ) 9>"$state_dir/.serde.lock"
}

case "${1:-}" in
  build)
    ensure_built
    cat "$out/classpath"
    ;;
  run)
    shift
    ensure_built
    java=$(jdk_tool java)
    exec "$java" -cp "$(cat "$out/classpath")" "$main_class" "$@"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
