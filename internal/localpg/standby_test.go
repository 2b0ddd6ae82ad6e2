//go:build linux

package localpg

import (
	"context"
	"testing"
	"time"
)

// TestSyncStandbyStallAndPromote: a synchronous standby with a stalled WAL receiver holds its
// primary's next commit back; after the primary is killed and the standby promoted, the
// standby is a primary on a new timeline with every commit that returned, and takes writes.
func TestSyncStandbyStallAndPromote(t *testing.T) {
	primary := startServer(t, Options{Password: "pw'x"})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	standby, err := primary.StartStandby(ctx, StandbyOptions{Sync: true, Name: "sb1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	conn := connect(t, ctx, primary.DSN())
	if _, err := conn.Exec(ctx, "CREATE TABLE t (id int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if err := standby.StallReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	waiting := connect(t, ctx, primary.DSN())
	go func() { _, err := waiting.Exec(context.Background(), "INSERT INTO t VALUES (2)"); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("a commit returned (%v) while the synchronous standby's WAL receiver was stopped", err)
	case <-time.After(time.Second):
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	sc := connect(t, ctx, standby.DSN())
	if n := queryInt(t, ctx, sc, "SELECT count(*) FROM t WHERE id = 1"); n != 1 {
		t.Errorf("the acknowledged row is on the promoted standby %d times, want 1", n)
	}
	if n := queryInt(t, ctx, sc, "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"); n != 2 {
		t.Errorf("promoted standby on timeline %d, want 2", n)
	}
	if _, err := sc.Exec(ctx, "INSERT INTO t VALUES (3)"); err != nil {
		t.Errorf("the promoted standby refuses writes: %v", err)
	}
}
