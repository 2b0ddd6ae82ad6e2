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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/shardmap"
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
	primaries := startShards(ctx, t, password)
	var dsns []string
	for _, p := range primaries {
		dsns = append(dsns, p.DSN())
	}
	standby, err := primaries[1].StartStandby(ctx, localpg.StandbyOptions{Sync: true, Name: "shard1_standby"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })

	mapPath := filepath.Join(dir, "shardmap.yaml")
	writeMap := func() { writeBankMap(t, mapPath, 1, dsns, "-55", "55-aa", "aa-") }
	writeMap()
	cfg, m := bankRouter(ctx, t, dir, bankPool)
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

// bankRouter writes dir/router.yaml for the bank's client, with poolYAML and the map file
// dir/shardmap.yaml, loads both, and migrates the map's shards as `router migrate` does.
func bankRouter(ctx context.Context, t *testing.T, dir, poolYAML string) (*config.Config, *shardmap.Map) {
	t.Helper()
	sum := sha256.Sum256([]byte(bankToken))
	routerYAML := "listen: 127.0.0.1:0\nshardmap: shardmap.yaml\nauth:\n  mode: tokens\n  clients:\n    - name: bank\n      token_sha256: " +
		hex.EncodeToString(sum[:]) + "\n" + poolYAML
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
	return cfg, m
}

// startShards starts numShards local PostgreSQL servers with password, each closed when t ends.
// Outside CI a machine without PostgreSQL skips the test.
func startShards(ctx context.Context, t *testing.T, password string) []*localpg.Server {
	t.Helper()
	var out []*localpg.Server
	for range numShards {
		p, err := localpg.Start(ctx, localpg.Options{Password: password})
		if err != nil {
			if os.Getenv("CI") == "" {
				t.Skipf("PostgreSQL not available: %v", err)
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		out = append(out, p)
	}
	return out
}

// writeBankMap writes the map of version v to path, by a rename: shard-i at dsns[i], owning
// ranges[i].
func writeBankMap(t *testing.T, path string, v int64, dsns []string, ranges ...string) {
	t.Helper()
	owners := make([]string, len(dsns))
	for i := range dsns {
		owners[i] = fmt.Sprintf("shard-%d=%s", i, ranges[i])
	}
	testkit.WriteShardMap(t, path, v, strings.Join(owners, " "), func(name string) string {
		i, _ := strconv.Atoi(strings.TrimPrefix(name, "shard-"))
		return dsns[i]
	})
}
