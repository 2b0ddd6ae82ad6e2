package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The version given at link time, as `make build` and the release script give it, is what
// `router version` prints (/healthz reports the same: router's TestHealthzReportsVersion).
func TestVersionFromLdflags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the router")
	}
	bin := filepath.Join(t.TempDir(), "router")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v7.8.9-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "router v7.8.9-test (go") {
		t.Errorf("router version: %q (%v), want it to start with \"router v7.8.9-test (go\"", out, err)
	}
}
