package validate

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile: the image builds the command statically, runs as
// non-root, and starts `run` on the config path the manifests mount.
// Without a Docker engine this reads the instructions; TestStaticBuild runs
// the same go build.
func TestDockerfile(t *testing.T) {
	df := string(readFile(t, deployPath("Dockerfile")))
	want := []string{
		`(?m)^FROM (--platform=\S+ )?golang:\$\{GO_VERSION\} AS build$`,
		`(?m)^ARG GO_VERSION=1\.26$`,
		`CGO_ENABLED=0`,
		`go build -buildvcs=false -trimpath -ldflags "-s -w -X main\.version=\$\{VERSION\}"`,
		`-o /out/idemstream \./cmd/idemstream`,
		`(?m)^FROM gcr\.io/distroless/static-debian12:nonroot\nARG VERSION=dev\n`,
		`org\.opencontainers\.image\.version="\$\{VERSION\}"`,
		`(?m)^USER nonroot:nonroot$`,
		`(?m)^EXPOSE 9464$`,
		`(?m)^ENTRYPOINT \["/idemstream"\]$`,
		`(?m)^CMD \["run", "--config", "/etc/idemstream/idemstream\.yaml"\]$`,
	}
	for _, re := range want {
		if !regexp.MustCompile(re).MatchString(df) {
			t.Errorf("deploy/Dockerfile: no line matching %s", re)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "idemstream")); err != nil {
		t.Errorf("the Dockerfile builds ./cmd/idemstream: %v", err)
	}
	// The ignore file must not hide what the build needs.
	for _, line := range strings.Split(string(readFile(t, deployPath("Dockerfile.dockerignore"))), "\n") {
		line = strings.TrimSpace(line)
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "consumer", "dedupe", "schemas", "sinks", "internal"} {
			if line == needed || line == needed+"/" || line == "*" {
				t.Errorf("Dockerfile.dockerignore excludes %s, which the build needs", needed)
			}
		}
	}
}

// TestStaticBuild runs the Dockerfile's build command and checks that the
// binary is static (no ELF interpreter: it runs on distroless/static) and
// reports the version stamped by -X main.version.
func TestStaticBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	out := filepath.Join(t.TempDir(), "idemstream")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-trimpath", "-ldflags", "-s -w -X main.version=v0.0.0-validate", "-o", out, "./cmd/idemstream")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has an ELF interpreter: it is not static and will not run on distroless/static")
		}
	}
	v, err := exec.Command(out, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("idemstream version: %v\n%s", err, v)
	}
	if !strings.Contains(string(v), "v0.0.0-validate") {
		t.Errorf("idemstream version printed %q: -X main.version did not take", v)
	}
}
