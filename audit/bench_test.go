package audit_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/audittest"
)

const benchRecords = 100_000

func stream1K(b *testing.B) ([]dedupe.Record, int64) {
	b.Helper()
	recs := audittest.Stream1K("bench", 6, benchRecords, time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC))
	var size int64
	for _, r := range recs {
		size += int64(len(r.Value))
	}
	return recs, size
}

// BenchmarkAnalyzer1K is the first pass alone, in memory: records of
// about 1 KB, one in four a retry.
func BenchmarkAnalyzer1K(b *testing.B) {
	recs, size := stream1K(b)
	pol := audittest.Policy(b)
	pol.MaxPayloadBytes = 1 << 20
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		a, err := audit.NewAnalyzer(audit.Options{Policy: pol})
		if err != nil {
			b.Fatal(err)
		}
		for i := range recs {
			a.Add(&recs[i])
		}
	}
	b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkReplayer1K is the deciding pass alone, in memory, under the
// rules the first pass finds in that stream.
func BenchmarkReplayer1K(b *testing.B) {
	recs, size := stream1K(b)
	pol := audittest.Policy(b)
	pol.MaxPayloadBytes = 1 << 20
	pol.Window, pol.PendingTimeout, pol.FailedTTL = 10*time.Minute, 30*time.Second, 10*time.Minute
	pol.Rules = dedupe.CanonicalRules{Volatile: []string{"/client_time", "/retry_count", "/trace_id"}, Unordered: []string{"/items"}}
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		r, err := audit.NewReplayer(pol)
		if err != nil {
			b.Fatal(err)
		}
		for i := range recs {
			r.Add(&recs[i])
		}
		if d := r.Decisions().Idemstream; d.Conflict != 0 || d.Invalid != 0 {
			b.Fatalf("decisions %+v: the stream has no conflict and no garbage", d)
		}
	}
	b.ReportMetric(float64(len(recs))*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkMemoryPerKey measures what the audit keeps per key, for 1 KB
// payloads: while the key's window is open (with the summary of its
// first copy), after it closed (counts and times only), and in the
// deciding pass. Run it with -benchtime=1x; the figures are the metrics.
func BenchmarkMemoryPerKey(b *testing.B) {
	const keys = 100_000
	t0 := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	recs := make([]dedupe.Record, keys)
	for i := range recs {
		key := fmt.Sprintf("%08x-0000-4000-8000-%012d", i, i)
		at := t0.Add(time.Duration(i) * time.Millisecond) // all inside one window
		recs[i] = dedupe.Record{Topic: "m", Offset: int64(i), Time: at, Headers: []dedupe.Header{{Key: "Idempotency-Key", Value: []byte(key)}},
			Value: audittest.Command1K(key, i, 0, at)}
	}
	late := recs[0]
	late.Headers = []dedupe.Header{{Key: "Idempotency-Key", Value: []byte("ffffffff-0000-4000-8000-000000000000")}}
	late.Time = t0.Add(time.Hour)
	pol := audittest.Policy(b)
	pol.MaxPayloadBytes = 1 << 20
	var open, closed, replay float64
	for range b.N {
		base := heap()
		a, err := audit.NewAnalyzer(audit.Options{Policy: pol})
		if err != nil {
			b.Fatal(err)
		}
		for i := range recs {
			a.Add(&recs[i])
		}
		open = float64(heap()-base) / keys
		a.Add(&late) // an hour later: every window is over
		closed = float64(heap()-base) / keys
		runtime.KeepAlive(a)

		rpol := pol
		rpol.Window, rpol.PendingTimeout, rpol.FailedTTL = 10*time.Minute, 30*time.Second, 10*time.Minute
		base = heap()
		r, err := audit.NewReplayer(rpol)
		if err != nil {
			b.Fatal(err)
		}
		for i := range recs {
			r.Add(&recs[i])
		}
		replay = float64(heap()-base) / keys
		runtime.KeepAlive(r)
	}
	b.ReportMetric(open, "B/key-open")
	b.ReportMetric(closed, "B/key-closed")
	b.ReportMetric(replay, "B/key-decide")
	b.ReportMetric(0, "ns/op")
	_ = context.Background
}
