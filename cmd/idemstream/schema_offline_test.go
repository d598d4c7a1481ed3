package main

import (
	"encoding/binary"
	"strings"
	"testing"
)

// avroClaim is {coupon_id, amount, client_time} in Avro binary, written by
// hand: the support engineer's case of two records copied off a topic.
func avroClaim(coupon, amount int64, clientTime string) string {
	zz := func(b []byte, v int64) []byte { return binary.AppendUvarint(b, uint64(v<<1)^uint64(v>>63)) }
	b := zz(nil, coupon)
	b = zz(b, amount)
	b = zz(b, int64(len(clientTime)))
	return string(append(b, clientTime...))
}

// TestHashAndDiffReadAvroOffline: hash and diff read a record's bytes with
// --schema, under the pipeline's volatile rules, with no registry.
func TestHashAndDiffReadAvroOffline(t *testing.T) {
	dir := t.TempDir()
	schema := writeFile(t, dir, "claim.avsc", `{"type":"record","name":"Claim","fields":[
	 {"name":"coupon_id","type":"long"},{"name":"amount","type":"long"},{"name":"client_time","type":"string"}]}`)
	config := writeFile(t, dir, "c.yaml", "pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, volatile: [/client_time]}\n")
	first := writeFile(t, dir, "first.bin", avroClaim(1, 50, "10:00:00"))
	retry := writeFile(t, dir, "retry.bin", avroClaim(1, 50, "10:00:05"))
	changed := writeFile(t, dir, "changed.bin", avroClaim(1, 60, "10:00:09"))

	h := runCLI(t, "", "hash", "--config", config, "--schema", schema, first)
	if h.code != 0 || !strings.Contains(h.stdout, `canonical:   {"amount":50,"coupon_id":1}`) {
		t.Fatalf("hash: %d %s %s", h.code, h.stdout, h.stderr)
	}
	if r := runCLI(t, "", "hash", "--config", config, "--schema", schema, retry); fingerprintRE.FindString(r.stdout) != fingerprintRE.FindString(h.stdout) {
		t.Errorf("the retry has another fingerprint:\n%s\n%s", h.stdout, r.stdout)
	}
	d := runCLI(t, "", "diff", "--config", config, "--schema", schema, first, changed)
	if d.code != 0 || !strings.Contains(d.stdout, "differs at 1 path(s):\n/amount") {
		t.Fatalf("diff: %d %s %s", d.code, d.stdout, d.stderr)
	}
	bad := writeFile(t, dir, "bad.bin", "\x02")
	if r := runCLI(t, "", "hash", "--config", config, "--schema", schema, bad); r.code == 0 || !strings.Contains(r.stderr, "malformed payload") {
		t.Errorf("a truncated record: %d %s", r.code, r.stderr)
	}
	if r := runCLI(t, "", "hash", "--config", config, "--schema", writeFile(t, dir, "x.json", "{}"), first); r.code != 2 {
		t.Errorf("--schema x.json: exit %d, want 2 (bad usage)", r.code)
	}
}
