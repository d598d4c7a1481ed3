package main

import (
	"strings"
	"testing"
)

// dlq follows the command line's conventions: help on stdout with 0; bad
// usage and bad configuration exit 2, a failure at run time 1, each with
// one line on stderr that names what is wrong and what to do. None of
// these reaches a broker.
func TestDLQCommandLine(t *testing.T) {
	c := exampleConfig
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string // a substring of the one line; "" for none expected
	}{
		{"no subcommand", []string{"dlq"}, 2, "dlq takes a subcommand: summary, show or redrive"},
		{"unknown subcommand", []string{"dlq", "purge"}, 2, `unknown dlq subcommand "purge"`},
		{"no config", []string{"dlq", "summary"}, 2, "-c, --config FILE is required"},
		{"unknown pipeline", []string{"dlq", "summary", "-c", c, "--pipeline", "nope"}, 2, "nope"},
		{"bad from", []string{"dlq", "summary", "-c", c, "--from", "yesterday"}, 2, `--from "yesterday": want earliest, -DURATION`},
		{"summary arguments", []string{"dlq", "summary", "-c", c, "0/1"}, 2, "dlq summary takes no arguments"},
		{"show without position", []string{"dlq", "show", "-c", c}, 2, "dlq show takes one PARTITION/OFFSET"},
		{"show bad position", []string{"dlq", "show", "-c", c, "0/x"}, 2, `"0/x": want PARTITION/OFFSET of coupon.claim.dlq, such as 0/42`},
		{"show other topic", []string{"dlq", "show", "-c", c, "coupon.claim.commands/0/1"}, 2, "is not in the pipeline's dead-letter topic coupon.claim.dlq"},
		{"bad output", []string{"dlq", "show", "-c", c, "-o", "yaml", "0/1"}, 2, `--output: "yaml": want text or json`},
		{"conflicts without force", []string{"dlq", "redrive", "-c", c, "--reason", "conflict"}, 2, "--reason conflict: such dead letters would come straight back to the dead-letter topic; fix the cause, then add --force"},
		{"invalid without force", []string{"dlq", "redrive", "-c", c, "--reason", "handler_failed", "--reason", "malformed_payload"}, 2, "--reason malformed_payload"},
		{"unknown reason", []string{"dlq", "redrive", "-c", c, "--reason", "timeout"}, 2, `--reason "timeout": want one of conflict, missing_key`},
		{"bad key", []string{"dlq", "redrive", "-c", c, "--key", "not-a-uuid"}, 2, `--key "not-a-uuid"`},
		{"bad until", []string{"dlq", "redrive", "-c", c, "--until", "earliest"}, 2, `--until "earliest": want -DURATION before now`},
		{"zero rate", []string{"dlq", "redrive", "-c", c, "--rate", "0"}, 2, "--rate 0: want a number of records a second above 0"},
		{"bad rate", []string{"dlq", "redrive", "-c", c, "--rate", "fast"}, 2, `--rate: "fast": want a number`},
		{"to the dead-letter topic", []string{"dlq", "redrive", "-c", c, "--to", "coupon.claim.dlq"}, 2, "--to coupon.claim.dlq is the dead-letter topic"},
		{"to the output", []string{"dlq", "redrive", "-c", c, "--to", "coupon.claim.results"}, 2, "--to coupon.claim.results is the pipeline's output"},
		{"no broker", []string{"dlq", "summary", "-c", c, "-b", "127.0.0.1:1"}, 1, "coupon.claim.dlq"},
		{"no broker to redrive to", []string{"dlq", "redrive", "-c", c, "-b", "127.0.0.1:1"}, 1, "--to coupon.claim.commands"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, "", tc.args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", r.code, tc.code, r.stderr)
			}
			if !strings.HasPrefix(r.stderr, "idemstream dlq: ") || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("stderr %q, want one line with %q", r.stderr, tc.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}

// Each subcommand's help lists its flags, and only those it reads.
func TestDLQHelp(t *testing.T) {
	for sub, want := range map[string][]string{
		"summary": {"Usage: idemstream dlq summary", "--from", "-o, --output", "-b, --brokers", "--pipeline"},
		"show":    {"Usage: idemstream dlq show", "PARTITION/OFFSET", "-c, --config"},
		"redrive": {"Usage: idemstream dlq redrive", "--reason", "--key", "--until", "--to", "--rate", "(default 100)", "--dry-run", "--force"},
	} {
		r := runCLI(t, "", "dlq", sub, "-h")
		if r.code != 0 || r.stderr != "" {
			t.Errorf("dlq %s -h: exit %d, stderr %q", sub, r.code, r.stderr)
		}
		for _, w := range want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("dlq %s -h lacks %q:\n%s", sub, w, r.stdout)
			}
		}
		for _, absent := range []string{"--redis-url", "--metrics-addr", "--group"} {
			if strings.Contains(r.stdout, absent) {
				t.Errorf("dlq %s -h lists %s, which dlq ignores", sub, absent)
			}
		}
	}
	if r := runCLI(t, "", "dlq", "--help"); r.code != 0 || !strings.Contains(r.stdout, "idemstream dlq redrive") {
		t.Errorf("dlq --help: %d %q", r.code, r.stdout)
	}
}

// A redrive that another pipeline of the configuration would read too is
// bad usage without --force: into the input it shares, --to its input,
// or of two pipelines that share both input and dead-letter topic (their
// dead letters cannot be told apart). With --force, or without another
// reader, the redrive goes on (to a broker that is not there: exit 1).
func TestDLQRedriveIntoAnotherPipelinesInput(t *testing.T) {
	c := writeFile(t, t.TempDir(), "c.yaml", `kafka: {brokers: ["127.0.0.1:1"]}
store: {kind: memory}
pipelines:
  - {name: a, input: shared.in, output: a.out, dlq: a.dlq, key: {format: any}}
  - {name: b, input: shared.in, output: b.out, dlq: b.dlq, key: {format: any}}
  - {name: c, input: c.in, output: c.out, dlq: c.dlq, key: {format: any}}
  - {name: d, input: d.in, output: d.out, dlq: d.dlq, key: {format: any}}
  - {name: e, input: d.in, output: e.out, dlq: d.dlq, key: {format: any}}
`)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"a shared input", []string{"--pipeline", "a"}, 2, "shared.in is also the input of pipeline b, which would run the copies again once it forgets their keys; add --force"},
		{"to another pipeline's input", []string{"--pipeline", "c", "--to", "shared.in"}, 2, "shared.in is also the input of pipeline a"},
		{"a shared input and dead-letter topic", []string{"--pipeline", "d", "--to", "elsewhere"}, 2, "pipeline e shares the input d.in and the dead-letter topic d.dlq: their dead letters cannot be told apart; add --force"},
		{"forced", []string{"--pipeline", "a", "--force"}, 1, "--to shared.in"},
		{"no other reader", []string{"--pipeline", "c"}, 1, "--to c.in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, "", append([]string{"dlq", "redrive", "-c", c}, tc.args...)...)
			if r.code != tc.code || !strings.HasPrefix(r.stderr, "idemstream dlq: ") || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("exit %d, stderr %q; want %d and one line with %q", r.code, r.stderr, tc.code, tc.stderr)
			}
		})
	}
}
