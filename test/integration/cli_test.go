package integration

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildRouter compiles the router binary once per test binary.
func buildRouter(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(env.dir, "router")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	out, err := exec.Command("go", "build", "-o", bin, "github.com/shardgate/shardgate/cmd/router").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The commands as an operator runs them: `router migrate` and `router maintain --once` on every
// shard, `router serve` answering transfers, and SIGTERM letting an in-flight transfer finish
// before the process exits 0.
func TestCommandsEndToEnd(t *testing.T) {
	bin := buildRouter(t)
	dir := t.TempDir()
	if err := writeMap(filepath.Join(dir, "shardmap.yaml"), nextVersion(t), []string{"-80", "80-"}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := strings.Replace(routerYAML, "listen: 127.0.0.1:0", "listen: "+addr, 1)
	cfgPath := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := run("migrate", "--config", cfgPath); !strings.Contains(out, "schema up to date") || !strings.Contains(out, "ownership: 2 shards") {
		t.Errorf("migrate (already migrated shards): %s", out)
	}
	if out := run("maintain", "--config", cfgPath, "--once"); strings.Count(out, "shard shard-") != 2 {
		t.Errorf("maintain: %s", out)
	}
	if out := run("shardmap", "route", filepath.Join(dir, "shardmap.yaml"), "8842"); !strings.Contains(out, "keyspace_id 1d65d16c18855fc7 range -80 shard shard-0") {
		t.Errorf("shardmap route: %s", out)
	}
	out, err := exec.Command(bin, "maintain", "--config", cfgPath).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--once") {
		t.Errorf("maintain without --once: %v %s, want exit 2 naming --once", err, out)
	}

	serve := exec.Command(bin, "serve", "--config", cfgPath)
	var logs bytes.Buffer
	stderr, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
		}
		exited <- serve.Wait()
	}()
	defer serve.Process.Kill() //nolint:errcheck // already gone when the test passes
	base := "http://" + addr
	waitFor(t, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if r := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": newKey()}, transferBody(8842, 1, 1)); r.status != http.StatusCreated {
		t.Fatalf("transfer through router serve: %d %s", r.status, r.body)
	}

	// The relay of router serve settles what the shards owe first: a credit it delivered while
	// the ledger is held would wait for the lock too, and pass for the transfer below.
	waitFor(t, func() bool { return owedCredits(t) == 0 })
	// A transfer in flight when SIGTERM arrives still completes; then the process exits 0.
	const src = 14001
	release := holdLedger(t, shardOf(src))
	key := newKey()
	inFlight := make(chan reply, 1)
	go func() {
		inFlight <- doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": key}, transferBody(src, 1, 9))
	}()
	waitFor(t, func() bool { return lockWaiters(t, shardOf(src)) > 0 })
	if err := serve.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-exited:
		t.Fatalf("router exited with a transfer in flight: %v\n%s", err, logs.String())
	default:
	}
	release()
	if r := <-inFlight; r.status != http.StatusCreated {
		t.Errorf("in-flight transfer during shutdown: %d %s", r.status, r.body)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("router exit: %v\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("router did not exit after SIGTERM\n%s", logs.String())
	}
	if n := ledgerRows(t, shardOf(src), transferID(src, key)); n != 1 {
		t.Errorf("in-flight transfer: %d ledger rows, want 1", n)
	}
	if !strings.Contains(logs.String(), "msg=stopped") {
		t.Errorf("no clean stop in the log:\n%s", logs.String())
	}
	if leaked := secretsIn(logs.String()); len(leaked) > 0 {
		t.Errorf("router serve logged secrets %v", leaked)
	}
}
