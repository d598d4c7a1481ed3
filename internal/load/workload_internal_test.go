package load

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemstream/idemstream/decode"
	"github.com/idemstream/idemstream/dedupe"
)

// The workload is what the run claims: every retry is a replay under the
// pipeline's rules but has other bytes, keys are UUIDs, records are about
// 1 KB, and a bounded run holds every retry it promised.
func TestWorkloadShape(t *testing.T) {
	c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{Volatile: volatilePaths, Unordered: unorderedPaths})
	if err != nil {
		t.Fatal(err)
	}
	format, err := dedupe.ParseKeyFormat("uuid")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8000
	w := newWorkload(1, "shape")
	firsts := map[string][]byte{}
	retries, bytesTotal := 0, 0
	for i := range n {
		m := w.next(n - 1 - i)
		bytesTotal += len(m.Value)
		key := string(m.Key)
		if _, err := format.Normalize(key); err != nil {
			t.Fatalf("record %d: key %q is not a UUID: %v", i, key, err)
		}
		fp, err := c.Fingerprint(m.Value)
		if err != nil {
			t.Fatalf("record %d: %v\n%s", i, err, m.Value)
		}
		switch header(m.Headers, copyHeader) {
		case "1":
			if _, dup := firsts[key]; dup {
				t.Fatalf("record %d: key %s started twice", i, key)
			}
			firsts[key] = m.Value
		case "2":
			first, ok := firsts[key]
			if !ok {
				t.Fatalf("record %d: retry of %s before its first copy", i, key)
			}
			if bytes.Equal(first, m.Value) {
				t.Fatalf("record %d: retry has the same bytes as its first copy", i)
			}
			if want, _ := c.Fingerprint(first); fp != want {
				t.Fatalf("record %d: retry fingerprint %s, first copy %s\n%s\n%s", i, fp, want, first, m.Value)
			}
			retries++
		default:
			t.Fatalf("record %d: no %s header", i, copyHeader)
		}
	}
	if w.keys != len(firsts) || w.retries != retries || len(w.pending) != 0 {
		t.Fatalf("workload counts %d keys %d retries (%d pending), records %d keys %d retries", w.keys, w.retries, len(w.pending), len(firsts), retries)
	}
	if share := float64(retries) / float64(len(firsts)); share < 0.27 || share > 0.33 {
		t.Errorf("%.3f of the keys retried, want about %.2f", share, retryShare)
	}
	if avg := bytesTotal / n; avg < 950 || avg > 1150 {
		t.Errorf("average record %d bytes, want about 1 KB", avg)
	}
}

// The Avro backlog is the JSON backlog in Avro: the same keys and headers
// record for record, and every record decoded under commandSchema is the
// JSON record's request. A first copy decodes to the JSON text byte for
// byte (its members are in the schema's order); a retry, whose JSON has
// its members in another order, to the same fingerprint.
func TestWorkloadAvroMirrorsJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "command.avsc")
	if err := os.WriteFile(path, []byte(commandSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	dec, err := decode.Open(context.Background(), decode.Options{Format: dedupe.PayloadAvro, SchemaFile: path})
	if err != nil {
		t.Fatal(err)
	}
	rules := dedupe.CanonicalRules{Volatile: volatilePaths, Unordered: unorderedPaths}
	cj, err := dedupe.NewCanonicalizer(rules)
	if err != nil {
		t.Fatal(err)
	}
	rules.Payload, rules.Decoder = dedupe.PayloadAvro, dec
	ca, err := dedupe.NewCanonicalizer(rules)
	if err != nil {
		t.Fatal(err)
	}
	const n, id = 8000, 0x01020304
	js, av := newWorkload(3, "mirror"), newWorkload(3, "mirror")
	av.avroID = id
	avroBytes, jsonBytes := 0, 0
	for i := range n {
		mj, ma := js.next(n-1-i), av.next(n-1-i)
		if !bytes.Equal(mj.Key, ma.Key) || fmt.Sprint(mj.Headers) != fmt.Sprint(ma.Headers) {
			t.Fatalf("record %d: key %s headers %v in JSON, key %s headers %v in Avro", i, mj.Key, mj.Headers, ma.Key, ma.Headers)
		}
		if len(ma.Value) < 5 || ma.Value[0] != 0 || binary.BigEndian.Uint32(ma.Value[1:5]) != id {
			t.Fatalf("record %d: no wire-format framing with id %d: % x", i, id, ma.Value[:min(len(ma.Value), 5)])
		}
		decoded, err := dec.AppendJSON(nil, ma.Value[5:])
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if header(mj.Headers, copyHeader) == "1" && !bytes.Equal(decoded, mj.Value) {
			t.Fatalf("record %d decodes to\n%s\nwant\n%s", i, decoded, mj.Value)
		}
		fa, err := ca.Fingerprint(ma.Value[5:])
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if fj, _ := cj.Fingerprint(mj.Value); fa != fj {
			t.Fatalf("record %d: Avro fingerprint %s, JSON %s\n%s\n%s", i, fa, fj, decoded, mj.Value)
		}
		avroBytes, jsonBytes = avroBytes+len(ma.Value), jsonBytes+len(mj.Value)
	}
	if js.keys != av.keys || js.retries != av.retries {
		t.Fatalf("JSON %d keys %d retries, Avro %d keys %d retries", js.keys, js.retries, av.keys, av.retries)
	}
	t.Logf("%d records: %d bytes a record in Avro, %d in JSON", n, avroBytes/n, jsonBytes/n)
}

func TestAvroDecimalIsMinimalTwosComplement(t *testing.T) {
	for _, c := range []struct {
		v    int64
		want []byte
	}{
		{0, []byte{0}}, {127, []byte{0x7f}}, {128, []byte{0, 0x80}}, {129900, []byte{0x01, 0xfb, 0x6c}},
		{-1, []byte{0xff}}, {-128, []byte{0x80}}, {-129, []byte{0xff, 0x7f}},
	} {
		got := avroDecimal(nil, c.v)
		if want := append(avroLong(nil, int64(len(c.want))), c.want...); !bytes.Equal(got, want) {
			t.Errorf("avroDecimal(%d) = % x, want % x", c.v, got, want)
		}
	}
	if got := avroLong(nil, -3); !bytes.Equal(got, []byte{5}) {
		t.Errorf("avroLong(-3) = % x, want 05", got)
	}
	if got := avroLong(nil, 64); !bytes.Equal(got, []byte{0x80, 0x01}) {
		t.Errorf("avroLong(64) = % x, want 80 01", got)
	}
}
