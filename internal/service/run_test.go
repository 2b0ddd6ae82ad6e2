package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/idem"
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
		// Long enough for the watcher on a busy machine when something is due; short when
		// nothing is, since then the whole wait is spent.
		wait := 10 * time.Second
		if want == "" {
			wait = time.Second
		}
		select {
		case got := <-taken:
			if got != want {
				t.Fatalf("took %q, want %q", got, want)
			}
		case <-time.After(wait):
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

// A failed upkeep is an error in the log, not an INFO line; a pass that changed nothing is not
// news (it also ran a moment before in `migrate`, whose report was printed already).
func TestUpkeepLogLevels(t *testing.T) {
	var buf strings.Builder
	w := logWriter{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	fmt.Fprintf(w, "shard a: %s\n", describeUpkeep(idem.UpkeepReport{}, errors.New("lock timeout")))
	fmt.Fprintf(w, "shard b: %s\n", describeUpkeep(idem.UpkeepReport{}, nil))
	fmt.Fprintf(w, "shard c: %s\n", describeUpkeep(idem.UpkeepReport{Created: []string{"idempotency_record_2026_12_06"}}, nil))
	fmt.Fprintf(w, "shard d: %s\n", describeUpkeep(idem.UpkeepReport{Checked: []string{"idempotency_record_2026_12_04", "idempotency_record_2026_12_03"}}, nil))
	fmt.Fprintf(w, "shard e: %s: %s\n", ruleHeld, "partition idempotency_record_2026_12_01 is not yet under the key-floor rule")
	out := buf.String()
	if !strings.Contains(out, `level=WARN msg="partition upkeep" report="shard e: key-floor rule held back: partition idempotency_record_2026_12_01`) {
		t.Errorf("a catch-up held back is not a warning:\n%s", out)
	}
	if !strings.Contains(out, `level=INFO msg="partition upkeep" report="shard d: put under the key-floor rule (looked up by key time from now on) idempotency_record_2026_12_04, idempotency_record_2026_12_03"`) {
		t.Errorf("partitions brought under the key-floor rule are not logged:\n%s", out)
	}
	if !strings.Contains(out, `level=ERROR msg="partition upkeep failed" report="shard a: partition upkeep failed: lock timeout"`) {
		t.Errorf("failure not logged as an error:\n%s", out)
	}
	if strings.Contains(out, "shard b") {
		t.Errorf("a pass that changed nothing is logged at INFO:\n%s", out)
	}
	if !strings.Contains(out, `level=INFO msg="partition upkeep" report="shard c: created idempotency_record_2026_12_06"`) {
		t.Errorf("a created partition is not logged:\n%s", out)
	}
}
