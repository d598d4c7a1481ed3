package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/internal/audittest"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/schemas"
)

// plantedTopic starts an in-process broker holding the planted topic
// "claims" on three partitions and returns its address.
func plantedTopic(t *testing.T) (string, audittest.Planted) {
	t.Helper()
	client, addrs := testenv.FakeKafka(t, 3, "claims")
	p := audittest.Plant("claims", 3)
	audittest.Produce(t, client, "claims", p.Records)
	return strings.Join(addrs, ","), p
}

func decodeReport(t *testing.T, out string) *audit.Report {
	t.Helper()
	var r audit.Report
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("--output json is not a report: %v\n%s", err, out)
	}
	return &r
}

func TestAuditSuggestIsAcceptedByContract(t *testing.T) {
	brokers, p := plantedTopic(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cfg.yaml")
	r := runCLI(t, "", "audit", "--brokers", brokers, "--topic", "claims", "--max-payload-bytes", "4096",
		"--output", "json", "--suggest", cfgPath)
	if r.code != 0 {
		t.Fatalf("audit exited %d: %s", r.code, r.stderr)
	}
	audittest.Check(t, p, decodeReport(t, r.stdout))

	// the documented members, by name, in the JSON itself.
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"topic", "partitions", "records", "keys", "copies", "invalid", "volatile_candidates", "unordered_candidates",
		"conflicts", "retry_interval", "reused_after_window", "suggested", "decisions"} {
		if _, ok := raw[m]; !ok {
			t.Errorf("JSON output has no %q", m)
		}
	}

	c := runCLI(t, "", "contract", "--config", cfgPath)
	if c.code != 0 {
		t.Fatalf("contract --config of the suggested file exited %d: %s", c.code, c.stderr)
	}
	for _, want := range []string{"/client_time", "/retry_count", "/trace_id", "10m"} {
		if !strings.Contains(c.stdout, want) {
			t.Errorf("contract of the suggested file does not mention %s:\n%s", want, c.stdout)
		}
	}
	cfg, err := schemas.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	sp := cfg.Pipelines[0]
	if sp.Input != "claims" || sp.Semantics != "strict" || sp.Window.D() != 10*time.Minute || sp.ClientMaxRetryInterval.D() != 5*time.Second ||
		strings.Join(sp.Unordered, ",") != "/items" || sp.Key.Format != "uuid" || sp.Key.Name != "Idempotency-Key" {
		t.Errorf("suggested pipeline = %+v", sp)
	}

	// The suggested rules make the retries replays for `hash` too.
	h1 := runCLI(t, `{"amount":50,"client_time":"a","items":[1,2],"retry_count":0,"trace_id":"x"}`, "hash", "--config", cfgPath, "-")
	h2 := runCLI(t, `{"items":[2,1],"amount":50,"client_time":"b","retry_count":3,"trace_id":"y"}`, "hash", "--config", cfgPath, "-")
	if h1.code != 0 || h1.stdout != h2.stdout {
		t.Errorf("a retry under the suggested rules has another fingerprint:\n%s\n%s%s", h1.stdout, h2.stdout, h1.stderr)
	}
}

func TestAuditTextReport(t *testing.T) {
	brokers, _ := plantedTopic(t)
	r := runCLI(t, "", "audit", "--brokers", brokers, "--topic", "claims", "--max-payload-bytes", "4096")
	if r.code != 0 {
		t.Fatalf("audit exited %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{
		"Audit of claims: 541 records on 3 partition(s), 200 keys",
		"Volatile candidates", "/client_time", "/retry_count", "/trace_id",
		"Unordered candidates", "/items", "Conflicts: 10 keys", "/amount",
		"p50 2s", "p99 5s", "max 3h",
		"more than the window (10m) after their previous copy: 2",
		"missing_key", "claims/",
		"idemstream", "raw body", "key only",
		"volatile: [/client_time, /retry_count, /trace_id]",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("no progress line expected off a terminal, stderr: %q", r.stderr)
	}
}

func TestAuditWithConfigDecidesUnderThePipelinesRules(t *testing.T) {
	brokers, p := plantedTopic(t)
	dir := t.TempDir()
	cfg := writeFile(t, dir, "idemstream.yaml", `
kafka:
  brokers: [`+brokers+`]
pipelines:
  - name: claims
    input: claims
    output: claims.results
    dlq: claims.dlq
    key: {from: header, name: Idempotency-Key, format: uuid}
    volatile: [/client_time]
    max_payload_bytes: 4096
`)
	r := runCLI(t, "", "audit", "--config", cfg, "--output", "json", "--suggest", filepath.Join(dir, "next.yaml"))
	if r.code != 0 {
		t.Fatalf("audit exited %d: %s", r.code, r.stderr)
	}
	rep := decodeReport(t, r.stdout)
	if rep.Passes != 1 || !rep.Rules.Configured || rep.Topic != "claims" {
		t.Errorf("passes %d, configured %v, topic %q", rep.Passes, rep.Rules.Configured, rep.Topic)
	}
	var vol []string
	for _, c := range rep.VolatileCandidates {
		vol = append(vol, c.Pointer)
	}
	// /client_time is removed by the pipeline already: not a candidate.
	if strings.Join(vol, " ") != "/retry_count /trace_id" {
		t.Errorf("volatile candidates = %v, want /retry_count /trace_id", vol)
	}
	if got := strings.Join(rep.Suggested.Volatile, " "); got != "/client_time /retry_count /trace_id" {
		t.Errorf("suggested volatile = %s", got)
	}
	// Under the pipeline's rules every retry carries a new retry_count
	// and trace_id: strict makes them conflicts.
	want := audit.Counts{First: 202, Conflict: 319 + 10, Invalid: 10}
	if rep.Decisions.Idemstream != want {
		t.Errorf("idemstream decisions under the pipeline's rules = %+v, want %+v", rep.Decisions.Idemstream, want)
	}
	if rep.Decisions.KeyOnly != p.KeyOnly || rep.Decisions.RawBody != p.RawBody {
		t.Errorf("raw body %+v, key only %+v", rep.Decisions.RawBody, rep.Decisions.KeyOnly)
	}
	if c := runCLI(t, "", "contract", "--config", filepath.Join(dir, "next.yaml")); c.code != 0 {
		t.Errorf("contract of the suggestion exited %d: %s", c.code, c.stderr)
	}
}

func TestAuditUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "--brokers", "127.0.0.1:1"}, "--topic"},
		{[]string{"audit", "--topic", "t"}, "--brokers"},
		{[]string{"audit", "--brokers", "127.0.0.1:1", "--topic", "t", "--key", "cookie:x"}, "--key"},
		{[]string{"audit", "--brokers", "127.0.0.1:1", "--topic", "t", "--key", "field:nope"}, "--key"},
		{[]string{"audit", "--brokers", "127.0.0.1:1", "--topic", "t", "--key-format", "guid"}, "--key-format"},
		{[]string{"audit", "--brokers", "127.0.0.1:1", "--topic", "t", "--from", "yesterday"}, "--from"},
		{[]string{"audit", "--brokers", "127.0.0.1:1", "--topic", "t", "--output", "xml"}, "--output"},
		{[]string{"audit", "--brokers", "127.0.0.1:1", "--topic", "t", "--volatile-share", "2"}, "--volatile-share"},
		{[]string{"audit", "--brokers", "127.0.0.1:1", "--topic", "t", "--pipeline", "p"}, "--pipeline needs --config"},
		{[]string{"audit", "--config", exampleConfig, "--key", "message_key"}, "give one or the other"},
	} {
		r := runCLI(t, "", tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming %s", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func TestAuditUnreachableBrokerIsARuntimeFailure(t *testing.T) {
	r := runCLI(t, "", "audit", "--brokers", testenv.FreeAddr(t), "--topic", "t")
	if r.code != exitFailure || !strings.Contains(r.stderr, "idemstream audit:") {
		t.Errorf("exit %d, stderr %q; want 1 with one line", r.code, r.stderr)
	}
}

// The command against a real Apache Kafka broker: read, suggest, and the
// suggestion accepted by contract.
func TestAuditRealKafka(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.UniqueName(t, "audit-cli")
	testenv.CreateTopics(t, brokers, 3, topic)
	transport := &kafka.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: transport}
	p := audittest.Plant(topic, 3)
	audittest.Produce(t, client, topic, p.Records)

	cfgPath := filepath.Join(t.TempDir(), "cfg.yaml")
	r := runCLI(t, "", "audit", "--brokers", strings.Join(brokers, ","), "--topic", topic, "--max-payload-bytes", "4096",
		"--output", "json", "--suggest", cfgPath)
	if r.code != 0 {
		t.Fatalf("audit exited %d: %s", r.code, r.stderr)
	}
	audittest.Check(t, p, decodeReport(t, r.stdout))
	if c := runCLI(t, "", "contract", "--config", cfgPath); c.code != 0 || !strings.Contains(c.stdout, "/trace_id") {
		t.Errorf("contract of the suggested file exited %d: %s%s", c.code, c.stderr, c.stdout)
	}
}

func TestAuditEmptyTopic(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "empty"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	r := runCLI(t, "", "audit", "--brokers", strings.Join(c.ListenAddrs(), ","), "--topic", "empty", "--output", "json",
		"--suggest", filepath.Join(dir, "cfg.yaml"))
	if r.code != 0 {
		t.Fatalf("audit of an empty topic exited %d: %s", r.code, r.stderr)
	}
	rep := decodeReport(t, r.stdout)
	if rep.Records != 0 || rep.Partitions != 4 || rep.Suggested.Window.D() != 10*time.Minute || rep.Suggested.ClientMaxRetryInterval.D() != 30*time.Second {
		t.Errorf("empty topic: %+v", rep)
	}
	if c := runCLI(t, "", "contract", "--config", filepath.Join(dir, "cfg.yaml")); c.code != 0 {
		t.Errorf("contract of the suggestion for an empty topic exited %d: %s", c.code, c.stderr)
	}
}

func TestAuditKeyFromFieldAndMessageKey(t *testing.T) {
	brokers, p := plantedTopic(t)
	r := runCLI(t, "", "audit", "--brokers", brokers, "--topic", "claims", "--key", "field:/order_id", "--key-format", "regex:o-[0-9]+(-b)?",
		"--max-payload-bytes", "4096", "--output", "json")
	if r.code != 0 {
		t.Fatalf("audit --key field: exited %d: %s", r.code, r.stderr)
	}
	rep := decodeReport(t, r.stdout)
	// Order ids as keys: the 200 orders, the two later orders, the
	// order of the garbage records without a header (one id for three).
	if rep.Keys != 200+2+2 || rep.ReusedAfterWindow.Keys != 0 || rep.Invalid["malformed_payload"] != p.Malformed {
		t.Errorf("field keys: %d keys, %d reused, invalid %v", rep.Keys, rep.ReusedAfterWindow.Keys, rep.Invalid)
	}
	r = runCLI(t, "", "audit", "--brokers", brokers, "--topic", "claims", "--key", "message_key", "--output", "json")
	if r.code != 0 {
		t.Fatalf("audit --key message_key exited %d: %s", r.code, r.stderr)
	}
	if rep := decodeReport(t, r.stdout); rep.Invalid["missing_key"] != p.Records0 || rep.Keys != 0 || rep.Decisions.Idemstream.Invalid != p.Records0 {
		t.Errorf("records without a message key: %+v", rep.Invalid)
	}
}

func TestAuditProgressLine(t *testing.T) {
	var b strings.Builder
	pl := progressLine(&b)
	pl(audit.Progress{Pass: 1, Read: 250, Total: 1000})
	pl(audit.Progress{Pass: 2, Read: 1000, Total: 1000})
	out := b.String()
	if !strings.Contains(out, "\rreading: 250/1000 records (25%") && !strings.Contains(out, "reading: 250/1000 records (25%") {
		t.Errorf("progress line %q", out)
	}
	if !strings.Contains(out, "deciding under the suggested rules: 1000/1000 records (100%") || strings.Count(out, "\r") != 2 {
		t.Errorf("progress line %q: want one rewritten line per call", out)
	}
}
