package load

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

// TestCrashLatency is make crash-latency: what a crashed member costs.
// Three `idemstream run` processes form one group (one config file, each
// with IDEMSTREAM_INSTANCE_ID=member-<slot>) over six partitions while
// commands arrive at IDEMSTREAM_CRASH_RATE a second. After a warm-up of
// 10 s the members are SIGKILLed in turn (slot 0, 1, 2, 0, ...), one
// every 10 s for IDEMSTREAM_CRASH_DURATION, each started again 3 s later
// under its instance id, as a kubelet restarts an OOM-killed container;
// the next kill waits until the restarted member answers /readyz. Every
// idemstream timing is its default. Once the producer stops and every
// key has its result, the members get SIGTERM.
//
// The figures come from the topics alone: a result's latency is its
// record timestamp minus the timestamp of the command its
// idemstream-source names, and the longest gap is the longest time in
// which no result was written at all, and on each input partition. Each
// key must have exactly one result, or the test fails.
//
// The run is made with this tree's binary, then, on fresh topics and a
// fresh group, with the previous release's at IDEMSTREAM_CRASH_PREVIOUS
// (skipped when unset; that release ignores the instance id and rejoins
// through kafka-go's eager consumer group), and the two are printed side
// by side. IDEMSTREAM_LOAD_LOGS=DIR keeps the members' logs;
// IDEMSTREAM_CRASH_KILLS=0 runs the same stream with no kill, the
// baseline of the CPU figures (a member that stalls catches up in larger,
// cheaper batches).
func TestCrashLatency(t *testing.T) {
	if os.Getenv("IDEMSTREAM_CRASH") != "1" {
		t.Skip("a crash run: make crash-latency (IDEMSTREAM_CRASH=1)")
	}
	set := readCrashSettings(t)
	// startProcess gives its children no IDEMSTREAM_* variable; env(1)
	// adds the instance id and execs the binary in its own place, so the
	// pid that is killed is idemstream's.
	envBin, err := exec.LookPath("env")
	if err != nil {
		t.Fatalf("env(1) starts the members with their instance id: %v", err)
	}
	idemBin, _ := binaries(t)
	bins := []struct{ name, path string }{{"current", idemBin}}
	if set.previous == "" {
		t.Logf("IDEMSTREAM_CRASH_PREVIOUS is unset: the previous release's half is skipped")
	} else if _, err := os.Stat(set.previous); err != nil {
		t.Fatalf("IDEMSTREAM_CRASH_PREVIOUS: %v", err)
	} else {
		bins = append(bins, struct{ name, path string }{"previous", set.previous})
	}
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	run := testenv.UniqueName(t, "crash")
	ctx, cancel := runContext(t, time.Duration(len(bins))*(set.warmup+set.duration+set.bound+10*time.Minute))
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}

	t.Logf("machine: %d CPUs, load average %s", runtime.NumCPU(), loadAverage())
	var figs []crashFigures
	for _, b := range bins {
		base := run + "." + b.name
		h := &crashHalf{set: set, name: b.name, bin: b.path, env: envBin, brokers: brokers, client: client,
			in: base + ".in", out: base + ".out", dlq: base + ".dlq", group: base + ".load"}
		testenv.CreateTopics(t, brokers, partitions, h.in, h.out, h.dlq)
		h.config = filepath.Join(t.TempDir(), "idemstream.yaml")
		writeConfig(t, h.config, brokers, redisAddr, base, h.in, h.out, h.dlq, "")
		f := h.run(ctx, t)
		t.Log(f.summary())
		figs = append(figs, f)
	}
	t.Logf("machine: load average %s", loadAverage())
	reportCrashes(t, set, figs)
}

// crashSettings are TestCrashLatency's (the Makefile's crash-latency
// target sets the rate, the duration and the previous binary).
type crashSettings struct {
	rate                   int
	warmup, every, restart time.Duration // fixed: the operator's report
	duration, bound        time.Duration
	previous               string
	members                int
	// kills is off for a baseline: the same stream, no member killed
	// (IDEMSTREAM_CRASH_KILLS=0).
	kills bool
}

func readCrashSettings(t *testing.T) crashSettings {
	t.Helper()
	return crashSettings{
		rate:     envInt(t, "IDEMSTREAM_CRASH_RATE", 3000),
		duration: envDuration(t, "IDEMSTREAM_CRASH_DURATION", 60*time.Second),
		bound:    envDuration(t, "IDEMSTREAM_LOAD_BOUND", 10*time.Minute),
		previous: os.Getenv("IDEMSTREAM_CRASH_PREVIOUS"),
		warmup:   10 * time.Second,
		every:    10 * time.Second,
		kills:    envSwitch(t, "IDEMSTREAM_CRASH_KILLS", true),
		restart:  3 * time.Second,
		members:  3,
	}
}

// crashHalf is one binary's run: its topics, its group and its members.
type crashHalf struct {
	set                    crashSettings
	name, bin, env, config string
	brokers                []string
	client                 *kafka.Client
	in, out, dlq, group    string
	members                []*member
	start                  time.Time // of the stream: what the kills and gaps are timed from
	end                    time.Time // of the stream: the producer stopped
}

// member is one slot of the group: the process it runs now and the logs
// and CPU time of every process it ran.
type member struct {
	slot    int
	p       *process
	metrics string
	logs    []string
	cpu     float64 // seconds, of the processes that have exited
}

// crashKill is one kill, timed from the start of the stream.
type crashKill struct {
	slot                  int
	killed, started, back time.Duration
}

// crashFigures is what one half measured.
type crashFigures struct {
	name                string
	sent, keys, results int
	distinct            int // keys with a result
	lat                 []time.Duration
	gap                 crashGap
	streamGap           crashGap // the longest before the stream ended
	perPartition        [partitions]crashGap
	kills               []crashKill
	cpu                 float64
	genBefore           int // the highest generation the members logged before the stream
	generation          int // and after it
	joins, lost         int // "generation joined" and "partitions lost" lines during the stream
	drain               time.Duration
}

// crashGap is a time without results: how long, and when it began,
// from the start of the stream.
type crashGap struct{ length, at time.Duration }

func (h *crashHalf) run(ctx context.Context, t *testing.T) crashFigures {
	t.Helper()
	for slot := range h.set.members {
		m := &member{slot: slot}
		h.startMember(t, m)
		h.members = append(h.members, m)
	}
	w := newWorkload(uint64(time.Now().UnixNano()), h.name)
	outStart := h.settle(ctx, t, w)
	before := w.keys
	sent, kills := h.stream(ctx, t, w)
	// The figures are the stream's: the warm-up's keys have their results
	// before it starts (verifyResults checks them with the rest).
	f := crashFigures{name: h.name, sent: sent, keys: w.keys - before, kills: kills}
	f.drain = h.waitResults(ctx, t, w.keys)
	for _, m := range h.members {
		if !m.p.stop(15 * time.Second) {
			t.Errorf("%s: %s did not stop cleanly: %v\n%s", h.name, m.p.name, m.p.err, m.p.tail(10))
		}
		m.cpu += exitedCPU(m.p)
		f.cpu += m.cpu
	}
	h.readLogs(t, &f)
	h.analyse(ctx, t, outStart, &f)
	verifyResults(ctx, t, h.brokers, h.client, h.out, h.dlq, w, nil)
	return f
}

// startMember starts the member's process and waits until it is ready.
func (h *crashHalf) startMember(t *testing.T, m *member) {
	t.Helper()
	m.metrics = testenv.FreeAddr(t)
	m.p = startProcess(t, fmt.Sprintf("%s-member-%d", h.name, m.slot), h.env,
		"IDEMSTREAM_INSTANCE_ID=member-"+strconv.Itoa(m.slot), h.bin, "run",
		"--config", h.config, "--metrics-addr", m.metrics, "--log-format", "text")
	m.logs = append(m.logs, m.p.logPath)
	waitHTTP(t, m.p, "http://"+m.metrics+"/readyz", 2*time.Minute)
}

// exitedCPU is the user and system time of a process that has exited.
func exitedCPU(p *process) float64 {
	s := p.cmd.ProcessState
	if s == nil {
		return 0
	}
	return (s.UserTime() + s.SystemTime()).Seconds()
}

// settle puts a few records through and waits until the group is stable
// with every member owning partitions, so that the stream starts on a
// formed group with its connections open. It returns where the stream's
// results begin on the output.
func (h *crashHalf) settle(ctx context.Context, t *testing.T, w *workload) map[int]int64 {
	t.Helper()
	if err := produce(ctx, h.brokers, h.in, w, 60); err != nil {
		t.Fatal(err)
	}
	input := offsets{client: h.client, topic: h.in}
	end, err := input.end(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(ctx, t, h.members[0].p, input, h.group, end, h.set.bound, nil)
	waitGroupStable(ctx, t, h.client, h.group, h.set.members, 2*time.Minute)
	outStart, err := offsets{client: h.client, topic: h.out}.end(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return outStart
}

// waitGroupStable polls the group until the broker calls it Stable with
// n members, each assigned some of the partitions and all of them
// assigned: the joins of the start are over.
func waitGroupStable(ctx context.Context, t *testing.T, client *kafka.Client, group string, n int, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	last := "no answer"
	for {
		res, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		switch {
		case err != nil:
			last = err.Error()
		case len(res.Groups) != 1:
			last = fmt.Sprintf("%d groups described", len(res.Groups))
		case res.Groups[0].Error != nil:
			last = res.Groups[0].Error.Error()
		default:
			g := res.Groups[0]
			assigned, owners := 0, 0
			for _, m := range g.Members {
				before := assigned
				for _, tp := range m.MemberAssignments.Topics {
					assigned += len(tp.Partitions)
				}
				if assigned > before {
					owners++
				}
			}
			if g.GroupState == "Stable" && len(g.Members) == n && owners == n && assigned == partitions {
				return
			}
			last = fmt.Sprintf("%s with %d members, %d owning, %d partitions assigned", g.GroupState, len(g.Members), owners, assigned)
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s not stable with %d members within %v: %s", group, n, bound, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stream produces at the fixed rate for the warm-up and the duration,
// and meanwhile kills the members in turn. It returns the records sent
// and the kills.
func (h *crashHalf) stream(ctx context.Context, t *testing.T, w *workload) (int, []crashKill) {
	t.Helper()
	type produced struct {
		sent int
		err  error
	}
	done := make(chan produced, 1)
	total := h.set.warmup + h.set.duration
	h.start = time.Now()
	go func() {
		sent, _, err := produceAtRate(ctx, h.brokers, h.in, w, h.set.rate, total)
		done <- produced{sent, err}
	}()
	var kills []crashKill
	next := h.start.Add(h.set.warmup)
	for k := 0; h.set.kills && next.Sub(h.start) < total; k++ {
		select {
		case <-time.After(time.Until(next)):
		case <-ctx.Done():
			t.Fatalf("%s: %v before kill %d", h.name, ctx.Err(), k+1)
		}
		kill := h.crash(t, h.members[k%len(h.members)])
		t.Logf("%s: member-%d killed at %v, started again at %v, ready at %v", h.name, kill.slot,
			secs(kill.killed), secs(kill.started), secs(kill.back))
		kills = append(kills, kill)
		// The next kill: a period after this one, once this one is back.
		next = h.start.Add(max(kill.killed+h.set.every, time.Since(h.start)))
	}
	p := <-done
	h.end = time.Now()
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p.sent, kills
}

// crash SIGKILLs the member's process, waits the restart delay, and
// starts it again under the same instance id.
func (h *crashHalf) crash(t *testing.T, m *member) crashKill {
	t.Helper()
	k := crashKill{slot: m.slot, killed: time.Since(h.start)}
	if gone, err := m.p.exited(); gone {
		t.Fatalf("%s: %s had exited before its kill: %v\n%s", h.name, m.p.name, err, m.p.tail(20))
	}
	_ = m.p.cmd.Process.Kill()
	<-m.p.done
	m.cpu += exitedCPU(m.p)
	time.Sleep(h.set.restart)
	k.started = time.Since(h.start)
	h.startMember(t, m)
	k.back = time.Since(h.start)
	return k
}

// waitResults polls the output until it holds as many results as keys
// were produced, and returns how long that took after the stream ended.
func (h *crashHalf) waitResults(ctx context.Context, t *testing.T, keys int) time.Duration {
	t.Helper()
	stopped := time.Now()
	deadline := stopped.Add(h.set.bound)
	out := offsets{client: h.client, topic: h.out}
	var n int64
	for {
		end, err := out.end(ctx)
		if err == nil {
			if n = sum(end); n >= int64(keys) {
				return time.Since(stopped)
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d results for %d keys %v after the stream ended (last error %v)", h.name, n, keys, h.set.bound, err)
			return time.Since(stopped)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// crashResult is one result of the stream: the input position its
// idemstream-source names, and when it was written.
type crashResult struct {
	partition int
	offset    int64
	at        time.Time
}

// analyse reads the input's timestamps and the stream's results, and
// fills in the latencies, the gaps and the keys with a result.
func (h *crashHalf) analyse(ctx context.Context, t *testing.T, outStart map[int]int64, f *crashFigures) {
	t.Helper()
	sent, err := h.commandTimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	results, keys, err := h.readResults(ctx, outStart)
	if err != nil {
		t.Fatal(err)
	}
	f.results, f.distinct = len(results), keys
	var all []time.Time
	var byPartition [partitions][]time.Time
	for _, r := range results {
		if r.partition < 0 || r.partition >= partitions || r.offset < 0 || r.offset >= int64(len(sent[r.partition])) {
			t.Errorf("%s: a result names %d/%d, not a command of %s", h.name, r.partition, r.offset, h.in)
			continue
		}
		f.lat = append(f.lat, r.at.Sub(sent[r.partition][r.offset]))
		all = append(all, r.at)
		byPartition[r.partition] = append(byPartition[r.partition], r.at)
	}
	slices.Sort(f.lat)
	f.gap = longestGap(all, h.start)
	// After the stream's end results stop because commands do: the gap
	// while they still arrived, with the end closing the last one.
	var during []time.Time
	for _, at := range all {
		if at.Before(h.end) {
			during = append(during, at)
		}
	}
	f.streamGap = longestGap(append(during, h.end), h.start)
	for p := range partitions {
		f.perPartition[p] = longestGap(byPartition[p], h.start)
	}
}

// commandTimes reads the timestamp of every record of the input, by
// partition and offset.
func (h *crashHalf) commandTimes(ctx context.Context) ([partitions][]time.Time, error) {
	var sent [partitions][]time.Time
	end, err := offsets{client: h.client, topic: h.in}.end(ctx)
	if err != nil {
		return sent, err
	}
	for p, e := range end {
		sent[p] = make([]time.Time, e)
	}
	// Each partition is read by one goroutine: each writes its own slice.
	err = readAll(ctx, h.brokers, h.in, end, func(m kafka.Message) { sent[m.Partition][m.Offset] = m.Time })
	return sent, err
}

// readResults reads the output from outStart on: each result's source
// and time, and how many keys have one.
func (h *crashHalf) readResults(ctx context.Context, outStart map[int]int64) ([]crashResult, int, error) {
	end, err := offsets{client: h.client, topic: h.out}.end(ctx)
	if err != nil {
		return nil, 0, err
	}
	var mu sync.Mutex
	var results []crashResult
	keys := map[string]bool{}
	var bad error
	err = readAll(ctx, h.brokers, h.out, end, func(m kafka.Message) {
		if m.Offset < outStart[m.Partition] {
			return
		}
		p, off, perr := parseSource(header(m.Headers, "idemstream-source"), h.in)
		mu.Lock()
		defer mu.Unlock()
		keys[header(m.Headers, "idemstream-key")] = true
		if perr != nil {
			bad = perr
			return
		}
		results = append(results, crashResult{partition: p, offset: off, at: m.Time})
	})
	if err == nil {
		err = bad
	}
	return results, len(keys), err
}

// parseSource reads an idemstream-source header, topic/partition/offset,
// that must name topic.
func parseSource(src, topic string) (int, int64, error) {
	rest, ok := strings.CutPrefix(src, topic+"/")
	ps, offs, ok2 := strings.Cut(rest, "/")
	p, err1 := strconv.Atoi(ps)
	off, err2 := strconv.ParseInt(offs, 10, 64)
	if !ok || !ok2 || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("idemstream-source %q: want %s/PARTITION/OFFSET", src, topic)
	}
	return p, off, nil
}

// longestGap is the longest time between two consecutive times, and
// when it began after origin.
func longestGap(times []time.Time, origin time.Time) crashGap {
	s := slices.Clone(times)
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	var g crashGap
	for i := 1; i < len(s); i++ {
		if d := s[i].Sub(s[i-1]); d > g.length {
			g = crashGap{length: d, at: s[i-1].Sub(origin)}
		}
	}
	return g
}

var generationRe = regexp.MustCompile(`^time=(\S+) .*generation joined.*\bgeneration=(\d+)`)

// readLogs reads what the members' logs (--log-format text) say about the
// group: the highest generation joined before the stream and after its
// start (the difference is how many rebalances the crashes caused), the
// joins logged during the stream and the partitions lost.
func (h *crashHalf) readLogs(t *testing.T, f *crashFigures) {
	t.Helper()
	for _, m := range h.members {
		for _, path := range m.logs {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Logf("%s: %v", h.name, err)
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				g := generationRe.FindStringSubmatch(line)
				if g == nil {
					f.lost += strings.Count(line, "partitions lost")
					continue
				}
				at, err := time.Parse(time.RFC3339Nano, g[1])
				n, _ := strconv.Atoi(g[2])
				if err == nil && at.Before(h.start) {
					f.genBefore = max(f.genBefore, n)
					continue
				}
				f.joins++
				f.generation = max(f.generation, n)
			}
		}
	}
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// exactlyOnce tells whether every key produced has one result and no
// more (verifyResults fails the test with the details).
func (f crashFigures) exactlyOnce() string {
	if f.results == f.keys && f.distinct == f.keys {
		return fmt.Sprintf("exactly one for each of %d keys", f.keys)
	}
	return fmt.Sprintf("NOT exactly once: %d results, %d keys with one, %d keys", f.results, f.distinct, f.keys)
}

func (f crashFigures) gaps() string {
	var parts []string
	for p, g := range f.perPartition {
		parts = append(parts, fmt.Sprintf("p%d %s (from %s)", p, secs(g.length), secs(g.at)))
	}
	return strings.Join(parts, " ")
}

// late is the share of results written more than a second after their
// command.
func (f crashFigures) late() float64 {
	if len(f.lat) == 0 {
		return 0
	}
	i, _ := slices.BinarySearch(f.lat, time.Second+1)
	return float64(len(f.lat)-i) / float64(len(f.lat))
}

// rebalances is how many generations the group went through during the
// stream.
func (f crashFigures) rebalances() int { return max(f.generation-f.genBefore, 0) }

func (f crashFigures) summary() string {
	return fmt.Sprintf("%s: %d records, %d kills, each member back and ready; latency p50 %s p99 %s max %s, %.1f%% over 1s; longest gap on any partition %s (from %s), %s (from %s) before the stream ended; per input partition %s; %s; drained %s after the stream; member CPU %.1f s; %d rebalances during the stream (generation %d to %d: %d joins logged), %d partitions-lost lines",
		f.name, f.sent, len(f.kills), ms(percentile(f.lat, 0.5)), ms(percentile(f.lat, 0.99)), ms(percentile(f.lat, 1)), 100*f.late(),
		secs(f.gap.length), secs(f.gap.at), secs(f.streamGap.length), secs(f.streamGap.at), f.gaps(), f.exactlyOnce(), secs(f.drain), f.cpu, f.rebalances(), f.genBefore, max(f.genBefore, f.generation), f.joins, f.lost)
}

// reportCrashes prints the halves side by side, with previous/current.
func reportCrashes(t *testing.T, set crashSettings, figs []crashFigures) {
	t.Helper()
	faults := fmt.Sprintf("a SIGKILL every %v after %v (restart %v later)", set.every, set.warmup, set.restart)
	if !set.kills {
		faults = "no member killed (IDEMSTREAM_CRASH_KILLS=0)"
	}
	t.Logf("%d commands/s on %d partitions, %d members, %s, for %v:", set.rate, partitions, set.members, faults, set.duration)
	row := func(name string, value func(f crashFigures) (string, float64)) {
		t.Helper()
		line := fmt.Sprintf("  %-28s", name)
		var vs []float64
		for _, f := range figs {
			s, v := value(f)
			line += fmt.Sprintf(" %-14s", s)
			vs = append(vs, v)
		}
		if len(vs) == 2 && vs[0] > 0 {
			line += fmt.Sprintf(" x%.2f", vs[1]/vs[0])
		}
		t.Log(line)
	}
	header := fmt.Sprintf("  %-28s", "")
	for _, f := range figs {
		header += fmt.Sprintf(" %-14s", f.name)
	}
	t.Log(header + " previous/current")
	dur := func(d func(f crashFigures) time.Duration) func(crashFigures) (string, float64) {
		return func(f crashFigures) (string, float64) { return ms(d(f)), d(f).Seconds() }
	}
	row("latency p50", dur(func(f crashFigures) time.Duration { return percentile(f.lat, 0.5) }))
	row("latency p99", dur(func(f crashFigures) time.Duration { return percentile(f.lat, 0.99) }))
	row("latency max", dur(func(f crashFigures) time.Duration { return percentile(f.lat, 1) }))
	row("results over 1s (%)", func(f crashFigures) (string, float64) { return fmt.Sprintf("%.2f", 100*f.late()), f.late() })
	row("longest gap, any partition", dur(func(f crashFigures) time.Duration { return f.gap.length }))
	row("  before the stream's end", dur(func(f crashFigures) time.Duration { return f.streamGap.length }))
	for p := range partitions {
		row(fmt.Sprintf("longest gap, partition %d", p), dur(func(f crashFigures) time.Duration { return f.perPartition[p].length }))
	}
	row("member CPU (s)", func(f crashFigures) (string, float64) { return fmt.Sprintf("%.1f", f.cpu), f.cpu })
	row("rebalances in the stream", func(f crashFigures) (string, float64) { return strconv.Itoa(f.rebalances()), float64(f.rebalances()) })
	row("one result per key", func(f crashFigures) (string, float64) {
		return strconv.FormatBool(f.results == f.keys && f.distinct == f.keys), 0
	})
}
