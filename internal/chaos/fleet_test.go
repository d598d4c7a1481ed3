package chaos

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemstream/idemstream/internal/testenv"
)

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

// buildBinary builds idemstream once, without -race: the instances are
// the system under test, the race detector runs in this test's process.
func buildBinary(t *testing.T, root string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "idemstream")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/idemstream")
	cmd.Dir = root
	cmd.Env = os.Environ()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/idemstream: %v\n%s", err, out)
	}
	return bin
}

// childEnv is this process's environment without IDEMSTREAM_* variables:
// the instances take everything from their config file and flags.
func childEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMSTREAM_") {
			out = append(out, kv)
		}
	}
	return out
}

// proc is one incarnation of an instance: an OS process.
type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	err    error // from Wait, valid once done is closed
	killed bool  // we sent SIGKILL or SIGTERM
}

// slot is one instance, restarted as often as it is killed, always with
// the same config, metrics port and log file. An optional slot (the member
// that joins and leaves) runs only when the test starts it.
type slot struct {
	id       int
	addr     string
	logPath  string
	starts   int
	cur      *proc
	optional bool
	paused   bool // SIGSTOPped
}

type fleet struct {
	t   *testing.T
	bin string
	// previous, when set (IDEMSTREAM_CHAOS_PREVIOUS), is another release's
	// binary, which the odd-numbered slots run: a group in the middle of a
	// rolling upgrade.
	previous string
	// format is the entry format the slots write: text, compact, or
	// mixed (even slots compact, odd text: a group in the middle of the
	// second step of docs/operations.md, "Upgrading to compact entries").
	format  string
	config  string
	mu      sync.Mutex
	slots   []*slot
	kills   int
	starts  int
	crashes []string // unexpected exits
	stopped bool
}

// newFleet makes n instances that always run, and optional more that run
// only when started (join) and stopped again (leave).
func newFleet(t *testing.T, bin, config, logDir string, n, optional int) *fleet {
	f := &fleet{t: t, bin: bin, config: config}
	for i := range n + optional {
		f.slots = append(f.slots, &slot{id: i, addr: testenv.FreeAddr(t), logPath: filepath.Join(logDir, fmt.Sprintf("instance-%d.log", i)),
			optional: i >= n})
	}
	t.Cleanup(f.killAll)
	return f
}

// start starts slot s; the caller holds f.mu.
func (f *fleet) start(s *slot) {
	f.t.Helper()
	s.starts++
	f.starts++
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		f.t.Errorf("instance %d log: %v", s.id, err) // not Fatalf: called from the fault goroutines too
		return
	}
	defer logf.Close() // the child keeps its own descriptor
	fmt.Fprintf(logf, "==== chaos: start %d of instance %d at %s\n", s.starts, s.id, time.Now().Format(time.RFC3339Nano))
	// Every timing at its default: --settle-wait (45s, 1.5 × the
	// cluster's replica.lag.time.max.ms), pending_timeout, the session
	// timeout.
	bin := f.bin
	if f.previous != "" && s.id%2 == 1 {
		bin = f.previous
	}
	fmt.Fprintf(logf, "==== chaos: binary %s\n", bin)
	cmd := exec.Command(bin, "run", "--config", f.config, "--metrics-addr", s.addr, "--log-format", "text")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Each permanent slot is one identity, as a StatefulSet's pod name
	// would be: a member killed, or stopped in order, and started again
	// takes its partitions back as a static member (KIP-345). The member
	// that joins and leaves is dynamic, as an autoscaled one would be. A
	// previous release ignores the variable and joins as a dynamic member.
	cmd.Env = childEnv()
	if !s.optional {
		cmd.Env = append(cmd.Env, fmt.Sprintf("IDEMSTREAM_INSTANCE_ID=chaos-%d", s.id))
	}
	if f.format == "compact" || f.format == "mixed" && s.id%2 == 0 {
		cmd.Env = append(cmd.Env, "IDEMSTREAM_REDIS_ENTRY_FORMAT=compact")
	}
	// Should this test process die, its instances die with it.
	cmd.SysProcAttr = testenv.ChildProcAttr()
	if err := cmd.Start(); err != nil {
		f.t.Errorf("start instance %d: %v", s.id, err)
		return
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	s.cur = p
	go func() {
		p.err = cmd.Wait()
		f.mu.Lock()
		unexpected := !p.killed
		if unexpected {
			f.crashes = append(f.crashes, fmt.Sprintf("instance %d (pid %d, start %d) exited by itself: %v", s.id, cmd.Process.Pid, s.starts, p.err))
		}
		f.mu.Unlock()
		close(p.done)
		if unexpected && !s.optional {
			// As a supervisor would (systemd, Kubernetes): the crash is
			// reported, and the member comes back, so that the run goes on
			// proving what it can.
			appendLog(s.logPath, fmt.Sprintf("==== chaos: instance %d (pid %d) exited by itself (%v); restarting it\n", s.id, cmd.Process.Pid, p.err))
			time.Sleep(restartAfter)
			f.restart(s.id)
		}
	}()
}

func (f *fleet) startAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.slots {
		if !s.optional {
			f.start(s)
		}
	}
}

// kill SIGKILLs slot i and waits until the process is gone.
func (f *fleet) kill(i int) {
	f.mu.Lock()
	s := f.slots[i]
	p := s.cur
	if p == nil || f.stopped {
		f.mu.Unlock()
		return
	}
	p.killed = true
	f.kills++
	_ = p.cmd.Process.Kill()
	f.mu.Unlock()
	<-p.done
	f.mu.Lock()
	if s.cur == p {
		s.cur = nil
	}
	f.mu.Unlock()
	appendLog(s.logPath, fmt.Sprintf("==== chaos: SIGKILL of instance %d (pid %d) at %s\n", s.id, p.cmd.Process.Pid, time.Now().Format(time.RFC3339Nano)))
}

// restart starts slot i again (if not running).
func (f *fleet) restart(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.slots[i]
	if f.stopped {
		return
	}
	if s.cur != nil {
		select {
		case <-s.cur.done:
		default:
			return // running
		}
	}
	f.start(s)
}

// ensureRunning restarts every instance that is not running (one that
// exited by itself is reported by crashes, and restarted here), except the
// optional ones.
func (f *fleet) ensureRunning() {
	for i, s := range f.slots {
		if !s.optional {
			f.restart(i)
		}
	}
}

// term stops slot i gracefully (SIGTERM) and waits up to timeout for it to
// exit; it returns how long that took and a problem when it did not exit
// with status 0 in time (then it is SIGKILLed).
func (f *fleet) term(i int, timeout time.Duration) (time.Duration, string) {
	f.mu.Lock()
	s := f.slots[i]
	p := s.cur
	if p == nil || f.stopped {
		f.mu.Unlock()
		return 0, ""
	}
	select {
	case <-p.done:
		// It exited by itself before the signal: a crash, reported as such.
		f.mu.Unlock()
		return 0, ""
	default:
	}
	p.killed = true
	began := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	f.mu.Unlock()
	appendLog(s.logPath, fmt.Sprintf("==== chaos: SIGTERM of instance %d (pid %d) at %s\n", s.id, p.cmd.Process.Pid, began.Format(time.RFC3339Nano)))
	problem := ""
	select {
	case <-p.done:
		if p.err != nil {
			problem = fmt.Sprintf("instance %d (pid %d): exit after SIGTERM: %v", s.id, p.cmd.Process.Pid, p.err)
		}
	case <-time.After(timeout):
		problem = fmt.Sprintf("instance %d (pid %d): still running %v after SIGTERM; killed", s.id, p.cmd.Process.Pid, timeout)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	took := time.Since(began)
	f.mu.Lock()
	if s.cur == p {
		s.cur = nil
	}
	f.mu.Unlock()
	return took, problem
}

// freeze SIGSTOPs slot i: the process keeps its sockets and its state,
// and answers nothing (a long GC pause, a frozen VM); thaw lets it go on.
func (f *fleet) freeze(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.slots[i]
	if s.cur == nil || f.stopped {
		return
	}
	_ = s.cur.cmd.Process.Signal(syscall.SIGSTOP)
	s.paused = true
	appendLog(s.logPath, fmt.Sprintf("==== chaos: SIGSTOP of instance %d (pid %d) at %s\n", s.id, s.cur.cmd.Process.Pid, time.Now().Format(time.RFC3339Nano)))
}

func (f *fleet) thaw(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.slots[i]
	if s.cur == nil {
		s.paused = false
		return
	}
	_ = s.cur.cmd.Process.Signal(syscall.SIGCONT)
	s.paused = false
	appendLog(s.logPath, fmt.Sprintf("==== chaos: SIGCONT of instance %d (pid %d) at %s\n", s.id, s.cur.cmd.Process.Pid, time.Now().Format(time.RFC3339Nano)))
}

// running lists the slots (not optional) that run and are not frozen.
func (f *fleet) running() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for i, s := range f.slots {
		if s.optional || s.cur == nil || s.paused {
			continue
		}
		select {
		case <-s.cur.done:
		default:
			out = append(out, i)
		}
	}
	return out
}

// inflight reads slot i's idemstream_inflight_records: records fetched
// and not yet committed or dropped, so > 0 means a batch is in hand.
func (f *fleet) inflight(i int) (float64, bool) {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + f.slots[i].addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "idemstream_inflight_records{") {
			var v float64
			if _, err := fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}

// waitInflight polls slot i until it holds records in flight, up to
// timeout; it reports whether it did.
func (f *fleet) waitInflight(i int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if n, ok := f.inflight(i); ok && n > 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readyOne reports whether slot i answers /readyz with 200.
func (f *fleet) readyOne(i int) bool {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + f.slots[i].addr + "/readyz")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady polls until slot i is ready (a member of a generation), up to
// timeout.
func (f *fleet) waitReady(i int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !f.readyOne(i) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// stopAll sends SIGTERM to every instance and waits for each to exit;
// it returns one line per instance that did not exit cleanly.
func (f *fleet) stopAll(timeout time.Duration) []string {
	f.mu.Lock()
	f.stopped = true
	var procs []*proc
	var slots []*slot
	for _, s := range f.slots {
		if s.cur != nil {
			s.cur.killed = true
			_ = s.cur.cmd.Process.Signal(syscall.SIGCONT)
			s.paused = false
			_ = s.cur.cmd.Process.Signal(syscall.SIGTERM)
			procs = append(procs, s.cur)
			slots = append(slots, s)
		}
	}
	f.mu.Unlock()
	var problems []string
	deadline := time.After(timeout)
	for i, p := range procs {
		select {
		case <-p.done:
			if p.err != nil {
				problems = append(problems, fmt.Sprintf("instance %d (pid %d): exit after SIGTERM: %v", slots[i].id, p.cmd.Process.Pid, p.err))
			}
		case <-deadline:
			problems = append(problems, fmt.Sprintf("instance %d (pid %d): still running %v after SIGTERM; killed", slots[i].id, p.cmd.Process.Pid, timeout))
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	return problems
}

// killAll is the cleanup: nothing outlives the test.
func (f *fleet) killAll() {
	f.mu.Lock()
	f.stopped = true
	var procs []*proc
	for _, s := range f.slots {
		if s.cur != nil {
			s.cur.killed = true
			_ = s.cur.cmd.Process.Kill()
			procs = append(procs, s.cur)
		}
	}
	f.mu.Unlock()
	for _, p := range procs {
		<-p.done
	}
}

func (f *fleet) crashList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.crashes...)
}

func (f *fleet) counts() (kills, starts int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kills, f.starts
}

// ready reports whether every instance that always runs answers /readyz
// with 200.
func (f *fleet) ready() bool {
	for i, s := range f.slots {
		if !s.optional && !f.readyOne(i) {
			return false
		}
	}
	return true
}

func appendLog(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line)
}

// logLines returns the lines of the instance logs that contain any of
// needles (up to max), prefixed with the file's name.
func (f *fleet) logLines(max int, needles ...string) []string {
	var out []string
	for _, s := range f.slots {
		fh, err := os.Open(s.logPath)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			for _, n := range needles {
				if strings.Contains(line, n) {
					out = append(out, filepath.Base(s.logPath)+": "+line)
					break
				}
			}
			if len(out) >= max {
				fh.Close()
				return out
			}
		}
		fh.Close()
	}
	return out
}

// tail returns the last n lines of each instance log.
func (f *fleet) tail(n int) string {
	var b strings.Builder
	for _, s := range f.slots {
		data, err := os.ReadFile(s.logPath)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		fmt.Fprintf(&b, "---- last %d lines of %s\n%s\n", len(lines), s.logPath, strings.Join(lines, "\n"))
	}
	return b.String()
}

// countLines counts, per marker, the lines of every instance log that
// contain it.
func (f *fleet) countLines(markers ...string) map[string]int {
	out := map[string]int{}
	for _, s := range f.slots {
		data, err := os.ReadFile(s.logPath)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			for _, m := range markers {
				if strings.Contains(line, m) {
					out[m]++
				}
			}
		}
	}
	return out
}

// waitServing waits until every instance answers /healthz: its signal
// handler is in place, so a SIGTERM is a graceful stop and not the
// default action on a process still starting.
func (f *fleet) waitServing(timeout time.Duration) bool {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	for _, s := range f.slots {
		if s.optional {
			continue
		}
		for {
			resp, err := client.Get("http://" + s.addr + "/healthz")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return true
}

// chaosEntryFormat is IDEMSTREAM_CHAOS_ENTRY_FORMAT: text, compact or
// mixed (the default: even slots write compact entries, odd ones text,
// so that every run holds both formats and each member reads the
// other's). With a previous release in the group it is text: a release
// before the compact format reads a compact entry as none.
func chaosEntryFormat(t *testing.T, previous bool) string {
	f := os.Getenv("IDEMSTREAM_CHAOS_ENTRY_FORMAT")
	switch {
	case f == "" && previous:
		f = "text"
	case f == "":
		f = "mixed"
	case f != "text" && previous:
		t.Fatalf("IDEMSTREAM_CHAOS_ENTRY_FORMAT=%s with a previous release in the group: it would read compact entries as none", f)
	case f != "text" && f != "compact" && f != "mixed":
		t.Fatalf("IDEMSTREAM_CHAOS_ENTRY_FORMAT=%s: want text, compact or mixed", f)
	}
	t.Logf("entry format: %s", f)
	return f
}
