//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/shardmap"
)

// How `router reconcile` is called: its flag, and its usage errors (status 2).
func TestReconcileUsage(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		status int
		out    string // on stdout for status 0, on stderr otherwise
	}{
		{[]string{"reconcile", "--help"}, 0, "-since"},
		{[]string{"reconcile", "--help"}, 0, "-repair"},
		{[]string{"reconcile", "--since", "soon"}, 2, "invalid value"},
		{[]string{"reconcile", "--repair=maybe"}, 2, "invalid boolean value"},
		{[]string{"reconcile", "--since", "-1h", "--config", writeReconcileConfig(t, "")}, 2, "--since must be 0 (the whole history) or more"},
		{[]string{"reconcile", "extra"}, 2, `unexpected argument "extra"`},
	} {
		var stdout, stderr bytes.Buffer
		status := run(tc.args, &stdout, &stderr)
		out := stderr.String()
		if tc.status == 0 {
			out = stdout.String()
		}
		if status != tc.status || !strings.Contains(out, tc.out) {
			t.Errorf("router %v: status %d, stdout %q, stderr %q; want %d and %q", tc.args, status, stdout.String(), stderr.String(), tc.status, tc.out)
		}
	}
}

// writeReconcileConfig writes a router.yaml and a two-shard map whose shards a and b are the
// given DSNs (unreachable ones when empty) and returns the router.yaml's path.
func writeReconcileConfig(t *testing.T, dsnA string, dsnB ...string) string {
	t.Helper()
	if dsnA == "" {
		dsnA, dsnB = "postgres://u@127.0.0.1:1/a", []string{"postgres://u@127.0.0.1:1/b"}
	}
	dir := t.TempDir()
	m := fmt.Sprintf("version: 1\nshards:\n  - {name: a, dsn: %q, ranges: [\"-80\"]}\n  - {name: b, dsn: %q, ranges: [\"80-\"]}\n", dsnA, dsnB[0])
	for name, body := range map[string]string{"shardmap.yaml": m, "router.yaml": "shardmap: shardmap.yaml\nauth:\n  mode: none\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "router.yaml")
}

// Against two real shards: migrated and empty is clean (0); a credit without its debit makes
// it report the credit and exit 1 with one line on stderr; a wrong password is an error that
// names the shard and prints no password.
func TestReconcileCommand(t *testing.T) {
	if _, err := localpg.BinDir(); err != nil && os.Getenv("CI") == "" {
		t.Skipf("PostgreSQL server binaries not found: %v", err)
	}
	ctx := context.Background()
	const password = "s3cret-Pw-9"
	srv, err := localpg.Start(ctx, localpg.Options{Password: password, Database: "shard_a"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	admin, err := pgx.Connect(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE shard_b"); err != nil {
		t.Fatal(err)
	}
	dsnB := strings.Replace(srv.DSN(), "/shard_a?", "/shard_b?", 1)
	path := writeReconcileConfig(t, srv.DSN(), dsnB)
	reconcileStatus := func(path string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		status := run([]string{"reconcile", "--config", path}, &stdout, &stderr)
		return status, stdout.String(), stderr.String()
	}
	if status := run([]string{"migrate", "--config", path}, &bytes.Buffer{}, &bytes.Buffer{}); status != 0 {
		t.Fatalf("migrate: status %d", status)
	}
	if status, stdout, stderr := reconcileStatus(path); status != 0 || !strings.Contains(stdout, "result: clean") || stderr != "" {
		t.Fatalf("reconcile of empty shards: status %d, stdout %q, stderr %q; want 0, clean", status, stdout, stderr)
	}

	debitOnA(t, srv.DSN(), "t-lost")
	status, stdout, stderr := reconcileStatus(path)
	if status != 1 || !strings.Contains(stdout, "missing credit: 1") || !strings.Contains(stdout, "t-lost") || !strings.Contains(stderr, "discrepancies") {
		t.Errorf("reconcile with a lost credit: status %d, stdout %q, stderr %q; want 1, the credit listed", status, stdout, stderr)
	}
	repair := func() (int, string) {
		var out, errOut bytes.Buffer
		return run([]string{"reconcile", "--config", path, "--repair"}, &out, &errOut), out.String() + errOut.String()
	}
	if status, out := repair(); status != 0 || !strings.Contains(out, "t-lost: owed again on a") || !strings.Contains(out, "after repair:") ||
		!strings.HasSuffix(out, "result: clean\n") {
		t.Errorf("reconcile --repair: status %d, output %q; want 0, the credit owed again, clean after", status, out)
	}
	if status, out := repair(); status != 0 || strings.Contains(out, "repair:") || !strings.Contains(out, "oldest pending credit: t-lost") {
		t.Errorf("second reconcile --repair: status %d, output %q; want 0, nothing repaired, t-lost pending", status, out)
	}

	creditOnB(t, dsnB, "t-orphan")
	status, stdout, stderr = reconcileStatus(path)
	if status != 1 || !strings.Contains(stdout, "credit without debit: 1") || !strings.Contains(stdout, "t-orphan") ||
		!strings.Contains(stderr, "discrepancies") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("reconcile with a credit without debit: status %d, stdout %q, stderr %q; want 1, the credit listed, one line on stderr", status, stdout, stderr)
	}

	u, err := url.Parse(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "wrong-Pw-7")
	status, stdout, stderr = reconcileStatus(writeReconcileConfig(t, u.String(), dsnB))
	if status != 1 || !strings.Contains(stderr, "shard a") || strings.Contains(stderr+stdout, "wrong-Pw-7") || strings.Contains(stderr+stdout, password) {
		t.Errorf("reconcile with a wrong password: status %d, stdout %q, stderr %q; want 1, naming shard a, no password", status, stdout, stderr)
	}
}

// debitOnA writes, on the shard at dsn (which owns "-80"), the debit of transfer id to an account
// of b, with its owed-credit row marked settled and no credit anywhere: a credit lost after its
// delivery.
func debitOnA(t *testing.T, dsn, id string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	src, dst := int64(1), int64(1)
	for shardmap.KeyspaceID(src) >= 1<<63 {
		src++
	}
	for shardmap.KeyspaceID(dst) < 1<<63 {
		dst++
	}
	res, err := idem.Transfer(context.Background(), pool, idem.TransferRequest{
		Kind: idem.Debit, Scope: "test:transfer", Key: id, RequestHash: "h", KeyspaceID: shardmap.KeyspaceID(src),
		DstKeyspaceID: shardmap.KeyspaceID(dst), TransferID: id, Client: "test", Src: src, Dst: dst, Amount: 10,
		Currency: "EUR", Response: idem.Response{Status: 201}, Retention: time.Hour,
	})
	if err != nil || res.Outcome != idem.Applied {
		t.Fatalf("debit on a: %v %v", res.Outcome, err)
	}
	if _, err := pool.Exec(context.Background(), "UPDATE shardgate_credit_outbox SET settled_at = now() WHERE transfer_id = $1", id); err != nil {
		t.Fatal(err)
	}
}

// creditOnB writes, on the shard at dsn (which owns "80-"), the credit of transfer id without
// any debit.
func creditOnB(t *testing.T, dsn, id string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	dst := int64(1)
	for shardmap.KeyspaceID(dst) < 1<<63 {
		dst++
	}
	res, err := idem.Transfer(context.Background(), pool, idem.TransferRequest{
		Kind: idem.Credit, Scope: "shardgate:credit", Key: id, RequestHash: "h", KeyspaceID: shardmap.KeyspaceID(dst),
		TransferID: id, Client: "test", Src: 2, Dst: dst, Amount: 10, Currency: "EUR", Retention: time.Hour,
	})
	if err != nil || res.Outcome != idem.Applied {
		t.Fatalf("credit on b: %v %v", res.Outcome, err)
	}
}
