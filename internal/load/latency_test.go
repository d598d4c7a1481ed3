package load

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

// TestLatency is make latency: records produced at a fixed rate for a
// fixed time, first through the passthrough, then through `idemstream
// run`, each on topics of its own on the same broker and Redis. For every
// first copy of a key it measures the time from the record's timestamp
// (set when the producer hands it to the broker, also carried in the
// load-sent header) to the moment a reader of the output sees the result,
// and prints p50, p99 and the maximum of each side. The rate is half of
// the fastest of eight passthrough runs over a backlog of 325,000 records
// in the same run (IDEMSTREAM_LATENCY_CALIBRATE_RUNS,
// IDEMSTREAM_LATENCY_CALIBRATE), unless IDEMSTREAM_LATENCY_RATE sets it.
func TestLatency(t *testing.T) {
	if os.Getenv("IDEMSTREAM_LATENCY") == "" {
		t.Skip("a latency run: make latency (IDEMSTREAM_LATENCY=1)")
	}
	set := readLatencySettings(t)
	rate, duration, calibrate, runs, bound := set.rate, set.duration, set.calibrate, set.runs, set.bound
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	idemBin, passBin := binaries(t)
	run := testenv.UniqueName(t, "latency")
	ctx, cancel := runContext(t, time.Duration(runs+3)*bound)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}

	t.Logf("machine: %d CPUs, load average %s", runtime.NumCPU(), loadAverage())
	if rate == 0 {
		in, out := run+".cal.in", run+".cal.out"
		testenv.CreateTopics(t, brokers, partitions, in, out)
		if err := produce(ctx, brokers, in, newWorkload(1, run+".cal"), calibrate); err != nil {
			t.Fatal(err)
		}
		input := offsets{client: client, topic: in}
		end, err := input.end(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The fastest of several runs counts: the broker's CPU per record
		// falls to about a third over the first six or seven runs on a
		// fresh broker, most likely while its JIT warms up (see
		// TestThroughput), and a broker in service is warm.
		broker := brokerPID()
		rates := make([]string, runs)
		var fastest float64
		for i := range runs {
			group := run + ".cal" + strconv.Itoa(i)
			r := runPassthrough(ctx, t, passBin, brokers, nil, input, end, bound, broker, group, out)
			fastest = max(fastest, float64(calibrate)/r.time.Seconds())
			rates[i] = fmt.Sprintf("%.0f", float64(calibrate)/r.time.Seconds())
		}
		rate = int(fastest / 2)
		t.Logf("passthrough on a backlog of %d records, %d times: %s records/s from process start to lag 0; fixed rate: half the fastest, %d records/s", calibrate, runs, strings.Join(rates, ", "), rate)
	}

	// start starts one side and returns its process and, for idemstream,
	// the address of its metrics.
	sides := []struct {
		name  string
		start func(in, out, dlq, group string) (*process, string)
	}{
		{"passthrough", func(in, out, _, group string) (*process, string) {
			return startProcess(t, "passthrough", passBin, "--brokers", strings.Join(brokers, ","), "--input", in, "--output", out, "--group", group), ""
		}},
		{"idemstream", func(in, out, dlq, group string) (*process, string) {
			config := filepath.Join(t.TempDir(), "idemstream.yaml")
			prefix := strings.TrimSuffix(group, ".load")
			writeConfig(t, config, brokers, redisAddr, prefix, in, out, dlq, "")
			metrics := testenv.FreeAddr(t)
			p := startProcess(t, "idemstream", idemBin, "run", "--config", config, "--metrics-addr", metrics, "--log-format", "text")
			waitHTTP(t, p, "http://"+metrics+"/readyz", 2*time.Minute)
			return p, metrics
		}},
	}
	type figures struct {
		sent, firsts int
		lat          []time.Duration
	}
	results := map[string]figures{}
	for _, side := range sides {
		base := run + "." + side.name
		in, out, dlq := base+".in", base+".out", base+".dlq"
		group := base + ".load" // idemstream's group is <kafka.group>.<pipeline>
		testenv.CreateTopics(t, brokers, partitions, in, out, dlq)
		input := offsets{client: client, topic: in}
		p, metricsAddr := side.start(in, out, dlq, group)

		// Warm up: a few records through, so that the group has joined and
		// every connection is open before the clock runs.
		w := newWorkload(uint64(time.Now().UnixNano()), base)
		if err := produce(ctx, brokers, in, w, 60); err != nil {
			t.Fatal(err)
		}
		end, err := input.end(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waitCaughtUp(ctx, t, p, input, group, end, bound, nil)
		outStart, err := offsets{client: client, topic: out}.end(ctx)
		if err != nil {
			t.Fatal(err)
		}

		inStart, err := input.end(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seen, floor := &latencies{}, &latencies{}
		readCtx, stopReading := context.WithCancel(ctx)
		readers := seen.follow(readCtx, brokers, out, outStart)
		floorReaders := floor.follow(readCtx, brokers, in, inStart)
		sent, firsts, err := produceAtRate(ctx, brokers, in, w, rate, duration)
		if err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		if end, err = input.end(ctx); err != nil {
			t.Fatal(err)
		}
		behind := int64(-1) // records not yet committed when the producer stopped
		if committed, err := input.committed(ctx, group); err == nil {
			behind = lag(end, committed)
		}
		caughtUp := waitCaughtUp(ctx, t, p, input, group, end, bound, nil)
		t.Logf("%s: %d records behind when the producer stopped, lag 0 %v later", side.name, behind, caughtUp.Sub(stopped).Round(time.Millisecond))
		deadline := time.Now().Add(time.Minute)
		for (seen.count() < firsts || floor.count() < firsts) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		stopReading()
		readers.Wait()
		floorReaders.Wait()
		if metricsAddr != "" {
			if metrics, err := scrape(metricsAddr); err == nil {
				reportStore(t, metrics, sent+60)
			}
		}
		if !p.stop(15 * time.Second) {
			t.Errorf("%s did not stop cleanly: %v\n%s", side.name, p.err, p.tail(10))
		}
		lat := seen.sorted()
		if len(lat) != firsts {
			t.Errorf("%s: %d results of first copies seen, %d sent", side.name, len(lat), firsts)
		}
		results[side.name] = figures{sent: sent, firsts: firsts, lat: lat}
		// The floor: the same records read from the input as they arrive,
		// what producing and reading alone cost on this machine now.
		fl := floor.sorted()
		t.Logf("%s: %d records in %v (%.0f records/s), %d first copies: latency p50 %v  p99 %v  max %v (input read directly: p50 %v  p99 %v)",
			side.name, sent, duration, float64(sent)/duration.Seconds(), firsts,
			ms(percentile(lat, 0.5)), ms(percentile(lat, 0.99)), ms(percentile(lat, 1)),
			ms(percentile(fl, 0.5)), ms(percentile(fl, 0.99)))
	}
	t.Logf("machine: load average %s", loadAverage())
	pass, idem := results["passthrough"], results["idemstream"]
	t.Logf("added latency at %d records/s: p50 %+v, p99 %+v (goal: idemstream p99 <= passthrough p99 + 20ms, at a rate both sustain)",
		rate, ms(percentile(idem.lat, 0.5)-percentile(pass.lat, 0.5)), ms(percentile(idem.lat, 0.99)-percentile(pass.lat, 0.99)))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// latencies collects, for each first copy a reader of the output sees,
// the time since its load-sent header.
type latencies struct {
	mu  sync.Mutex
	lat []time.Duration
}

func (l *latencies) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lat)
}

func (l *latencies) sorted() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return sortedDurations(l.lat)
}

// follow reads every partition of topic from the given offsets until ctx
// ends.
func (l *latencies) follow(ctx context.Context, brokers []string, topic string, from map[int]int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	for p, off := range from {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 50 * time.Millisecond})
		if err := r.SetOffset(off); err != nil {
			panic(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					return
				}
				now := time.Now()
				if header(m.Headers, copyHeader) != "1" {
					continue
				}
				ns, err := strconv.ParseInt(header(m.Headers, sentHeader), 10, 64)
				if err != nil {
					continue
				}
				l.mu.Lock()
				l.lat = append(l.lat, now.Sub(time.Unix(0, ns)))
				l.mu.Unlock()
			}
		}()
	}
	return &wg
}

// produceAtRate writes the workload at rate records per second for d, in
// small batches every few milliseconds (behind schedule it catches up),
// stamping each record with its send time. It returns how many records
// and how many first copies it sent.
func produceAtRate(ctx context.Context, brokers []string, topic string, w *workload, rate int, d time.Duration) (sent, firsts int, err error) {
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: 10000, BatchTimeout: time.Millisecond}
	defer wr.Close()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var batch []kafka.Message
	for {
		elapsed := time.Since(start)
		if elapsed >= d {
			return sent, firsts, nil
		}
		due := int(float64(rate)*elapsed.Seconds()) - sent
		batch = batch[:0]
		for range due {
			batch = append(batch, w.next(-1))
		}
		if len(batch) > 0 {
			now := time.Now()
			stamp := []byte(strconv.FormatInt(now.UnixNano(), 10))
			for i := range batch {
				batch[i].Time = now
				batch[i].Headers = append(batch[i].Headers, kafka.Header{Key: sentHeader, Value: stamp})
				if header(batch[i].Headers, copyHeader) == "1" {
					firsts++
				}
			}
			if err := wr.WriteMessages(ctx, batch...); err != nil {
				return sent, firsts, fmt.Errorf("produce to %s: %w", topic, err)
			}
			sent += len(batch)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return sent, firsts, ctx.Err()
		}
	}
}
