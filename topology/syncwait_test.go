package topology

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/localpg"
)

// startWaiting starts a PostgreSQL whose commits wait for a synchronous standby that never
// comes (synchronous_standby_names names nobody), and returns its DSN and an admin connection
// whose own commits do not wait.
func startWaiting(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := localpg.Start(ctx, localpg.Options{})
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and PostgreSQL could not start: %v", err)
		}
		t.Skipf("PostgreSQL not available: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	admin, err := pgx.Connect(ctx, srv.DSN()+"&synchronous_commit=local")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	// Set after the start: with it set from the start, localpg's own CREATE DATABASE would wait.
	for _, sql := range []string{"CREATE TABLE t (id int PRIMARY KEY)", "ALTER SYSTEM SET synchronous_standby_names = 'nobody'", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	for {
		c, err := pgx.Connect(ctx, srv.DSN())
		if err != nil {
			t.Fatal(err)
		}
		var names string
		err = c.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names)
		c.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if names == "nobody" {
			return srv.DSN(), admin
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// visible reports whether row id of t can be read, after giving a just-cancelled wait time to end.
func visible(t *testing.T, admin *pgx.Conn, id int) bool {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM t WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 || time.Now().After(deadline) {
			return n > 0
		}
	}
}

// waiters counts the backends waiting for the synchronous standby.
func waiters(t *testing.T, admin *pgx.Conn) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSyncWaitOutlivesTimeout: a shard pool's query whose context ends while its commit waits
// for the synchronous standby leaves the server waiting and the row invisible, where a cancel
// request (pgx's other handler, what the pools must not use) ends the wait and shows the row.
func TestSyncWaitOutlivesTimeout(t *testing.T) {
	dsn, admin := startWaiting(t)
	shard := openOne(t, dsn, config.ShardPool{MaxConns: 4, ConnectTimeout: 5 * time.Second}).Shard("a")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := shard.Pool.Exec(ctx, "INSERT INTO t VALUES (1)")
	cancel()
	if err == nil {
		t.Fatal("a commit waiting for a missing standby returned")
	}
	if visible(t, admin, 1) {
		t.Fatal("the row of a commit still waiting for its standby became visible after the client's timeout")
	}
	if n := waiters(t, admin); n != 1 {
		t.Fatalf("%d backends wait for the standby after the client gave up, want 1 (the server keeps waiting)", n)
	}
	if !shard.SyncStandbys() {
		t.Error("SyncStandbys false on a shard with synchronous_standby_names set")
	}

	// The negative: the handler that sends a cancel request loses the guarantee.
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: time.Second}
	}
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (2)").ReadAll()
	cancel()
	if !visible(t, admin, 2) {
		t.Fatalf("a cancel request did not end the standby wait (err %v): the negative this test relies on no longer holds", err)
	}
}

// TestCancelledSyncWaitIsNotAcknowledged: a commit whose wait someone else cancels
// (pg_cancel_backend) returns without error, and WatchCommits's check reports ErrNotReplicated.
func TestCancelledSyncWaitIsNotAcknowledged(t *testing.T) {
	dsn, admin := startWaiting(t)
	shard := openOne(t, dsn, config.ShardPool{MaxConns: 4, ConnectTimeout: 5 * time.Second}).Shard("a")
	done := make(chan error, 1)
	go func() {
		ctx, check := WatchCommits(context.Background())
		if _, err := shard.Pool.Exec(ctx, "INSERT INTO t VALUES (3)"); err != nil {
			done <- err
			return
		}
		done <- check()
	}()
	for deadline := time.Now().Add(5 * time.Second); waiters(t, admin) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the insert never waited for the standby")
		}
	}
	if _, err := admin.Exec(context.Background(), "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("commit after a cancelled standby wait: %v, want ErrNotReplicated", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := shard.ConfirmReplicated(ctx); err == nil {
		t.Fatal("ConfirmReplicated returned nil while the standby is missing")
	}
}

// TestTimedOutQueryRowsSendNoCancel: a query read as rows (as the transfer statements are) whose
// context ends while its commit waits for the standby leaves the row invisible too: pgconn,
// closing such a connection, would send a cancel request, which the pools' dialer refuses.
func TestTimedOutQueryRowsSendNoCancel(t *testing.T) {
	dsn, admin := startWaiting(t)
	shard := openOne(t, dsn, config.ShardPool{MaxConns: 4, ConnectTimeout: 5 * time.Second}).Shard("a")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	rows, err := shard.Pool.Query(ctx, "INSERT INTO t VALUES ($1) RETURNING id", 4)
	if err == nil {
		for rows.Next() {
		}
		rows.Close()
		err = rows.Err()
	}
	cancel()
	if err == nil {
		t.Fatal("a commit waiting for a missing standby returned")
	}
	if visible(t, admin, 4) {
		t.Fatal("the row of a commit still waiting for its standby became visible after the client's timeout (a cancel request reached the server)")
	}
	if n := waiters(t, admin); n != 1 {
		t.Fatalf("%d backends wait for the standby after the client gave up, want 1", n)
	}
}
