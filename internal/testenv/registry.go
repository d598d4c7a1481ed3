package testenv

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SchemaRegistry is a running Confluent-compatible registry for one test:
// Apicurio Registry as a local process (scripts/registry.sh), on every
// server path, since no image of it is built here. Its schemas live in an
// H2 database file, so that they and their ids survive Stop and Start.
type SchemaRegistry struct {
	// URL is the base of the Confluent API, ending in /apis/ccompat/v7.
	URL string

	script string
	shared string // IDEMSTREAM_TESTENV_DIR: the installation, shared
	dir    string // this registry's database, log and pid file
	port   int
}

// StartSchemaRegistry starts a fresh registry for the test, on a port of
// its own, and stops it when the test ends. It takes about 3 s and 170 MB.
func StartSchemaRegistry(t testing.TB) *SchemaRegistry {
	t.Helper()
	r := &SchemaRegistry{
		script: filepath.Join(repoDir(), "internal", "testenv", "scripts", "registry.sh"),
		shared: sharedTestenvDir(),
		dir:    t.TempDir(),
	}
	if out, err := r.run(20*time.Minute, "fetch"); err != nil {
		unavailable(t, "no schema registry: %v: %s", err, out)
	}
	// Registered after TempDir's cleanup, so run before it: the process
	// is gone before its directory is removed.
	t.Cleanup(func() {
		if out, err := r.run(time.Minute, "stop"); err != nil {
			t.Errorf("stop the schema registry: %v: %s", err, out)
		}
	})
	for attempt := 0; ; attempt++ {
		r.setPort(t)
		out, err := r.run(3*time.Minute, "up", strconv.Itoa(r.port))
		if err == nil {
			break
		}
		// Another process took the port between FreeAddr and the bind
		// (packages run side by side): try another.
		if attempt == 2 || !strings.Contains(out, "in use") {
			t.Fatalf("start the schema registry: %v: %s", err, out)
		}
	}
	r.waitReady(t)
	return r
}

func (r *SchemaRegistry) setPort(t testing.TB) {
	t.Helper()
	_, port, err := net.SplitHostPort(FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	r.port, err = strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	r.URL = fmt.Sprintf("http://127.0.0.1:%d/apis/ccompat/v7", r.port)
}

// Stop stops the registry with SIGTERM and waits for the process to end:
// from then on clients get connection refused.
func (r *SchemaRegistry) Stop(t testing.TB) {
	t.Helper()
	if out, err := r.run(time.Minute, "stop"); err != nil {
		t.Fatalf("stop the schema registry: %v: %s", err, out)
	}
}

// Start starts a stopped registry again, on the same port and with the
// same schemas, and waits until it answers.
func (r *SchemaRegistry) Start(t testing.TB) {
	t.Helper()
	if out, err := r.run(3*time.Minute, "start", strconv.Itoa(r.port)); err != nil {
		t.Fatalf("start the schema registry again: %v: %s", err, out)
	}
	r.waitReady(t)
}

// waitReady polls GET {URL}/subjects until it answers 200: the HTTP port
// opens before the storage is ready. registry.sh waits too; this is the
// test's own proof.
func (r *SchemaRegistry) waitReady(t testing.TB) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := getOK(client, r.URL+"/subjects")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := r.run(30*time.Second, "log", "40")
			t.Fatalf("the schema registry at %s did not answer within 60s: %v\n%s", r.URL, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getOK(client *http.Client, url string) error {
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// run runs registry.sh; it returns the script's output, stdout and stderr.
func (r *SchemaRegistry) run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{r.script}, args...)...)
	cmd.Env = append(os.Environ(),
		"IDEMSTREAM_TESTENV_DIR="+r.shared,
		"IDEMSTREAM_REGISTRY_DIR="+r.dir,
		// No registry outlives a test binary killed before its cleanup.
		"IDEMSTREAM_REGISTRY_OWNER="+strconv.Itoa(os.Getpid()),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return strings.TrimSpace(string(out)), fmt.Errorf("registry.sh %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// sharedTestenvDir is where the scripts install what they fetch:
// IDEMSTREAM_TESTENV_DIR, else .testenv at the root of the tree.
func sharedTestenvDir() string {
	if dir := os.Getenv("IDEMSTREAM_TESTENV_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(repoDir(), ".testenv")
}
