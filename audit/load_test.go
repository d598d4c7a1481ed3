package audit_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/audittest"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

// TestLoadAuditVsPlainRead measures an audit of a topic of about 1 KB
// records (1,000,000 by default) on a real broker, next to a plain
// kafka-go read of the same topic in the same run: one kafka.Reader per
// partition, no group, reading to the end. It is a load test, not a unit
// test: it runs only with IDEMSTREAM_LOAD_AUDIT=1 (make bench-audit) and
// asserts the findings, not the speed; the figures go to the log.
func TestLoadAuditVsPlainRead(t *testing.T) {
	if os.Getenv("IDEMSTREAM_LOAD_AUDIT") == "" {
		t.Skip("a load test: run it with make bench-audit (IDEMSTREAM_LOAD_AUDIT=1)")
	}
	n := 1_000_000
	if v, err := strconv.Atoi(os.Getenv("IDEMSTREAM_LOAD_AUDIT_RECORDS")); err == nil && v > 0 {
		n = v
	}
	const partitions = 6
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.UniqueName(t, "audit-load")
	testenv.CreateTopics(t, brokers, partitions, topic)
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second, Transport: transport}
	ctx := context.Background()

	// Produce in slices of the stream so that the test never holds the
	// whole topic in memory. The stream's times are recent: the broker's
	// retention keeps them.
	t0 := time.Now().Add(-time.Duration(n) * 5 * time.Millisecond).Add(-time.Hour)
	recs := audittest.Stream1K(topic, partitions, n, t0)
	var bytes int64
	for _, r := range recs {
		bytes += int64(len(r.Value))
	}
	started := time.Now()
	audittest.Produce(t, client, topic, recs)
	t.Logf("produced %d records, %.0f MB of values (%d bytes each on average), in %v",
		n, float64(bytes)/1e6, bytes/int64(n), time.Since(started).Round(time.Millisecond))
	recs = nil
	runtime.GC()

	// A plain kafka-go read: a Reader per partition, concurrently.
	started = time.Now()
	cpu0 := cpuTime()
	var plain atomic.Int64
	var wg sync.WaitGroup
	ends := map[int]int64{}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {
		kafka.LastOffsetOf(0), kafka.LastOffsetOf(1), kafka.LastOffsetOf(2), kafka.LastOffsetOf(3), kafka.LastOffsetOf(4), kafka.LastOffsetOf(5)}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, po := range res.Topics[topic] {
		ends[po.Partition] = po.LastOffset
	}
	for p := range partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MinBytes: 1, MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			for plain.Load() < int64(n) {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				plain.Add(1)
				if m.Offset+1 >= ends[p] {
					return
				}
			}
		}()
	}
	wg.Wait()
	plainTime, plainCPU := time.Since(started), cpuTime()-cpu0
	if plain.Load() != int64(n) {
		t.Fatalf("the plain read got %d records of %d", plain.Load(), n)
	}

	// The audit's reader alone: fetch and merge, no analysis.
	started, cpu0 = time.Now(), cpuTime()
	var scanned int64
	if err := (&audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: topic}).Scan(ctx, func(*dedupe.Record) error { scanned++; return nil }); err != nil {
		t.Fatal(err)
	}
	scanTime, scanCPU := time.Since(started), cpuTime()-cpu0

	// The audit without rules: two passes, with the heap sampled.
	var peak uint64
	var passAt time.Time
	sample := func(audit.Progress) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapAlloc)
	}
	src := &audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: topic, Progress: func(p audit.Progress) {
		sample(p)
		if p.Pass == 1 && p.Read == p.Total {
			passAt = time.Now()
		}
	}}
	pol := audittest.Policy(t)
	pol.MaxPayloadBytes = 1 << 20
	started, cpu0 = time.Now(), cpuTime()
	rep, err := audit.Run(ctx, src, audit.Options{Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	auditTime, auditCPU := time.Since(started), cpuTime()-cpu0
	pass1 := passAt.Sub(started)

	// With a configuration the rules are known: one pass.
	cpol := pol
	cpol.Rules = dedupe.CanonicalRules{Volatile: rep.Suggested.Volatile, Unordered: rep.Suggested.Unordered}
	cpol.Window = rep.Suggested.Window.D()
	started, cpu0 = time.Now(), cpuTime()
	crep, err := audit.Run(ctx, &audit.KafkaTopic{Reader: sinks.NewKafka(client), Topic: topic}, audit.Options{Policy: cpol, Configured: true})
	if err != nil {
		t.Fatal(err)
	}
	configTime, configCPU := time.Since(started), cpuTime()-cpu0

	// Wall time depends on what else the machine runs; CPU time per
	// record less so. Both are shown.
	rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	t.Logf("%d records, GOMAXPROCS %d", n, runtime.GOMAXPROCS(0))
	t.Logf("plain kafka-go read (a Reader per partition): %8.0f records/s (%v), %5.1f µs CPU per record", rate(plainTime), plainTime.Round(time.Millisecond), us(plainCPU))
	t.Logf("audit reader alone (fetch + merge):          %8.0f records/s (%v), %5.1f µs CPU per record", rate(scanTime), scanTime.Round(time.Millisecond), us(scanCPU))
	t.Logf("audit, no rules (2 passes):                  %8.0f records/s (%v; first pass %v), %5.1f µs CPU per record", rate(auditTime), auditTime.Round(time.Millisecond), pass1.Round(time.Millisecond), us(auditCPU))
	t.Logf("audit, rules from a config (1 pass):         %8.0f records/s (%v), %5.1f µs CPU per record", rate(configTime), configTime.Round(time.Millisecond), us(configCPU))
	t.Logf("keys %d; peak heap sampled during the audit %.0f MB = %.0f bytes per key (fetch buffers included)",
		rep.Keys, float64(peak)/1e6, float64(peak)/float64(rep.Keys))
	t.Logf("found: volatile %v, unordered %v, conflicts %d, decisions %+v", rep.Suggested.Volatile, rep.Suggested.Unordered, rep.Conflicts.Keys, rep.Decisions)

	if scanned != int64(n) || rep.Records != int64(n) || crep.Records != int64(n) {
		t.Errorf("records: scan %d, audit %d, configured audit %d; want %d", scanned, rep.Records, crep.Records, n)
	}
	if got := rep.Suggested.Volatile; len(got) != 3 || len(rep.Suggested.Unordered) != 1 || rep.Conflicts.Keys != 0 {
		t.Errorf("findings: volatile %v, unordered %v, %d conflicting keys", got, rep.Suggested.Unordered, rep.Conflicts.Keys)
	}
	if d := rep.Decisions.Idemstream; d.Conflict != 0 || d.Invalid != 0 || d.First != rep.Keys || d != crep.Decisions.Idemstream {
		t.Errorf("decisions %+v, with the config %+v", d, crep.Decisions.Idemstream)
	}
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
