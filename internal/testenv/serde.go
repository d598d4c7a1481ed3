package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The encoder that scripts/serde.sh builds, once per test binary.
var javaEncoder struct {
	once      sync.Once
	java      string
	classpath string
	err       error
}

// JavaAvro encodes each record, in Avro's JSON encoding, with Apache
// Avro's Java library into the Confluent wire format: 0x00, id as 4 bytes
// big-endian, then the Avro binary. The bytes come from code independent
// of this module's, so a Go decoder can be checked against them.
func JavaAvro(t testing.TB, schema string, id int, jsonRecords ...string) [][]byte {
	t.Helper()
	file := filepath.Join(t.TempDir(), "schema.avsc")
	if err := os.WriteFile(file, []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	return runEncoder(t, []string{"avro", file, strconv.Itoa(id)}, jsonRecords)
}

// JavaProtobuf encodes each record, in the protobuf JSON mapping, as the
// message named message (its full name) of descriptorSet (a serialized
// google.protobuf.FileDescriptorSet), with protobuf-java, into the
// Confluent wire format: 0x00, id as 4 bytes big-endian, the message
// indexes (a single 0x00 for [0]), then the message in binary.
func JavaProtobuf(t testing.TB, descriptorSet []byte, message string, id int, indexes []int, jsonRecords ...string) [][]byte {
	t.Helper()
	if len(indexes) == 0 {
		t.Fatal("JavaProtobuf needs the message indexes, [0] for the first message of the file")
	}
	file := filepath.Join(t.TempDir(), "descriptors.pb")
	if err := os.WriteFile(file, descriptorSet, 0o644); err != nil {
		t.Fatal(err)
	}
	idx := make([]string, len(indexes))
	for i, n := range indexes {
		idx[i] = strconv.Itoa(n)
	}
	return runEncoder(t, []string{"protobuf", file, message, strconv.Itoa(id), strings.Join(idx, ",")}, jsonRecords)
}

// runEncoder feeds the records to the encoder one a line and returns the
// bytes of each.
func runEncoder(t testing.TB, args, records []string) [][]byte {
	t.Helper()
	java, classpath := javaEncoderClasspath(t)
	var in bytes.Buffer
	for i, r := range records {
		// One record a line: the encoder reads lines.
		if err := json.Compact(&in, []byte(r)); err != nil {
			t.Fatalf("record %d is not JSON: %v: %s", i, err, r)
		}
		in.WriteByte('\n')
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, java, append([]string{
		"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto",
		"-cp", classpath, "io.github.idemstream.testenv.serde.Encode",
	}, args...)...)
	cmd.Stdin = &in
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("java encoder %s: %v: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	var out [][]byte
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		b, err := hex.DecodeString(sc.Text())
		if err != nil {
			t.Fatalf("java encoder %s wrote %q: %v", args[0], sc.Text(), err)
		}
		out = append(out, b)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) != len(records) {
		t.Fatalf("java encoder %s: %d records in, %d out", args[0], len(records), len(out))
	}
	return out
}

// javaEncoderClasspath builds the encoder once per test binary, and skips
// (or fails, when servers are required) where no JDK or Maven can.
func javaEncoderClasspath(t testing.TB) (java, classpath string) {
	t.Helper()
	e := &javaEncoder
	e.once.Do(func() {
		e.java, e.err = javaBinary()
		if e.err != nil {
			return
		}
		script := filepath.Join(repoDir(), "internal", "testenv", "scripts", "serde.sh")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", script, "build")
		cmd.Env = append(os.Environ(), "IDEMSTREAM_TESTENV_DIR="+sharedTestenvDir())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			e.err = fmt.Errorf("serde.sh build: %w: %s", err, strings.TrimSpace(stderr.String()))
			return
		}
		e.classpath = lastLine(string(out))
	})
	if e.err != nil {
		unavailable(t, "no Java encoder: %v", e.err)
	}
	return e.java, e.classpath
}

// javaBinary is JAVA_HOME's java, else the one on PATH, as the scripts
// choose it.
func javaBinary() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		if bin := filepath.Join(home, "bin", "java"); isExecutable(bin) {
			return bin, nil
		}
	}
	bin, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("no java (apt-get install openjdk-17-jdk-headless, or set JAVA_HOME): %w", err)
	}
	return bin, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
