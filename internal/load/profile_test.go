package load

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// profileDir is IDEMSTREAM_LOAD_PROFILE (make load LOAD_PROFILE=dir): the
// directory the idemstream runs' profiles go to, "" for none.
func profileDir() string { return os.Getenv("IDEMSTREAM_LOAD_PROFILE") }

// profileKinds are the profiles IDEMSTREAM_LOAD_PROFILE_KIND (make load
// LOAD_PROFILE_KIND=...) takes: the CPU's, or what was allocated (each
// profile the difference over its second, so that a run's allocations are
// read apart from the process's start), and how each is read.
var profileKinds = map[string]struct{ path, read string }{
	"cpu":    {"profile", "go tool pprof -top"},
	"allocs": {"allocs", "go tool pprof -sample_index=alloc_space -top"},
}

// profileKind is IDEMSTREAM_LOAD_PROFILE_KIND, cpu when unset; another
// value fails the run before it starts.
func profileKind(t *testing.T) string {
	t.Helper()
	k := os.Getenv("IDEMSTREAM_LOAD_PROFILE_KIND")
	if k == "" {
		k = "cpu"
	}
	if _, ok := profileKinds[k]; !ok {
		t.Fatalf("IDEMSTREAM_LOAD_PROFILE_KIND=%q: want cpu or allocs", k)
	}
	return k
}

// metricsConfig is the configuration's metrics section: the profiles
// served (metrics.pprof) when they are taken.
func metricsConfig() string {
	if profileDir() == "" {
		return ""
	}
	return "metrics: {pprof: true}\n"
}

// profiler takes profiles of one idemstream run through its /debug/pprof/,
// a second at a time from the process's start until stop, so that `go tool
// pprof` reads where that very run's time or memory went, without a build
// made for it. Profiling costs the process some CPU, so a profiled run's
// figures are a little higher than an unprofiled one's.
type profiler struct {
	addr, dir, name string
	kind            string
	stopped         chan struct{}
	wg              sync.WaitGroup
	files           []string
	err             error
}

// startProfiler profiles the process whose metrics are served at addr,
// into dir, with profiles of kind (profileKinds); nil when dir is "".
func startProfiler(ctx context.Context, addr, dir, kind, name string) *profiler {
	if dir == "" {
		return nil
	}
	p := &profiler{addr: addr, dir: dir, kind: kind, name: name, stopped: make(chan struct{})}
	p.wg.Add(1)
	go p.run(ctx)
	return p
}

func (p *profiler) run(ctx context.Context) {
	defer p.wg.Done()
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		p.err = err
		return
	}
	for {
		select {
		case <-p.stopped:
			return
		case <-ctx.Done():
			return
		default:
		}
		if err := p.take(ctx); err != nil {
			// Not serving yet (the process is starting): try again
			// shortly, until stop.
			select {
			case <-p.stopped:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// take fetches one second's profile into the next file.
func (p *profiler) take(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/debug/pprof/"+profileKinds[p.kind].path+"?seconds=1", nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		p.err = fmt.Errorf("GET /debug/pprof/%s: %s: %s", profileKinds[p.kind].path, res.Status, strings.TrimSpace(string(body)))
		return p.err
	}
	path := filepath.Join(p.dir, fmt.Sprintf("%s-%03d.pprof", p.name, len(p.files)))
	if err := os.WriteFile(path, body, 0o644); err != nil {
		return err
	}
	p.files = append(p.files, path)
	return nil
}

// stop waits for the profile in progress (at most a second) and logs how
// to read them all.
func (p *profiler) stop(t *testing.T) {
	if p == nil {
		return
	}
	close(p.stopped)
	p.wg.Wait()
	if len(p.files) == 0 {
		t.Errorf("no %s profile of %s taken (%v)", p.kind, p.name, p.err)
		return
	}
	t.Logf("%s: %d %s profiles, read with: %s %s", p.name, len(p.files), p.kind, profileKinds[p.kind].read, filepath.Join(p.dir, p.name+"-*.pprof"))
}
