//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/internal/testkit"
)

// startDev runs `router dev` with args until the returned stop is called, once it is up.
func startDev(t *testing.T, args ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &testkit.SyncBuffer{}
	done := make(chan error, 1)
	go func() { done <- dev(ctx, args, out, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	deadline := time.After(2 * time.Minute)
	for !strings.Contains(out.String(), "sandbox is up") {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("dev %v ended before it was up: %v\n%s", args, err, out.String())
		case <-deadline:
			cancel()
			t.Fatalf("dev %v not up after 2 minutes:\n%s", args, out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev %v: %v", args, err)
		}
	}
}

// A kept sandbox whose map the user edited and applied (a moved range, version 2) starts again
// as it was left: once, `dev` rewrote it to version 1 and the shards refused it as older than
// what they follow. Another --shards is refused with what to do.
func TestDevKeepsAnEditedSandbox(t *testing.T) {
	if _, err := localpg.BinDir(); err != nil && os.Getenv("CI") == "" {
		t.Skipf("PostgreSQL server binaries not found: %v", err)
	}
	dir := t.TempDir()
	args := []string{"--dir", dir, "--listen", "127.0.0.1:0"}
	stop := startDev(t, args...)
	mapPath := filepath.Join(dir, "shardmap.yaml")
	data, err := os.ReadFile(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(strings.Replace(string(data), "version: 1", "version: 2", 1), `ranges: ["-80"]`, `ranges: ["-40"]`, 1)
	edited = "# moved 40-80 to shard-1\n" + strings.Replace(edited, `ranges: ["80-"]`, `ranges: ["40-"]`, 1)
	// Applied from a file of its own, put in place of the map at the fence.
	newMap := filepath.Join(dir, "new.yaml")
	if err := os.WriteFile(newMap, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	var applied bytes.Buffer
	if code := runShardmap(context.Background(), []string{"apply", "--config", filepath.Join(dir, "router.yaml"), "--map", newMap}, &applied, &applied); code != exitOK {
		t.Fatalf("apply --map: exit %d\n%s", code, applied.String())
	}
	if !strings.Contains(applied.String(), "moved rows of 40-80 from shard-0 to shard-1") || !strings.Contains(applied.String(), "fenced: "+newMap+" put in place of") {
		t.Errorf("apply's report names the wrong range, or the map was not put in place:\n%s", applied.String())
	}
	if data, err := os.ReadFile(mapPath); err != nil || string(data) != edited {
		t.Errorf("the map in place after apply --map: %v\n%s", err, data)
	}
	var status bytes.Buffer
	if code := runShardmap(context.Background(), []string{"status", "--config", filepath.Join(dir, "router.yaml")}, &status, &status); code != exitOK ||
		!strings.Contains(status.String(), "shard shard-1: map version 2, owns [40-]") || !strings.Contains(status.String(), "no range is moving") {
		t.Errorf("shardmap status after the apply: exit %d\n%s", code, status.String())
	}
	stop()

	startDev(t, args...)()
	// The restart wrote the shards' new ports into the map and left every other line as it was.
	if after, err := os.ReadFile(mapPath); err != nil || !sameButDSNs(edited, string(after)) {
		t.Errorf("the restart rewrote more than the dsn lines (%v):\n%s\nwas:\n%s", err, after, edited)
	}
	_, kept, err := service.Load(filepath.Join(dir, "router.yaml"))
	if err != nil || kept.Version != 2 || kept.Route(8842).Range.String() != "-40" && kept.Route(8842).Range.String() != "40-" {
		t.Fatalf("the sandbox's map after a restart: %v (%v), want the edited version 2 with its ranges", kept, err)
	}
	err = dev(context.Background(), append(args, "--shards", "3"), io.Discard, slog.New(slog.DiscardHandler))
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--shards 2") {
		t.Errorf("restart with another --shards: %v, want a usage error saying to use --shards 2", err)
	}
}

// sameButDSNs reports whether a and b have the same lines but for those holding a dsn.
func sameButDSNs(a, b string) bool {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	if len(la) != len(lb) {
		return false
	}
	for i := range la {
		if la[i] != lb[i] && !(strings.Contains(la[i], "dsn: ") && strings.Contains(lb[i], "dsn: ")) {
			return false
		}
	}
	return true
}
