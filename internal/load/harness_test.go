package load

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/internal/testenv"
)

const partitions = 6

// loadSettings are TestThroughput's, from the environment (the Makefile's
// load target sets all but the bound).
type loadSettings struct {
	records, rounds, warmups, prefill int
	bound                             time.Duration
	floors                            bool   // floor runs after each round
	payload                           string // json, or avro: Avro rounds beside the JSON ones
}

func readLoadSettings(t *testing.T) loadSettings {
	t.Helper()
	return loadSettings{
		records: envInt(t, "IDEMSTREAM_LOAD_RECORDS", 325000),
		rounds:  envInt(t, "IDEMSTREAM_LOAD_ROUNDS", 3),
		warmups: envCount(t, "IDEMSTREAM_LOAD_WARMUPS", 6),
		prefill: envCount(t, "IDEMSTREAM_LOAD_PREFILL", 0),
		bound:   envDuration(t, "IDEMSTREAM_LOAD_BOUND", 10*time.Minute),
		floors:  envSwitch(t, "IDEMSTREAM_LOAD_FLOOR", true),
		payload: envChoice(t, "IDEMSTREAM_LOAD_PAYLOAD", "json", "avro"),
	}
}

// latencySettings are TestLatency's, from the environment (the Makefile's
// latency target sets the rate and the duration). A rate of 0 means:
// calibrate it.
type latencySettings struct {
	rate, calibrate, runs int
	duration, bound       time.Duration
}

func readLatencySettings(t *testing.T) latencySettings {
	t.Helper()
	return latencySettings{
		rate:      envCount(t, "IDEMSTREAM_LATENCY_RATE", 0),
		duration:  envDuration(t, "IDEMSTREAM_LATENCY_DURATION", 30*time.Second),
		calibrate: envInt(t, "IDEMSTREAM_LATENCY_CALIBRATE", 325000),
		runs:      envInt(t, "IDEMSTREAM_LATENCY_CALIBRATE_RUNS", 8),
		bound:     envDuration(t, "IDEMSTREAM_LOAD_BOUND", 10*time.Minute),
	}
}

// envSwitch reads a setting of 0 (off) or 1 (on), or def.
func envSwitch(t *testing.T, name string, def bool) bool {
	t.Helper()
	switch v := os.Getenv(name); v {
	case "":
		return def
	case "0", "1":
		return v == "1"
	default:
		t.Fatalf("%s=%q: want 0 or 1", name, v)
		return false
	}
}

// envChoice reads a setting that must be one of choices, or the first of
// them.
func envChoice(t *testing.T, name string, choices ...string) string {
	t.Helper()
	v, err := parseChoice(name, os.Getenv(name), choices)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func parseChoice(name, v string, choices []string) (string, error) {
	if v == "" {
		return choices[0], nil
	}
	if !slices.Contains(choices, v) {
		return "", fmt.Errorf("%s=%q: want one of %s", name, v, strings.Join(choices, ", "))
	}
	return v, nil
}

// envInt reads a positive integer setting, or def.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	return envIntAtLeast(t, name, def, 1)
}

// envCount reads a setting that may be zero (none), or def.
func envCount(t *testing.T, name string, def int) int {
	t.Helper()
	return envIntAtLeast(t, name, def, 0)
}

func envIntAtLeast(t *testing.T, name string, def, least int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		t.Fatalf("%s=%q: want an integer of at least %d", name, v, least)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 30s", name, v)
	}
	return d
}

// moduleRoot walks up from the working directory to the go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// binaries builds idemstream and the passthrough, without -race: the
// processes are what is measured.
func binaries(t *testing.T) (idemstream, passthrough string) {
	t.Helper()
	root, dir := moduleRoot(t), t.TempDir()
	for _, b := range []struct{ out, pkg string }{{"idemstream", "./cmd/idemstream"}, {"passthrough", "./internal/load/passthrough"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return filepath.Join(dir, "idemstream"), filepath.Join(dir, "passthrough")
}

// childEnv is this process's environment without IDEMSTREAM_* variables:
// the processes take everything from their flags and config file.
func childEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMSTREAM_") {
			out = append(out, kv)
		}
	}
	return out
}

// process is one consumer under measurement.
type process struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	logPath string
	started time.Time
	done    chan struct{}
	err     error
}

func startProcess(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	// IDEMSTREAM_LOAD_LOGS keeps the processes' logs in that directory.
	dir := os.Getenv("IDEMSTREAM_LOAD_LOGS")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &process{t: t, name: name, done: make(chan struct{}),
		logPath: filepath.Join(dir, fmt.Sprintf("%s-%s-%s.log", t.Name(), name, time.Now().Format("150405.000")))}
	logf, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = childEnv()
	p.cmd.SysProcAttr = testenv.ChildProcAttr()
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop(10 * time.Second) })
	return p
}

// exited tells whether the process is gone, and why.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM and waits, then SIGKILL. It returns whether the
// process exited cleanly by itself within timeout.
func (p *process) stop(timeout time.Duration) bool {
	if gone, _ := p.exited(); gone {
		return p.err == nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err == nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return false
	}
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// memory reads VmRSS and VmHWM (peak RSS) of the process, in bytes.
func (p *process) memory() (rss, peak int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		var kb int64
		if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			peak = kb << 10
		}
	}
	return rss, peak
}

// offsets reads the end offsets of topic and the offsets that group
// committed on it.
type offsets struct {
	client *kafka.Client
	topic  string
}

func (o offsets) end(ctx context.Context) (map[int]int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range partitions {
		req.Topics[o.topic] = append(req.Topics[o.topic], kafka.LastOffsetOf(p))
	}
	res, err := o.client.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list offsets of %s: %w", o.topic, err)
	}
	out := map[int]int64{}
	for _, po := range res.Topics[o.topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("list offsets of %s/%d: %w", o.topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.LastOffset
	}
	if len(out) != partitions {
		return nil, fmt.Errorf("list offsets of %s: %d partitions answered of %d", o.topic, len(out), partitions)
	}
	return out, nil
}

func (o offsets) committed(ctx context.Context, group string) (map[int]int64, error) {
	parts := make([]int, partitions)
	for p := range parts {
		parts[p] = p
	}
	res, err := o.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{o.topic: parts}})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	out := map[int]int64{}
	for _, po := range res.Topics[o.topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("offsets of group %s on %s/%d: %w", group, o.topic, po.Partition, po.Error)
		}
		out[po.Partition] = po.CommittedOffset
	}
	return out, nil
}

// lag is how far committed is behind end, summed over the partitions (a
// partition never committed counts from offset 0).
func lag(end, committed map[int]int64) int64 {
	var sum int64
	for p, e := range end {
		c := committed[p]
		if c < 0 {
			c = 0
		}
		sum += max(e-c, 0)
	}
	return sum
}

// waitCaughtUp polls the group's committed offsets until they reach end,
// and returns when that happened. While it waits it samples the process's
// RSS at every quarter of total, fails the test if the process exits or
// the bound passes.
func waitCaughtUp(ctx context.Context, t *testing.T, p *process, o offsets, group string, end map[int]int64, bound time.Duration, rssAt *[4]int64) time.Time {
	t.Helper()
	var total int64
	for _, e := range end {
		total += e
	}
	deadline := time.Now().Add(bound)
	next := 0
	last := int64(-1)
	for {
		committed, err := o.committed(ctx, group)
		if err == nil {
			l := lag(end, committed)
			if rssAt != nil {
				for next < 4 && total-l >= total*int64(next+1)/4 {
					rssAt[next], _ = p.memory()
					next++
				}
			}
			if l == 0 {
				return time.Now()
			}
			last = l
		}
		if gone, perr := p.exited(); gone {
			t.Fatalf("%s exited before it caught up (lag %d): %v\n%s", p.name, last, perr, p.tail(20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not catch up within %v: lag %d (last error %v)\n%s", p.name, bound, last, err, p.tail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// produce writes n records of the workload to topic, in order, and
// returns when the broker acknowledged all of them.
func produce(ctx context.Context, brokers []string, topic string, w *workload, n int) error {
	wr := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchSize: 4000, BatchTimeout: 10 * time.Millisecond}
	defer wr.Close()
	const chunk = 12000
	buf := make([]kafka.Message, 0, chunk)
	for i := 0; i < n; i++ {
		buf = append(buf, w.next(n-1-i))
		if len(buf) == chunk || i == n-1 {
			if err := wr.WriteMessages(ctx, buf...); err != nil {
				return fmt.Errorf("produce to %s: %w", topic, err)
			}
			buf = buf[:0]
		}
	}
	return nil
}

// readAll reads every record of topic below end, one reader per
// partition, and calls fn with each (from several goroutines at once).
func readAll(ctx context.Context, brokers []string, topic string, end map[int]int64, fn func(kafka.Message)) error {
	var wg sync.WaitGroup
	errs := make(chan error, partitions)
	for p, e := range end {
		if e == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					errs <- fmt.Errorf("read %s/%d: %w", topic, p, err)
					return
				}
				fn(m)
				if m.Offset >= e-1 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// series is one scraped Prometheus sample.
type series struct {
	name   string
	labels string // as printed, without the braces
	value  float64
}

// scrape reads every sample of addr's /metrics (text format).
func scrape(addr string) ([]series, error) {
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return parseMetrics(res.Body)
}

func parseMetrics(r io.Reader) ([]series, error) {
	var out []series
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		head := line[:i]
		name, labels, _ := strings.Cut(head, "{")
		out = append(out, series{name: name, labels: strings.TrimSuffix(labels, "}"), value: v})
	}
	return out, s.Err()
}

// label returns the value of label name in a printed label set.
func label(labels, name string) string {
	_, rest, ok := strings.Cut(","+labels, ","+name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// bucketQuantile is the upper bound of the histogram bucket that holds
// quantile q of metric's observations whose label by is value ("+Inf"
// past the last bucket, "?" without observations).
func bucketQuantile(all []series, metric, by, value string, q float64) string {
	type bucket struct{ le, count float64 }
	var bs []bucket
	for _, s := range all {
		if s.name != metric+"_bucket" || label(s.labels, by) != value {
			continue
		}
		le, err := strconv.ParseFloat(label(s.labels, "le"), 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, s.value})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return "?"
	}
	want := q * bs[len(bs)-1].count
	for _, b := range bs {
		if b.count >= want {
			if math.IsInf(b.le, 1) {
				return "+Inf"
			}
			return fmt.Sprintf("%.1f ms", b.le*1e3)
		}
	}
	return "+Inf"
}

// sumBy adds the samples of metric by the value of one label.
func sumBy(all []series, metric, by string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range all {
		if s.name == metric {
			out[label(s.labels, by)] += s.value
		}
	}
	return out
}

// cpuSeconds is the user plus system CPU time a process used so far
// (/proc/PID/stat, in clock ticks of 1/100 s), or -1.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: state is field 3, utime 14, stime 15.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return (utime + stime) / 100
}

// machineCPU is the CPU time all the machine's cores spent busy so far
// (the first line of /proc/stat: every field but idle and iowait, in
// clock ticks of 1/100 s), or -1.
func machineCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	return parseMachineCPU(string(b))
}

func parseMachineCPU(stat string) float64 {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return -1
	}
	// user nice system idle iowait irq softirq steal [guest guest_nice,
	// which user and nice already count]
	var busy float64
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return -1
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy / 100
}

// loadAverage is the first three fields of /proc/loadavg: how busy the
// machine was, to judge a run's noise by.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// brokerPID is the process of the test broker that scripts/kafka.sh
// started, or 0 when the broker is not ours to see.
func brokerPID() int {
	dir := os.Getenv("IDEMSTREAM_TESTENV_DIR")
	if dir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dir, "kafka", "kafka.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || cpuSeconds(pid) < 0 {
		return 0
	}
	return pid
}

// waitHTTP polls url until it answers 200.
func waitHTTP(t *testing.T, p *process, url string, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if gone, perr := p.exited(); gone {
			t.Fatalf("%s exited at start: %v\n%s", p.name, perr, p.tail(20))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not answer 200 within %v\n%s", p.name, url, bound, p.tail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// percentile returns the q-quantile (0..1) of sorted values, nearest rank.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// commandStat is one line of INFO commandstats.
type commandStat struct {
	calls int64
	usec  int64
}

// parseInfo reads the fields of an INFO answer ("name:value" lines) and
// the commandstats lines ("cmdstat_NAME:calls=..,usec=..,...").
func parseInfo(info string) (fields map[string]string, commands map[string]commandStat) {
	fields, commands = map[string]string{}, map[string]commandStat{}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		name, isCmd := strings.CutPrefix(k, "cmdstat_")
		if !isCmd {
			fields[k] = v
			continue
		}
		var c commandStat
		for _, kv := range strings.Split(v, ",") {
			f, val, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch f {
			case "calls":
				c.calls = n
			case "usec":
				c.usec = n
			}
		}
		commands[name] = c
	}
	return fields, commands
}

// serverCPU is used_cpu_sys + used_cpu_user of an INFO cpu answer, in
// seconds.
func serverCPU(fields map[string]string) float64 {
	sys, _ := strconv.ParseFloat(fields["used_cpu_sys"], 64)
	user, _ := strconv.ParseFloat(fields["used_cpu_user"], 64)
	return sys + user
}

// commandDelta is what the server did between two commandstats, by
// command, most time first.
type commandDelta struct {
	name string
	commandStat
}

func diffCommands(before, after map[string]commandStat) []commandDelta {
	var out []commandDelta
	for name, a := range after {
		b := before[name]
		d := commandDelta{name: name, commandStat: commandStat{calls: a.calls - b.calls, usec: a.usec - b.usec}}
		if d.calls > 0 {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].usec != out[j].usec {
			return out[i].usec > out[j].usec
		}
		return out[i].name < out[j].name
	})
	return out
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

func sortedDurations(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}
