//go:build unix

package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
)

// A second router dev on a sandbox in use says so, names the holder, and starts nothing; once
// the first lets go, the sandbox can be taken again.
func TestDevSandboxInUse(t *testing.T) {
	dir := t.TempDir()
	unlock, err := lockSandbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	err = dev(context.Background(), []string{"--dir", dir, "--listen", "127.0.0.1:0"}, io.Discard, slog.New(slog.DiscardHandler))
	want := "another router dev (process " + strconv.Itoa(os.Getpid()) + ") is running the sandbox in " + dir
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "another --dir") {
		t.Fatalf("second router dev: %v, want %q", err, want)
	}
	if _, err := os.Stat(dir + "/shards"); !os.IsNotExist(err) {
		t.Errorf("the refused router dev started shards: %v", err)
	}
	unlock()
	unlock2, err := lockSandbox(dir)
	if err != nil {
		t.Fatalf("the sandbox stays locked after unlock: %v", err)
	}
	unlock2()
}
