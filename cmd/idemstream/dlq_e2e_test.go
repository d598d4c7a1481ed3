package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemstream/idemstream/consumer"
	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dlq"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

// outagePipeline is one strict pipeline on the real broker and Redis,
// run in this process with a handler that fails for good while down is
// set: the downstream outage of docs/dlq.md.
type outagePipeline struct {
	t                      *testing.T
	name, in, out, dlqName string
	config                 string
	io                     *sinks.Kafka
	client                 *kafka.Client
	down                   atomic.Bool
}

func startOutagePipeline(t *testing.T) *outagePipeline {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	op := &outagePipeline{t: t}
	op.name, op.in, op.out, op.dlqName = pipelineTopics(t, brokers, "dlq", 3)
	op.config = writeRunConfig(t, brokers, redisAddr, op.name,
		fmt.Sprintf("{name: p, input: %s, output: %s, dlq: %s, key: {format: any}, volatile: [/client_time]}", op.in, op.out, op.dlqName))
	op.client = &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	op.io = sinks.NewKafka(op.client)
	cfg, err := schemas.Load(op.config)
	if err != nil {
		t.Fatal(err)
	}
	handler := consumer.HandlerFunc(func(_ context.Context, cmd consumer.Command) (consumer.Result, error) {
		if op.down.Load() {
			return consumer.Result{}, consumer.Permanent(errors.New("coupon service: 503 Service Unavailable"))
		}
		return consumer.Result{Value: cmd.Record.Value}, nil
	})
	svc, err := consumer.NewService(cfg, consumer.ServiceOptions{Handlers: map[string]consumer.Handler{"p": handler}, SettleWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	testenv.RunUntilEnd(t, svc.Run)
	return op
}

// send produces commands keyed by their idempotency key (nil: no key).
func (op *outagePipeline) send(cmds ...[2]string) {
	op.t.Helper()
	var recs []produced
	for _, c := range cmds {
		r := produced{topic: op.in, partition: -1, body: c[1]}
		if c[0] != "" {
			r.key, r.headers = []byte(c[0]), key(c[0])
		}
		recs = append(recs, r)
	}
	produce(op.t, op.io, recs...)
}

// drained waits until the pipeline has committed every record of its
// input: each has its outcome.
func (op *outagePipeline) drained() {
	op.t.Helper()
	parts := []int{0, 1, 2}
	waitUntil(op.t, 90*time.Second, "every input record decided and committed", func() bool {
		ends, err := op.io.EndOffsets(context.Background(), op.in, parts)
		if err != nil {
			return false
		}
		res, err := op.client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: op.name + ".p", Topics: map[string][]int{op.in: parts}})
		if err != nil {
			return false
		}
		for _, p := range res.Topics[op.in] {
			// A partition that never held a record has no commit.
			if p.Error != nil || p.CommittedOffset != ends[p.Partition] && !(p.CommittedOffset < 0 && ends[p.Partition] == 0) {
				return false
			}
		}
		return len(res.Topics[op.in]) == len(parts)
	})
}

// results counts the result records of each idempotency key.
func (op *outagePipeline) results() map[string]int {
	out := map[string]int{}
	for _, r := range readTopic(op.t, op.io, op.out) {
		out[hv(r, "idemstream-key")]++
	}
	return out
}

// redriven are the input records a redrive wrote, by the dead letter
// each names.
func (op *outagePipeline) redriven() map[string]int {
	out := map[string]int{}
	for _, r := range readTopic(op.t, op.io, op.in) {
		if of := hv(r, dlq.HeaderRedriveOf); of != "" {
			out[of]++
		}
	}
	return out
}

func (op *outagePipeline) cli(args ...string) cliResult {
	op.t.Helper()
	return runCLIContext(context.Background(), op.config, args...)
}

type cliResult struct {
	code           int
	stdout, stderr string
}

func runCLIContext(ctx context.Context, config string, args ...string) cliResult {
	var stdout, stderr strings.Builder
	full := append(args[:len(args):len(args)], "-c", config)
	code := run(ctx, full, strings.NewReader(""), &stdout, &stderr, func(string) string { return "" })
	return cliResult{code, stdout.String(), stderr.String()}
}

// outage sends healthy commands that succeed, then, while the handler is
// down, failing commands (f-0 twice), 5 conflicts with healthy ones, 3
// malformed payloads and 2 records without a key; then the handler
// recovers.
func (op *outagePipeline) outage(healthy, failing int) {
	op.t.Helper()
	for i := range healthy {
		op.send([2]string{fmt.Sprintf("s-%d", i), fmt.Sprintf(`{"coupon":%d,"amount":50,"client_time":"09:00:%02d"}`, i, i)})
	}
	op.drained()
	op.down.Store(true)
	var cmds [][2]string
	for i := range failing {
		cmds = append(cmds, [2]string{fmt.Sprintf("f-%d", i), fmt.Sprintf(`{"coupon":%d,"amount":50,"client_time":"10:00:%02d"}`, 100+i, i%60)})
	}
	for i := range 5 { // the same keys as healthy commands, another amount
		cmds = append(cmds, [2]string{fmt.Sprintf("s-%d", i), fmt.Sprintf(`{"coupon":%d,"amount":70,"client_time":"10:01:00"}`, i)})
	}
	cmds = append(cmds, [2]string{"m-1", `{"coupon":`}, [2]string{"m-2", `[1,`}, [2]string{"m-3", `{"a":1,"a":2}`}, [2]string{"", `{"coupon":1}`}, [2]string{"", `{}`})
	op.send(cmds...)
	op.drained()
	// A client's retry of a failed command (another client_time: the
	// same request) runs the handler again, which fails again.
	op.send([2]string{"f-0", `{"coupon":100,"amount":50,"client_time":"10:05:00"}`})
	op.drained()
	op.down.Store(false)
}

// TestDLQRedriveAfterOutage is issue #39's proof on the real broker and
// Redis. A pipeline's handler fails for good for a while (60 commands,
// one of them sent twice, dead-lettered handler_failed beside conflicts,
// malformed payloads and records without a key), then recovers, and one
// failed command's client retries it and gets its result. dlq summary
// counts exactly what the topic holds; dlq show explains a conflict
// against its first copy. Then: a redrive SIGKILLed half-way, the same
// redrive run again and interrupted by SIGINT (it skips what the killed
// one sent), run once more to the end (it skips what both sent), and a
// second redrive of every reason (it sends nothing). The retried
// command's dead letter is never sent. After each, every command has
// exactly one result, no dead letter was added, each dead letter was
// written to the input at most once, and no conflict or invalid record
// was sent.
func TestDLQRedriveAfterOutage(t *testing.T) {
	op := startOutagePipeline(t)
	healthy, failing := 10, 60
	op.outage(healthy, failing)
	dead := readTopic(t, op.io, op.dlqName)
	if len(dead) != 71 {
		t.Fatalf("%d dead letters, want 71 (61 handler_failed, 5 conflict, 3 malformed_payload, 2 missing_key)", len(dead))
	}
	checkSummary(t, op)
	checkShowConflict(t, op, dead)

	// The client of the last failed command retries it now (the same
	// request): it succeeds, so its dead letter must not be sent.
	retried := fmt.Sprintf("f-%d", failing-1)
	op.send([2]string{retried, fmt.Sprintf(`{"coupon":%d,"amount":50,"client_time":"10:30:00"}`, 100+failing-1)})
	op.drained()
	if n := op.results()[retried]; n != 1 {
		t.Fatalf("%s: %d results after its client's retry, want 1", retried, n)
	}
	toSend := failing - 1

	// A dry run lists and sends nothing.
	r := op.cli("dlq", "redrive", "--reason", "handler_failed", "--dry-run")
	if lines := strings.Count("\n"+r.stdout, "\nwould send "); r.code != 0 || lines != toSend || len(op.redriven()) != 0 ||
		!strings.Contains(r.stdout, "has_result 1") {
		t.Fatalf("dry run: exit %d, %d lines, %d redriven:\n%s%s", r.code, lines, len(op.redriven()), r.stdout, r.stderr)
	}

	bin := filepath.Join(t.TempDir(), "idemstream")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sentFirst := killedRedrive(t, op, bin)
	op.drained()
	checkRedrivenOnce(t, op, dead, "the killed redrive")

	// Run again, and interrupted: it skips what the killed one sent.
	rep := interruptedRedrive(t, op, bin)
	if rep.Skipped[dlq.SkippedRedrivenBefore] != int64(len(sentFirst)) {
		t.Errorf("the redrive run again skipped %d as redriven before, want the %d the killed one sent", rep.Skipped[dlq.SkippedRedrivenBefore], len(sentFirst))
	}
	op.drained()
	checkRedrivenOnce(t, op, dead, "the interrupted redrive")

	// Run again to the end: the rest, and nothing sent before.
	before := len(op.redriven())
	rep = redriveJSON(t, op, "--reason", "handler_failed", "--rate", "100000")
	wantSkipped := map[string]int64{dlq.SkippedRedrivenBefore: int64(before), dlq.SkippedDuplicate: 1, dlq.SkippedHasResult: 1}
	if rep.Sent != int64(toSend-before) || fmt.Sprint(rep.Skipped) != fmt.Sprint(wantSkipped) || len(rep.Refused) != 0 || rep.Interrupted {
		t.Errorf("the redrive run to the end: %+v; want %d sent, skipped %v", rep, toSend-before, wantSkipped)
	}
	op.drained()
	checkExactlyOnce(t, op, healthy, failing)

	// A second redrive of every dead letter: handler_failed only, the
	// others refused; nothing sent, every command having its result.
	rep = redriveJSON(t, op, "--rate", "100000")
	wantRefused := map[dedupe.Reason]int64{dedupe.ReasonConflict: 5, dedupe.ReasonMalformedPayload: 3, dedupe.ReasonMissingKey: 2}
	wantSkipped[dlq.SkippedRedrivenBefore] = int64(toSend)
	if rep.Sent != 0 || fmt.Sprint(rep.Refused) != fmt.Sprint(wantRefused) || rep.Selected != 71 || fmt.Sprint(rep.Skipped) != fmt.Sprint(wantSkipped) {
		t.Errorf("the second redrive: sent %d, refused %v, skipped %v, selected %d; want 0, %v, %v, 71", rep.Sent, rep.Refused, rep.Skipped, rep.Selected, wantRefused, wantSkipped)
	}
	op.drained()
	checkExactlyOnce(t, op, healthy, failing)

	total := checkOnlyHandlerFailures(t, op, dead, retried)
	t.Logf("%d records redriven in four runs (%d by the killed one); %d results", total, len(sentFirst), len(readTopic(t, op.io, op.out)))
}

// checkOnlyHandlerFailures: every record a redrive wrote names a
// handler_failed dead letter of another key than retried, each one
// record; every failed command's result but retried's came from one. It
// returns how many records the redrives wrote.
func checkOnlyHandlerFailures(t *testing.T, op *outagePipeline, dead []sinks.Fetched, retried string) int {
	t.Helper()
	reasons, keys := map[string]string{}, map[string]string{}
	for _, d := range dead {
		at := fmt.Sprintf("%s/%d/%d", op.dlqName, d.Partition, d.Offset)
		reasons[at], keys[at] = hv(d, "idemstream-reason"), hv(d, "idemstream-key")
	}
	total := 0
	for of, n := range op.redriven() {
		total += n
		if reasons[of] != "handler_failed" || n != 1 || keys[of] == retried {
			t.Errorf("%s (%s of %s) was redriven %d times", of, reasons[of], keys[of], n)
		}
	}
	// The failed commands' results came from redriven records.
	for _, r := range readTopic(t, op.io, op.out) {
		key, of := hv(r, "idemstream-key"), hv(r, dlq.HeaderRedriveOf)
		switch {
		case key == retried && of != "":
			t.Errorf("result of %s, which its client's retry got through, names %s in idemstream-redrive-of", key, of)
		case key != retried && strings.HasPrefix(key, "f-") && reasons[of] != "handler_failed":
			t.Errorf("result of %s names no handler_failed dead letter in idemstream-redrive-of (%q)", key, of)
		}
	}
	return total
}

func checkSummary(t *testing.T, op *outagePipeline) {
	t.Helper()
	r := op.cli("dlq", "summary", "-o", "json")
	var sum dlq.Summary
	if err := json.Unmarshal([]byte(r.stdout), &sum); r.code != 0 || err != nil {
		t.Fatalf("summary: exit %d, %v:\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	got := map[dedupe.Reason][2]int64{}
	for _, x := range sum.Reasons {
		got[x.Reason] = [2]int64{x.Count, x.Keys}
	}
	want := map[dedupe.Reason][2]int64{dedupe.ReasonHandlerFailed: {61, 60}, dedupe.ReasonConflict: {5, 5},
		dedupe.ReasonMalformedPayload: {3, 3}, dedupe.ReasonMissingKey: {2, 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) || sum.DeadLetters != 71 || sum.Records != 71 || sum.Partitions != 3 || sum.Keys != 68 {
		t.Errorf("summary: reasons %v (want %v), %d dead letters of %d records, %d partitions, %d keys", got, want, sum.DeadLetters, sum.Records, sum.Partitions, sum.Keys)
	}
	if len(sum.ConflictPaths) != 1 || sum.ConflictPaths[0] != (dlq.PathCount{Pointer: "/amount", Count: 5}) || len(sum.FirstSources) != 5 {
		t.Errorf("conflict paths %+v, first sources %+v", sum.ConflictPaths, sum.FirstSources)
	}
	var hours int64
	for _, h := range sum.Hours {
		hours += h.Count
	}
	if hours != 71 || sum.Errors[0].Count != 61 || sum.Errors[0].Error != "coupon service: 503 Service Unavailable" {
		t.Errorf("hours count %d, commonest error %+v", hours, sum.Errors[0])
	}
	r = op.cli("dlq", "summary")
	if r.code != 0 || !strings.Contains(r.stdout, "71 dead letters of 68 keys") || r.stderr != "" {
		t.Errorf("summary text: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func checkShowConflict(t *testing.T, op *outagePipeline, dead []sinks.Fetched) {
	t.Helper()
	for _, d := range dead {
		if hv(d, "idemstream-reason") != "conflict" {
			continue
		}
		r := op.cli("dlq", "show", fmt.Sprintf("%d/%d", d.Partition, d.Offset), "-o", "json")
		var s dlq.Shown
		if err := json.Unmarshal([]byte(r.stdout), &s); r.code != 0 || err != nil {
			t.Fatalf("show: exit %d, %v:\n%s%s", r.code, err, r.stdout, r.stderr)
		}
		if s.First == nil || !s.First.Found || s.Diff == nil || fmt.Sprint(s.Diff.Paths) != "[/amount]" || s.Redrive.Allowed ||
			s.First.Fingerprint != s.Diff.FirstFingerprint || s.Fingerprint != s.Diff.Fingerprint {
			t.Errorf("show %d/%d: %s", d.Partition, d.Offset, r.stdout)
		}
		return
	}
	t.Error("no conflict to show")
}

// redriveProcess runs `idemstream dlq redrive --reason handler_failed
// --rate 20 -o json` as a process of its own, sends it sig once the input
// holds 10 more redriven records than before, and returns its exit code,
// its output and how many records it wrote.
func redriveProcess(t *testing.T, op *outagePipeline, bin string, sig syscall.Signal) (code int, stdout, stderr string, wrote int) {
	t.Helper()
	count := func() int {
		n := 0
		for _, c := range op.redriven() {
			n += c
		}
		return n
	}
	before := count()
	var out, errOut strings.Builder
	cmd := exec.Command(bin, "dlq", "redrive", "-c", op.config, "--reason", "handler_failed", "--rate", "20", "-o", "json")
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitUntil(t, 60*time.Second, "the redrive to send 10 records", func() bool { return count() >= before+10 })
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String(), count() - before
}

// killedRedrive SIGKILLs a redrive half-way and returns the dead letters
// it sent.
func killedRedrive(t *testing.T, op *outagePipeline, bin string) map[string]int {
	t.Helper()
	_, _, _, wrote := redriveProcess(t, op, bin, syscall.SIGKILL)
	sent := op.redriven()
	if wrote < 10 || wrote >= 59 || len(sent) != wrote {
		t.Fatalf("the killed redrive wrote %d records for %d dead letters: want between 10 and 58, one each", wrote, len(sent))
	}
	return sent
}

// interruptedRedrive interrupts a redrive once it has written 10 records
// (SIGINT, as Ctrl-C does): it prints what it sent, says to run it again,
// and exits 1. It returns the report printed.
func interruptedRedrive(t *testing.T, op *outagePipeline, bin string) dlq.RedriveReport {
	t.Helper()
	code, stdout, stderr, wrote := redriveProcess(t, op, bin, syscall.SIGINT)
	var rep dlq.RedriveReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != 1 || !rep.Interrupted ||
		!strings.HasPrefix(stderr, "idemstream dlq: stopped after sending") || !strings.Contains(stderr, "run the same command again") ||
		strings.Count(stderr, "\n") != 1 {
		t.Fatalf("interrupted redrive: exit %d (%v):\n%s%s", code, err, stdout, stderr)
	}
	// A write cut by the interruption may have been appended
	// unacknowledged: up to one write (a burst, 2 at 20/s) more.
	if rep.Sent < 10 || rep.Sent >= 59 || int64(wrote) < rep.Sent || int64(wrote) > rep.Sent+2 {
		t.Fatalf("interrupted redrive reports %d sent, %d written: want 10 to 58, and 0 to 2 more written", rep.Sent, wrote)
	}
	return rep
}

func redriveJSON(t *testing.T, op *outagePipeline, args ...string) dlq.RedriveReport {
	t.Helper()
	r := op.cli(append([]string{"dlq", "redrive", "-o", "json"}, args...)...)
	var rep dlq.RedriveReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != 0 || err != nil {
		t.Fatalf("redrive %v: exit %d, %v:\n%s%s", args, r.code, err, r.stdout, r.stderr)
	}
	return rep
}

// checkExactlyOnce: every command, healthy or failed, has one result,
// and the dead-letter topic holds what it held.
func checkExactlyOnce(t *testing.T, op *outagePipeline, healthy, failing int) {
	t.Helper()
	results := op.results()
	for i := range healthy {
		if n := results[fmt.Sprintf("s-%d", i)]; n != 1 {
			t.Errorf("s-%d: %d results, want 1", i, n)
		}
	}
	for i := range failing {
		if n := results[fmt.Sprintf("f-%d", i)]; n != 1 {
			t.Errorf("f-%d: %d results, want 1", i, n)
		}
	}
	if len(results) != healthy+failing {
		t.Errorf("results for %d keys, want %d", len(results), healthy+failing)
	}
	if n := len(readTopic(t, op.io, op.dlqName)); n != 71 {
		t.Errorf("%d dead letters, want the 71 of the outage: a redriven record came back", n)
	}
}

// checkRedrivenOnce: after a redrive stopped half-way, the command of
// every dead letter written to the input has one result, no command has
// more, and the dead-letter topic holds what it held.
func checkRedrivenOnce(t *testing.T, op *outagePipeline, dead []sinks.Fetched, after string) {
	t.Helper()
	results := op.results()
	for of := range op.redriven() {
		if n := results[keyOfDeadLetter(t, dead, of)]; n != 1 {
			t.Errorf("%s: %d results after %s, want 1", of, n, after)
		}
	}
	for key, n := range results {
		if n > 1 {
			t.Errorf("%s: %d results after %s", key, n, after)
		}
	}
	if n := len(readTopic(t, op.io, op.dlqName)); n != 71 {
		t.Errorf("%d dead letters after %s, want the 71 of the outage: a redriven record came back", n, after)
	}
}

func keyOfDeadLetter(t *testing.T, dead []sinks.Fetched, of string) string {
	t.Helper()
	pos, err := dlq.ParsePosition(of)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dead {
		if d.Partition == pos.Partition && d.Offset == pos.Offset {
			return hv(d, "idemstream-key")
		}
	}
	t.Fatalf("no dead letter at %s", of)
	return ""
}
