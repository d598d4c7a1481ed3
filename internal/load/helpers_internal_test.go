package load

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	s := sortedDurations(d)
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := percentile(s, c.q); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v", got)
	}
}

func TestMedian(t *testing.T) {
	xs := []float64{0.71, 0.5, 0.69}
	if got := median(xs); got != 0.69 {
		t.Errorf("median(%v) = %v, want 0.69", xs, got)
	}
	if xs[0] != 0.71 {
		t.Errorf("median sorted its argument: %v", xs)
	}
	if got := median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("median of 1..4 = %v, want 2.5", got)
	}
}

func TestParseInfoAndDiff(t *testing.T) {
	before := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\n# Commandstats\r\n" +
		"cmdstat_evalsha:calls=10,usec=1000,usec_per_call=100.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_set:calls=5,usec=10,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n"
	after := "# CPU\r\nused_cpu_sys:2.000000\r\nused_cpu_user:3.000000\r\n# Commandstats\r\n" +
		"cmdstat_evalsha:calls=30,usec=5000,usec_per_call=166.67,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_set:calls=5,usec=10,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=100,usec=200,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n"
	fb, cb := parseInfo(before)
	fa, ca := parseInfo(after)
	if got := serverCPU(fa) - serverCPU(fb); got < 1.2499 || got > 1.2501 {
		t.Errorf("cpu delta %v, want 1.25", got)
	}
	d := diffCommands(cb, ca)
	if len(d) != 2 || d[0].name != "evalsha" || d[0].calls != 20 || d[0].usec != 4000 || d[1].name != "get" || d[1].calls != 100 {
		t.Errorf("diff %+v: want evalsha (20 calls, 4000 usec) then get; set unchanged and left out", d)
	}
}

func TestLagCountsUncommittedPartitionsFromZero(t *testing.T) {
	end := map[int]int64{0: 10, 1: 5, 2: 0}
	if got := lag(end, map[int]int64{0: 10, 1: -1}); got != 5 {
		t.Errorf("lag %d, want 5", got)
	}
	if got := lag(end, map[int]int64{0: 10, 1: 5, 2: -1}); got != 0 {
		t.Errorf("lag %d, want 0", got)
	}
}

func TestParseMetricsSumsByLabel(t *testing.T) {
	text := `# HELP idemstream_records_total Input records by outcome.
# TYPE idemstream_records_total counter
idemstream_records_total{outcome="first",pipeline="load"} 7
idemstream_records_total{outcome="replay",pipeline="load"} 3
idemstream_records_total{outcome="first",pipeline="other"} 1
idemstream_store_duration_seconds_sum{op="decide"} 0.25
idemstream_store_duration_seconds_count{op="decide"} 10
go_goroutines 12
`
	all, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	got := sumBy(all, "idemstream_records_total", "outcome")
	if got["first"] != 8 || got["replay"] != 3 || len(got) != 2 {
		t.Errorf("records by outcome %v, want first=8 replay=3", got)
	}
	if got := sumBy(all, "idemstream_store_duration_seconds_count", "op")["decide"]; got != 10 {
		t.Errorf("decide count %v", got)
	}
	if got := label(`outcome="first",pipeline="load"`, "pipeline"); got != "load" {
		t.Errorf("label pipeline = %q", got)
	}
	if got := label(`xpipeline="a",pipeline="b"`, "pipeline"); got != "b" {
		t.Errorf("label pipeline = %q, want b (not the one of xpipeline)", got)
	}
}

func TestCPUSecondsOfThisProcess(t *testing.T) {
	before := cpuSeconds(os.Getpid())
	if before < 0 {
		t.Skip("no /proc here")
	}
	for deadline := time.Now().Add(5 * time.Second); cpuSeconds(os.Getpid()) < before+0.05; {
		if time.Now().After(deadline) {
			t.Fatalf("5 s of spinning moved the CPU time from %v to %v", before, cpuSeconds(os.Getpid()))
		}
		for range 1000000 {
			_ = strconv.Itoa(7)
		}
	}
}

func TestBucketQuantile(t *testing.T) {
	text := `# TYPE idemstream_store_duration_seconds histogram
idemstream_store_duration_seconds_bucket{op="decide",le="0.001"} 50
idemstream_store_duration_seconds_bucket{op="decide",le="0.002"} 98
idemstream_store_duration_seconds_bucket{op="decide",le="0.004"} 99
idemstream_store_duration_seconds_bucket{op="decide",le="+Inf"} 100
idemstream_store_duration_seconds_bucket{op="complete",le="0.001"} 0
idemstream_store_duration_seconds_bucket{op="complete",le="+Inf"} 0
`
	all, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		op   string
		q    float64
		want string
	}{{"decide", 0.5, "1.0 ms"}, {"decide", 0.9, "2.0 ms"}, {"decide", 0.99, "4.0 ms"}, {"decide", 1, "+Inf"}, {"complete", 0.99, "?"}, {"renew", 0.99, "?"}} {
		if got := bucketQuantile(all, "idemstream_store_duration_seconds", "op", c.op, c.q); got != c.want {
			t.Errorf("%s q%v = %q, want %q", c.op, c.q, got, c.want)
		}
	}
}

// TestMakefileDefaultsAreAccepted feeds the values `make load` and
// `make latency` pass when no variable is given through the readers the
// runs use: a default the reader refuses breaks the command a newcomer
// copies first.
func TestMakefileDefaultsAreAccepted(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(moduleRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	// Make keeps a variable's first ?= and drops a trailing comment.
	defaults := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z0-9_]+)[ \t]*\?=(.*)$`).FindAllStringSubmatch(string(src), -1) {
		if _, dup := defaults[m[1]]; !dup {
			v, _, _ := strings.Cut(m[2], "#")
			defaults[m[1]] = strings.TrimSpace(v)
		}
	}
	// Every IDEMSTREAM_ setting the Makefile passes from a variable must
	// be in the one form read here, or it would go unchecked.
	assigned := regexp.MustCompile(`(IDEMSTREAM_[A-Z0-9_]+)="?\$`).FindAllStringSubmatch(string(src), -1)
	passed := regexp.MustCompile(`(IDEMSTREAM_[A-Z0-9_]+)="?\$\(([A-Z0-9_]+)\)(["\s]|$)`).FindAllStringSubmatch(string(src), -1)
	if len(passed) != len(assigned) {
		t.Fatalf("the Makefile passes %d IDEMSTREAM_ settings from variables, %d of them as $(VAR): write the others as IDEMSTREAM_X=$(VAR)", len(assigned), len(passed))
	}
	// Settings the readers take that the Makefile does not pass: their
	// defaults, whatever the caller's environment holds.
	for _, name := range []string{"IDEMSTREAM_LOAD_BOUND", "IDEMSTREAM_LATENCY_CALIBRATE", "IDEMSTREAM_LATENCY_CALIBRATE_RUNS"} {
		t.Setenv(name, "")
	}
	seen := map[string]bool{}
	for _, m := range passed {
		v, ok := defaults[m[2]]
		if !ok {
			t.Errorf("the Makefile passes %s=$(%s) but gives %s no default", m[1], m[2], m[2])
			continue
		}
		t.Setenv(m[1], v)
		seen[m[1]] = true
	}
	for _, name := range []string{"IDEMSTREAM_LOAD_RECORDS", "IDEMSTREAM_LOAD_ROUNDS", "IDEMSTREAM_LOAD_WARMUPS", "IDEMSTREAM_LOAD_PREFILL", "IDEMSTREAM_LOAD_FLOOR", "IDEMSTREAM_LOAD_PAYLOAD", "IDEMSTREAM_LATENCY_RATE", "IDEMSTREAM_LATENCY_DURATION"} {
		if !seen[name] {
			t.Errorf("the Makefile no longer passes %s: this test reads the wrong file", name)
		}
	}
	load := readLoadSettings(t)
	if load.records < 300000 {
		t.Errorf("make load's default backlog is %d records; the issue asks for at least 300,000", load.records)
	}
	if !load.floors {
		t.Errorf("make load leaves the floor runs out by default")
	}
	if load.payload != "json" {
		t.Errorf("make load's default payload is %q, want json (the Avro rounds only when asked for)", load.payload)
	}
	if lat := readLatencySettings(t); lat.rate != 0 {
		t.Errorf("make latency's default rate is %d, want 0 (calibrated in the run)", lat.rate)
	}
}

// LOAD_PAYLOAD is json or avro, and nothing else: a misspelt avro must
// not run the JSON rounds alone and look like an Avro run.
func TestLoadPayloadChoices(t *testing.T) {
	choices := []string{"json", "avro"}
	for v, want := range map[string]string{"": "json", "json": "json", "avro": "avro"} {
		if got, err := parseChoice("IDEMSTREAM_LOAD_PAYLOAD", v, choices); err != nil || got != want {
			t.Errorf("IDEMSTREAM_LOAD_PAYLOAD=%q: %q, %v; want %q", v, got, err, want)
		}
	}
	for _, v := range []string{"AVRO", "Avro", " avro", "protobuf", "0", "1"} {
		if got, err := parseChoice("IDEMSTREAM_LOAD_PAYLOAD", v, choices); err == nil {
			t.Errorf("IDEMSTREAM_LOAD_PAYLOAD=%q accepted as %q", v, got)
		}
	}
}

func TestParseMachineCPU(t *testing.T) {
	stat := "cpu  550571 12 82755 387771 3281 7 3138 276 40 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"
	// user + nice + system + irq + softirq + steal; idle, iowait and the
	// guest times (inside user) left out.
	if got, want := parseMachineCPU(stat), float64(550571+12+82755+7+3138+276)/100; got != want {
		t.Errorf("parseMachineCPU = %v, want %v", got, want)
	}
	if got := parseMachineCPU("intr 1 2 3\n"); got != -1 {
		t.Errorf("parseMachineCPU of no cpu line = %v, want -1", got)
	}
	if machineCPU() < 0 {
		t.Skip("no /proc/stat here")
	}
}
