package service

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The watch takes a map only once its content has held still for a look: a file being written
// in place is not reloaded half-written (even though this half is a valid map), and a settled
// change is taken exactly once.
func TestWatchMapWaitsForTheFileToSettle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shardmap.yaml")
	looks := make(chan time.Time)
	taken := make(chan string, 10)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go watchMap(ctx, path, looks, func() {
		b, _ := os.ReadFile(path)
		taken <- string(b)
	})
	look := func(content string) {
		t.Helper()
		if content != "" {
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		looks <- time.Now()
	}
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-taken:
			if got != want {
				t.Fatalf("took %q, want %q", got, want)
			}
		case <-time.After(time.Second):
			if want != "" {
				t.Fatalf("took nothing, want %q", want)
			}
		}
	}
	const v1, half, full = "version: 1\n", "version: 2\ndsn: postgres://u@127.0.0.1:5740", "version: 2\ndsn: postgres://u@127.0.0.1:5740/db\n"
	look(v1)
	look("")
	expect(v1) // the first settled look
	look(half) // being written: seen once
	look(full) // the rest arrives before the next look
	look("")
	expect(full)
	look("")
	look("")
	expect("") // unchanged: nothing more
	if len(taken) != 0 {
		t.Fatalf("took %q as well", <-taken)
	}
}
