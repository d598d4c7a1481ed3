package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/internal/testenv"
)

// The command line behaves as kcat, rpk and the flag package's users
// expect: help on stdout with 0, usage errors on stderr with 2, a bad
// value names the flag and what it wants, a missing file is bad usage.
func TestCommandLineConventions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // a substring; "" for none expected
		stderr string
	}{
		{"no command", nil, 2, "", "Usage: idemstream COMMAND"},
		{"help", []string{"--help"}, 0, "Usage: idemstream COMMAND", ""},
		{"command help", []string{"hash", "-h"}, 0, "-c, --config", ""},
		{"bad duration", []string{"run", "-c", exampleConfig, "--drain-timeout", "5"}, 2, "", `--drain-timeout: "5": want a duration such as 5s`},
		{"bad number", []string{"run", "-c", exampleConfig, "--batch-size", "many"}, 2, "", `--batch-size: "many": want a whole number`},
		{"unknown flag", []string{"hash", "--nope"}, 2, "", "unknown flag --nope"},
		{"missing value", []string{"hash", "-c"}, 2, "", "-c needs a value"},
		{"missing payload file", []string{"hash", "-c", exampleConfig, "no-such-file.json"}, 2, "", "read no-such-file.json"},
		{"missing config file", []string{"contract", "-c", "no-such.yaml"}, 2, "", "no-such.yaml"},
		{"bad output", []string{"hash", "-c", exampleConfig, "-o", "yaml", "-"}, 2, "", `--output: "yaml": want text or json`},
		{"version flag", []string{"--version"}, 0, "idemstream ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, `{"a":1}`, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			if tc.stdout != "" && !strings.Contains(r.stdout, tc.stdout) {
				t.Errorf("stdout %q, want %q in it", r.stdout, tc.stdout)
			}
			if tc.stdout == "" && r.stdout != "" {
				t.Errorf("stdout %q, want nothing (errors and usage go to stderr)", r.stdout)
			}
			if tc.stderr != "" && !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("stderr %q, want %q in it", r.stderr, tc.stderr)
			}
		})
	}
}

// -o json on the commands that print data, short flags, and each command
// lists only the flags it reads.
func TestOutputFormsAndShortFlags(t *testing.T) {
	payload := `{"coupon_id":12345,"user_id":"u-1024","amount":50,"client_time":"10:00:00"}`
	var h struct{ Fingerprint, Rules string }
	r := runCLI(t, payload, "hash", "-c", exampleConfig, "-o", "json", "-")
	if err := json.Unmarshal([]byte(r.stdout), &h); r.code != 0 || err != nil || !strings.HasPrefix(h.Fingerprint, "sha256:") {
		t.Errorf("hash -o json: %d %v %q", r.code, err, r.stdout)
	}
	dir := t.TempDir()
	a := writeFile(t, dir, "a.json", `{"amount":50,"client_time":"1"}`)
	b := writeFile(t, dir, "b.json", `{"amount":70,"client_time":"2"}`)
	var d struct {
		Same  bool
		Paths []string
	}
	r = runCLI(t, "", "diff", "-c", exampleConfig, "--output", "json", a, b)
	if err := json.Unmarshal([]byte(r.stdout), &d); r.code != 0 || err != nil || d.Same || fmt.Sprint(d.Paths) != "[/amount]" {
		t.Errorf("diff -o json: %d %v %q", r.code, err, r.stdout)
	}
	help := runCLI(t, "", "inspect", "-h").stdout
	for _, absent := range []string{"--brokers", "--group", "--metrics-addr"} {
		if strings.Contains(help, absent) {
			t.Errorf("inspect -h lists %s, which inspect ignores", absent)
		}
	}
	if !strings.Contains(help, "--redis-url") {
		t.Errorf("inspect -h does not list --redis-url")
	}
	if r := runCLI(t, "", "contract", "-c", exampleConfig, "-o", "asyncapi"); r.code != 0 || !strings.Contains(r.stdout, "asyncapi:") {
		t.Errorf("contract -o asyncapi: %d %q", r.code, r.stderr)
	}
}

// Environment variables follow the flags' names, and an error about a
// value from one names it.
func TestEnvironmentFollowsFlagNames(t *testing.T) {
	var out, errOut bytes.Buffer
	env := map[string]string{"IDEMSTREAM_BROKERS": "not-a-broker"}
	code := run(context.Background(), []string{"validate", "-c", exampleConfig}, strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] })
	if code != 2 || !strings.Contains(errOut.String(), "IDEMSTREAM_BROKERS") || !strings.Contains(errOut.String(), "kafka.brokers") {
		t.Errorf("a bad IDEMSTREAM_BROKERS: exit %d, %q; want 2 naming the variable and the field", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	env = map[string]string{"IDEMSTREAM_GROUP": "ops"}
	code = run(context.Background(), []string{"contract", "-c", exampleConfig}, strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] })
	if code != 0 || !strings.Contains(out.String(), "`ops.coupon-claim`") {
		t.Errorf("IDEMSTREAM_GROUP ignored: %d %s", code, errOut.String())
	}
}

// validate runs the configuration checks; with --check-servers also the
// Kafka and Redis checks run makes at start, one line per problem with the
// fix, exit 1 when there is one.
func TestValidate(t *testing.T) {
	if r := runCLI(t, "", "validate", "-c", exampleConfig); r.code != 0 || !strings.Contains(r.stdout, "valid, 1 pipeline(s): coupon-claim") {
		t.Errorf("validate of the example: %d %q %q", r.code, r.stdout, r.stderr)
	}
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.yaml", "pipelines: [{name: p, input: in, output: in, dlq: d}]\n")
	if r := runCLI(t, "", "validate", "-c", bad); r.code != 2 || !strings.Contains(r.stderr, "pipelines[0].output") {
		t.Errorf("validate of a bad file: %d %q", r.code, r.stderr)
	}

	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	run, in, out, _ := pipelineTopics(t, brokers, "validate", 2)
	config := writeRunConfig(t, brokers, redisAddr, run, fmt.Sprintf("{name: p, input: %s, output: %s, dlq: %s.missing}", in, out, run))
	r := runCLI(t, "", "validate", "-c", config, "--check-servers")
	if r.code != 1 || !strings.Contains(r.stdout, "input topic "+in+" has 2 partition(s)") ||
		!strings.Contains(r.stdout, "problem: pipeline p: dlq topic "+run+".missing does not exist: create it") {
		t.Errorf("validate --check-servers: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The test servers keep Redis without persistence: refused, with the fix.
	if !strings.Contains(r.stdout, "problem: redis "+redisAddr+": appendonly is no") {
		t.Errorf("validate --check-servers does not report the Redis settings:\n%s", r.stdout)
	}
}
