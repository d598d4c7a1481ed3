package testenv

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// RedisWatch records, while a failover test runs, what every Redis server
// and Sentinel believed: each server's role, replication id and offset,
// whom it replicates, its number of keys; each Sentinel's master, epoch
// and failover state. It samples every 100 ms and keeps a line only when
// an entity's state changed, so that a failed run explains itself
// (Report): which node was master when, whose dataset was replaced, which
// Sentinel moved first.
type RedisWatch struct {
	start     time.Time
	servers   []watched
	sentinels []watched
	master    string // the name Sentinels monitor

	mu     sync.Mutex
	lines  []string
	last   map[string]string
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

type watched struct{ name, addr string }

// WatchRedis starts sampling servers (name → address, in the order
// given as pairs) and the Sentinels that monitor master; it stops when
// the test ends or Stop is called.
func WatchRedis(t testing.TB, master string, sentinels []string, servers ...string) *RedisWatch {
	t.Helper()
	w := &RedisWatch{start: time.Now(), master: master, last: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	for i := 0; i+1 < len(servers); i += 2 {
		w.servers = append(w.servers, watched{servers[i], servers[i+1]})
	}
	for i, a := range sentinels {
		w.sentinels = append(w.sentinels, watched{fmt.Sprintf("sentinel%d", i), a})
	}
	go w.run()
	t.Cleanup(w.Stop)
	return w
}

// Stop ends the sampling; the timeline stays readable. Idempotent.
func (w *RedisWatch) Stop() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.stop)
	w.mu.Unlock()
	<-w.done
}

// Mark writes a line of the test's own (a fault injected, a phase begun)
// into the timeline.
func (w *RedisWatch) Mark(format string, args ...any) {
	w.add("test", fmt.Sprintf(format, args...))
}

func (w *RedisWatch) run() {
	defer close(w.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		w.sample()
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
	}
}

func (w *RedisWatch) sample() {
	for _, s := range w.servers {
		w.note(s.name, serverState(s.addr))
	}
	for _, s := range w.sentinels {
		w.note(s.name, sentinelState(s.addr, w.master))
	}
}

// note keeps state as a line when it differs from the entity's last one.
func (w *RedisWatch) note(name, state string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last[name] == state {
		return
	}
	w.last[name] = state
	w.lines = append(w.lines, fmt.Sprintf("%7.2fs %-10s %s", time.Since(w.start).Seconds(), name, state))
}

func (w *RedisWatch) add(name, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, fmt.Sprintf("%7.2fs %-10s %s", time.Since(w.start).Seconds(), name, text))
}

// serverState is one line of what a server says of itself.
func serverState(addr string) string {
	info, err := RedisCommand(addr, "INFO", "replication")
	if err != nil {
		return "down (" + firstLine(err.Error()) + ")"
	}
	f := infoFields(info)
	keys, _ := RedisCommand(addr, "DBSIZE")
	s := fmt.Sprintf("role=%s replid=%.8s offset=%s keys=%s", f["role"], f["master_replid"], f["master_repl_offset"], keys)
	if f["role"] == "slave" {
		s += fmt.Sprintf(" of=%s:%s link=%s", f["master_host"], f["master_port"], f["master_link_status"])
		if f["master_sync_in_progress"] == "1" {
			s += " syncing"
		}
	} else {
		s += " replicas=" + f["connected_slaves"]
	}
	return s
}

// sentinelState is one line of what a Sentinel believes of the master.
func sentinelState(addr, master string) string {
	rep, err := RedisCommand(addr, "SENTINEL", "MASTER", master)
	if err != nil {
		return "down (" + firstLine(err.Error()) + ")"
	}
	f := pairs(rep)
	return fmt.Sprintf("master=%s:%s flags=%s epoch=%s failover=%s replicas=%s", f["ip"], f["port"], f["flags"], f["config-epoch"], f["failover-state"], f["num-slaves"])
}

func infoFields(info string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			out[k] = v
		}
	}
	return out
}

// pairs reads a flat reply of RedisCommand (fields separated by "\n") as
// alternating names and values.
func pairs(rep string) map[string]string {
	f := strings.Split(rep, "\n")
	out := map[string]string{}
	for i := 0; i+1 < len(f); i += 2 {
		out[f[i]] = f[i+1]
	}
	return out
}

// SentinelEvents returns the events a Sentinel logged (the lines with a
// +event or -event: +sdown, +odown, +elected-leader, +promoted-slave,
// +switch-master, +convert-to-slave, …).
func SentinelEvents(addr string) []string {
	dir, ok := sentinelDirs.Load(addr)
	if !ok {
		return nil
	}
	f, err := os.Open(filepath.Join(dir.(string), "sentinel.log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, " +") || strings.Contains(line, " -") {
			out = append(out, line)
		}
	}
	return out
}

// Failovers counts the failovers a Sentinel saw through: its +switch-master
// events.
func Failovers(sentinel string) int {
	n := 0
	for _, e := range SentinelEvents(sentinel) {
		if strings.Contains(e, "+switch-master") {
			n++
		}
	}
	return n
}

// Report is the timeline and every Sentinel's events, for a failed test's
// log.
func (w *RedisWatch) Report() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	b.WriteString("timeline (a line each time an entity's state changed):\n")
	for _, l := range w.lines {
		b.WriteString("  " + l + "\n")
	}
	for _, s := range w.sentinels {
		fmt.Fprintf(&b, "%s (%s) events:\n", s.name, s.addr)
		for _, e := range SentinelEvents(s.addr) {
			b.WriteString("  " + e + "\n")
		}
	}
	return b.String()
}

// sentinelDirs maps a Sentinel's address to its directory (its log).
var sentinelDirs sync.Map
