#!/usr/bin/env bash
# streams.sh runs the Kafka Streams peer of `make load` (Dedup.java): it
# fetches kafka-streams and its dependencies from Maven Central once,
# compiles Dedup.java with javac once per change of the source, and then
# execs the JVM with the arguments given (see Dedup.java), so that SIGTERM
# reaches it; `streams.sh prepare` only fetches and compiles. State (jars, classes) under $IDEMSTREAM_TESTENV_DIR/streams,
# default .testenv/streams at the module root.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
state="${IDEMSTREAM_TESTENV_DIR:-$root/.testenv}/streams"
mkdir -p "$state"
die() { echo "streams.sh: $*" >&2; exit 1; }
command -v javac >/dev/null || die "javac not found (apt-get install default-jdk-headless)"

want="$(cat "$here/pom.xml" "$here/Dedup.java" | sha256sum | cut -d' ' -f1)"
(
  flock 9
  if [ "$(cat "$state/.complete" 2>/dev/null)" != "$want" ]; then
    command -v mvn >/dev/null || die "mvn not found: it fetches the Kafka Streams jars (apt-get install maven)"
    echo "fetching kafka-streams from Maven Central and compiling Dedup.java (once; cached in $state)" >&2
    rm -rf "$state/jars" "$state/classes"
    if ! mvn -B -q -Dstyle.color=never -f "$here/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$state/jars" >"$state/mvn.log" 2>&1; then
      tail -n 40 "$state/mvn.log" >&2
      die "mvn could not fetch the jars"
    fi
    mkdir -p "$state/classes"
    javac -d "$state/classes" -cp "$state/jars/*" "$here/Dedup.java"
    echo "$want" >"$state/.complete"
  fi
) 9>"$state/.lock"
[ "${1:-}" = prepare ] && exit 0
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
exec "$java" -Xms512m -Xmx1g -XX:+UseG1GC -Djava.io.tmpdir="$state" -cp "$state/classes:$state/jars/*" Dedup "$@"
