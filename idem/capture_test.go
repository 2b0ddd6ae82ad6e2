package idem

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// captureTriggers counts the change-capture triggers (statement triggers, which the partitions
// of idempotency_record do not carry: the parent's sees their rows).
func captureTriggers(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'shardgate_capture_change%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The change-capture triggers exist only while a move is listed: listing one creates them,
// DropIdleCapture keeps them while it is listed and drops them once none is, and waits for a
// long transaction only briefly, leaving them for the next call.
func TestCaptureOnlyWhileMoving(t *testing.T) {
	ctx := context.Background()
	pool := migratedDB(t, "")
	if n := captureTriggers(t, pool); n != 0 {
		t.Fatalf("a migrated shard has %d capture triggers, want none", n)
	}
	mustExec(t, pool, "INSERT INTO shardgate_range_move (key_range, lo, hi, dst, map_version) VALUES ('40-80', 0, 100, 'sb', 2)")
	if n := captureTriggers(t, pool); n != 4 {
		t.Fatalf("listing a move made %d capture triggers, want 4", n)
	}
	if dropped, err := DropIdleCapture(ctx, pool); err != nil || dropped {
		t.Fatalf("with a move listed: dropped %v (%v), want kept", dropped, err)
	}
	mustExec(t, pool, "DELETE FROM shardgate_range_move")

	// A transaction reading idempotency_record holds the drop off; transfers would queue behind
	// the drop's lock, so it gives up after a few short waits.
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := long.Exec(ctx, "SELECT count(*) FROM idempotency_record"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	dropped, err := DropIdleCapture(ctx, pool)
	if err != nil || dropped || time.Since(began) > 5*time.Second {
		t.Fatalf("behind a long transaction: dropped %v (%v) after %v, want kept, without error, within 5 s", dropped, err, time.Since(began))
	}
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	if dropped, err := DropIdleCapture(ctx, pool); err != nil || !dropped {
		t.Fatalf("with no move listed: dropped %v (%v), want dropped", dropped, err)
	}
	if n := captureTriggers(t, pool); n != 0 {
		t.Fatalf("%d capture triggers left, want none", n)
	}
	if dropped, err := DropIdleCapture(ctx, pool); err != nil || dropped {
		t.Fatalf("again: dropped %v (%v), want nothing to drop", dropped, err)
	}
}
