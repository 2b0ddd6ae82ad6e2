package faults

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/internal/testkit"
)

// TestBankFailoverToSyncStandby is the bank run with one fault: shard-1 has a synchronous
// standby, its WAL receiver stalls while the clients keep sending (commits wait; clients get
// 503 and retry), its primary is killed, the standby promoted and the map repointed under the
// same version. The checks are the bank's: every acknowledged transfer is on the shards once
// (on the promoted standby for shard-1), every unknown outcome resolves, every applied debit
// has one credit, balances are exact and reconcile is clean. It runs on local PostgreSQL
// processes with the router in-process, so it needs no Docker.
func TestBankFailoverToSyncStandby(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	password := "pw-" + rand.Text()
	var (
		primaries []*localpg.Server
		dsns      []string
	)
	for range numShards {
		p, err := localpg.Start(ctx, localpg.Options{Password: password})
		if err != nil {
			if os.Getenv("CI") == "" {
				t.Skipf("PostgreSQL not available: %v", err)
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		primaries = append(primaries, p)
		dsns = append(dsns, p.DSN())
	}
	standby, err := primaries[1].StartStandby(ctx, localpg.StandbyOptions{Sync: true, Name: "shard1_standby"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })

	mapPath := filepath.Join(dir, "shardmap.yaml")
	writeMap := func() {
		t.Helper()
		ranges := []string{`["-55"]`, `["55-aa"]`, `["aa-"]`}
		var b strings.Builder
		b.WriteString("version: 1\nshards:\n")
		for i, dsn := range dsns {
			fmt.Fprintf(&b, "  - name: shard-%d\n    dsn: %s\n    ranges: %s\n", i, dsn, ranges[i])
		}
		if err := os.WriteFile(mapPath+".tmp", []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(mapPath+".tmp", mapPath); err != nil {
			t.Fatal(err)
		}
	}
	writeMap()
	sum := sha256.Sum256([]byte(bankToken))
	routerYAML := "listen: 127.0.0.1:0\nshardmap: shardmap.yaml\nauth:\n  mode: tokens\n  clients:\n    - name: bank\n      token_sha256: " +
		hex.EncodeToString(sum[:]) + "\n" + bankPool
	cfgPath := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(cfgPath, []byte(routerYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, m, err := service.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := service.Migrate(ctx, cfg, m, io.Discard); err != nil {
		t.Fatal(err)
	}
	var logs testkit.SyncBuffer
	svc, err := service.New(cfg, m, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); svc.Relay.Run(relayCtx) }()
	hs := httptest.NewServer(svc.Router)
	defer func() {
		stopRelay()
		<-relayDone
		hs.Close()
		svc.Close()
	}()

	b := newBank(m)
	httpc := &http.Client{Timeout: clientWait, Transport: &http.Transport{DisableKeepAlives: true}}
	ops := runClients(ctx, httpc, hs.URL, b, func() {
		time.Sleep(settle)
		t.Log("fault: stall shard-1's synchronous standby, kill shard-1, promote the standby, repoint the map")
		if err := standby.StallReceiver(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second) // longer than request_timeout: commits wait for the standby
		if err := primaries[1].Kill(); err != nil {
			t.Fatal(err)
		}
		if err := standby.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		dsns[1] = standby.DSN()
		writeMap()
		if _, err := svc.Router.Reload(mapPath); err != nil {
			t.Fatal(err)
		}
		time.Sleep(settle)
	})

	pools := poolsOf(ctx, t, dsns)
	counts := check(ctx, t, ops, pools)
	t.Logf("acknowledged %d (1 row each on the shards after the failover), surely failed %d, unknown %d (%d landed)",
		counts.acked, counts.failed, counts.unknown, counts.unknownLanded)
	resolveAndCheck(ctx, t, httpc, hs.URL, ops, pools, counts, "after the failover")
	drainCredits(ctx, t, pools)
	debits := debitRows(ctx, t, pools)
	legs := checkCredits(ctx, t, ops, debits, pools, m)
	checkBalances(ctx, t, httpc, hs.URL, b, ops, debits)
	checkReconcile(ctx, t, m, pools)
	t.Logf("credits: %d applied transfers, %d across shards, each with one credit; balances of %d accounts as applied", legs.applied, legs.cross, len(b.accounts))
	if strings.Contains(logs.String(), password) {
		t.Error("the router's log shows a shard's password")
	}
}
