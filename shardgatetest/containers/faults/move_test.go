package faults

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/shardmap"
)

// movePool is the routers' shard pool for the move: buffering holds a fenced range's requests up
// to 3s, within a request_timeout that leaves the transfer time to run once sent on.
const movePool = `shard_pool:
  max_conns: 8
  connect_timeout: 1s
  request_timeout: 5s
  retry_after: 1s
relay:
  lease: 15s
  backoff_max: 2s
buffering:
  max_wait: 3s
`

// TestBankRangeMove is the bank run with a range move under load: two routers serve the
// clients (each request goes to one or the other), while `router shardmap apply --map` moves
// 80-aa from shard-1 to shard-2 with the product's own apply (copy while shard-1 serves,
// catch-up, fence, grant); the routers take up the new map by themselves, from the refusals
// they get. The checks are the bank's: every acknowledged transfer is on the shards once, every
// unknown outcome resolves, every debit is on the shard that owns its source in the new map and
// has one credit on the shard that owns its destination there, balances are exact and reconcile
// is clean. The moving range's transfers get no 503: the routers hold them through the fence.
// It runs on local PostgreSQL processes with the routers in-process, so it needs no Docker.
func TestBankRangeMove(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	password := "pw-" + rand.Text()
	var dsns []string
	for _, p := range startShards(ctx, t, password) {
		dsns = append(dsns, p.DSN())
	}
	mapPath, nextPath := filepath.Join(dir, "shardmap.yaml"), filepath.Join(dir, "shardmap-v2.yaml")
	writeBankMap(t, mapPath, 1, dsns, "-55", "55-aa", "aa-")
	writeBankMap(t, nextPath, 2, dsns, "-55", "55-80", "80-")
	moving, err := shardmap.ParseKeyRange("80-aa")
	if err != nil {
		t.Fatal(err)
	}
	cfg, m := bankRouter(ctx, t, dir, movePool)
	next, err := shardmap.Load(nextPath)
	if err != nil {
		t.Fatal(err)
	}

	// Two routers, each with its relay; a front that sends each request to one or the other.
	var logs testkit.SyncBuffer
	svcs, front := twoRouters(ctx, t, cfg, m, &logs)

	b := newBank(m)
	httpc := &http.Client{Timeout: clientWait, Transport: &http.Transport{DisableKeepAlives: true}}
	var out bytes.Buffer
	var applyTook time.Duration
	ops := runClients(ctx, httpc, front.URL, b, func() {
		time.Sleep(settle)
		t.Log("move 80-aa from shard-1 to shard-2 under load")
		began := time.Now()
		if err := service.ApplyMapFile(ctx, cfg, next, nextPath, &out); err != nil {
			t.Fatalf("apply: %v\n%s", err, out.String())
		}
		applyTook = time.Since(began)
		time.Sleep(settle)
	})
	t.Logf("apply took %v:\n%s", applyTook.Round(time.Millisecond), out.String())
	for i, svc := range svcs {
		if v := svc.Router.Topology().Map.Version; v != 2 {
			t.Errorf("router %d serves map version %d after the move, want 2 (taken up from the refusals)", i, v)
		}
	}

	// The 503s answered, for the moving range's transfers and for the others'.
	var movingOps, moving503, other503 int
	for _, o := range ops {
		inMoving := moving.Contains(shardmap.KeyspaceID(o.src))
		if inMoving {
			movingOps++
		}
		for _, a := range o.attempts {
			if a.status == http.StatusServiceUnavailable {
				if inMoving {
					moving503++
				} else {
					other503++
				}
			}
		}
	}
	var held, sent, timedOut, overflow float64
	for _, svc := range svcs {
		mfs, err := svc.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "shardgate_buffered_requests_total" {
				continue
			}
			for _, mt := range mf.GetMetric() {
				n := mt.GetCounter().GetValue()
				held += n
				outcome := ""
				for _, l := range mt.GetLabel() {
					if l.GetName() == "outcome" {
						outcome = l.GetValue()
					}
				}
				switch outcome {
				case "sent":
					sent += n
				case "timeout":
					timedOut += n
				case "overflow":
					overflow += n
				}
			}
		}
	}
	t.Logf("moving range: %d keys, %d answers 503; other ranges: %d answers 503; buffered by the routers: %.0f (%.0f sent on, %.0f timed out, %.0f overflowed)",
		movingOps, moving503, other503, held, sent, timedOut, overflow)
	if movingOps == 0 {
		t.Fatal("no transfer from the moving range: the run proved nothing about the move")
	}
	// The fence lasts a fraction of a second and the routers hold its requests up to 3s.
	if moving503 != 0 {
		t.Errorf("the moving range's transfers were answered 503 %d times; buffering should have held them through the fence", moving503)
	}

	pools := poolsOf(ctx, t, dsns)
	counts := check(ctx, t, ops, pools)
	t.Logf("acknowledged %d (1 row each on the shards after the move), surely failed %d, unknown %d (%d landed)",
		counts.acked, counts.failed, counts.unknown, counts.unknownLanded)
	resolveAndCheck(ctx, t, httpc, front.URL, ops, pools, counts, "after the move")
	drainCredits(ctx, t, pools)
	debits := debitRows(ctx, t, pools)
	for _, o := range ops {
		for _, r := range debits[o.id()] {
			if owner := next.Route(o.src).Shard; r.shard != owner {
				t.Errorf("key %s: debit on %s, want on %s, the owner of account %d in the new map", o.key, r.shard, owner, o.src)
			}
		}
	}
	legs := checkCredits(ctx, t, ops, debits, pools, next)
	checkBalances(ctx, t, httpc, front.URL, b, ops, debits)
	checkReconcile(ctx, t, next, pools)
	t.Logf("credits: %d applied transfers, %d across shards, each with one credit; balances of %d accounts as applied", legs.applied, legs.cross, len(b.accounts))
	if strings.Contains(logs.String(), password) || strings.Contains(out.String(), password) {
		t.Error("a router's log or the apply's output shows a shard's password")
	}
}

// twoRouters serves two routers of cfg and m, each running its relay and logging to logs, behind
// a front that sends each request to one or the other in turn. All of it stops when t ends.
func twoRouters(ctx context.Context, t *testing.T, cfg *config.Config, m *shardmap.Map, logs *testkit.SyncBuffer) ([]*service.Service, *httptest.Server) {
	t.Helper()
	var (
		svcs    []*service.Service
		targets []*url.URL
	)
	relayCtx, stopRelays := context.WithCancel(ctx)
	var relays sync.WaitGroup
	for range 2 {
		svc, err := service.New(cfg, m, slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		relays.Go(func() { svc.Relay.Run(relayCtx) })
		hs := httptest.NewServer(svc.Router)
		t.Cleanup(func() { hs.Close(); svc.Close() })
		u, err := url.Parse(hs.URL)
		if err != nil {
			t.Fatal(err)
		}
		svcs, targets = append(svcs, svc), append(targets, u)
	}
	t.Cleanup(func() { stopRelays(); relays.Wait() }) // before the routers close: cleanups run last first
	var turn atomic.Uint64
	front := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(targets[turn.Add(1)%2])
	}})
	t.Cleanup(front.Close)
	return svcs, front
}
