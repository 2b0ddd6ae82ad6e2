package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/reconcile"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
)

// failoverYAML is the failover tests' router.yaml: a short request timeout, so that a commit
// held back by a stalled standby reaches it within the test.
const failoverYAML = `listen: 127.0.0.1:0
shardmap: shardmap.yaml
auth:
  mode: tokens
  clients:
    - name: client-a
      token_sha256: a70bf50e531ce1a817561f2f5d5b6645d4e806becf58ccc5e8cf6b8045a090a8
shard_pool:
  max_conns: 8
  connect_timeout: 3s
  request_timeout: 2s
  retry_after: 1s
`

// foCluster is two shards of their own (not the suite's), each a local PostgreSQL primary that
// may have a streaming standby, and a router over them.
type foCluster struct {
	t         *testing.T
	dir       string
	primaries []*localpg.Server
	standbys  []*localpg.Server // by shard index; nil where the shard has none
	dsns      []string          // what the map says now
	password  string
	mapPath   string
	version   int
	svc       *service.Service
	url       string
	logs      testkit.SyncBuffer
}

// standbyMode says which standby a shard of a foCluster gets.
type standbyMode int

const (
	noStandby standbyMode = iota
	asyncStandby
	syncStandby
)

// startFailoverCluster starts a primary per entry of modes, with the standby it asks for, a map
// giving shard-0 the lower half of the keyspace and shard-1 the upper, migrated shards, and a
// router (whose relay runs only when the test calls Relay.Pass).
func startFailoverCluster(t *testing.T, modes ...standbyMode) *foCluster {
	t.Helper()
	return startFailoverClusterWith(t, "", modes...)
}

// startFailoverClusterWith is startFailoverCluster with extraYAML appended to router.yaml.
func startFailoverClusterWith(t *testing.T, extraYAML string, modes ...standbyMode) *foCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := &foCluster{t: t, dir: t.TempDir(), password: "pw-" + rand.Text(), version: 1}
	for i, mode := range modes {
		p, err := localpg.Start(ctx, localpg.Options{Password: c.password})
		if err != nil {
			if os.Getenv("CI") == "" {
				t.Skipf("PostgreSQL not available: %v", err)
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		c.primaries = append(c.primaries, p)
		c.dsns = append(c.dsns, p.DSN())
		var sb *localpg.Server
		if mode != noStandby {
			if sb, err = p.StartStandby(ctx, localpg.StandbyOptions{Sync: mode == syncStandby, Name: fmt.Sprintf("shard%d_standby", i)}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sb.Close() })
		}
		c.standbys = append(c.standbys, sb)
	}
	c.mapPath = filepath.Join(c.dir, "shardmap.yaml")
	c.writeMap()
	cfgPath := filepath.Join(c.dir, "router.yaml")
	if err := os.WriteFile(cfgPath, []byte(failoverYAML+extraYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, m, err := service.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := service.Migrate(ctx, cfg, m, io.Discard); err != nil {
		t.Fatal(err)
	}
	if c.svc, err = service.New(cfg, m, slog.New(slog.NewTextHandler(&c.logs, nil))); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(c.svc.Router)
	t.Cleanup(func() {
		hs.Close()
		c.svc.Close()
		if strings.Contains(c.logs.String(), c.password) {
			t.Error("the router's log shows a shard's password")
		}
	})
	c.url = hs.URL
	return c
}

// writeMap writes the map with the DSNs of c.dsns at c.version.
func (c *foCluster) writeMap() {
	c.t.Helper()
	ranges := []string{`["-80"]`, `["80-"]`}
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d\nshards:\n", c.version)
	for i, dsn := range c.dsns {
		fmt.Fprintf(&b, "  - name: shard-%d\n    dsn: %s\n    ranges: %s\n", i, dsn, ranges[i])
	}
	tmp := c.mapPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, c.mapPath); err != nil {
		c.t.Fatal(err)
	}
}

// failOver does what an operator does when shard i's primary dies: the primary is killed (it
// may be stalled waiting for its standby), the standby promoted, and the map repointed to it
// under the same version, which the router reloads.
func (c *foCluster) failOver(i int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.primaries[i].Kill(); err != nil {
		c.t.Fatal(err)
	}
	if err := c.standbys[i].Promote(ctx); err != nil {
		c.t.Fatal(err)
	}
	c.dsns[i] = c.standbys[i].DSN()
	c.writeMap()
	if res, err := c.svc.Router.Reload(c.mapPath); res != router.ReloadApplied {
		c.t.Fatalf("reload after repointing shard-%d: %s, %v", i, res, err)
	}
}

// pool opens a direct pool on shard i as the map names it now.
func (c *foCluster) pool(i int) *pgxpool.Pool {
	c.t.Helper()
	p, err := pgxpool.New(context.Background(), c.dsns[i])
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(p.Close)
	return p
}

// account returns an account at or above from that shard i owns.
func (c *foCluster) account(i int, from int64) int64 {
	m := c.svc.Router.Topology().Map
	for a := from; ; a++ {
		if m.Route(a).Shard == fmt.Sprintf("shard-%d", i) {
			return a
		}
	}
}

// counter reads a counter of the router's registry, 0 when it has no such series.
func (c *foCluster) counter(name string, labels map[string]string) float64 {
	c.t.Helper()
	mfs, err := c.svc.Registry.Gather()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metrics
				}
			}
			return value(m)
		}
	}
	return 0
}

func value(m *dto.Metric) float64 {
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// sent is one transfer a client sent, retried with its key until it got a final answer.
type sent struct {
	key           string
	src, dst      int64
	amount        int64
	status        int  // the final answer; 0 if none came before the deadline
	unknownBefore bool // a 503 (outcome unknown) came before the final answer
	first, final  time.Time
	attempts      int
}

// postOnce sends one attempt; a transport error is status 0.
func (c *foCluster) postOnce(key, body string) int {
	req, err := http.NewRequest(http.MethodPost, c.url+"/transfers", strings.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return c.status(req)
}

// getOnce sends GET path; a transport error is status 0.
func (c *foCluster) getOnce(path string) int {
	req, err := http.NewRequest(http.MethodGet, c.url+path, nil)
	if err != nil {
		return 0
	}
	return c.status(req)
}

// status sends req as client-a and returns the answer's status, 0 for a transport error.
func (c *foCluster) status(req *http.Request) int {
	req.Header.Set("Authorization", "Bearer token-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the status matters
	resp.Body.Close()
	return resp.StatusCode
}

// load posts transfers from srcs to dsts from workers goroutines, each retrying its key until
// a final answer (201, or a 4xx other than 409), until stop is closed; keys in flight then are
// still retried until final or until deadline.
func (c *foCluster) load(workers int, srcs, dsts []int64, stop <-chan struct{}, deadline time.Time) []sent {
	var (
		mu  sync.Mutex
		out []sent
		wg  sync.WaitGroup
		seq atomic.Int64
	)
	for w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := seq.Add(1)
				s := sent{key: rand.Text(), src: srcs[int(n)%len(srcs)], dst: dsts[(int(n)+w)%len(dsts)], amount: 1 + n%97}
				body := transferBody(s.src, s.dst, s.amount)
				s.first = time.Now()
				for time.Now().Before(deadline) {
					s.attempts++
					st := c.postOnce(s.key, body)
					s.final = time.Now()
					if st == http.StatusCreated || (st >= 400 && st < 500 && st != http.StatusConflict) {
						s.status = st
						break
					}
					if st == http.StatusServiceUnavailable {
						s.unknownBefore = true
					}
					time.Sleep(100 * time.Millisecond)
				}
				mu.Lock()
				out = append(out, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// debits counts the debit rows of each transfer id on pool.
func debits(t *testing.T, pool *pgxpool.Pool, ids []string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT transfer_id, count(*) FROM ledger_entries WHERE kind = 'transfer_out' AND transfer_id = ANY($1) GROUP BY transfer_id", ids)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		found[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return found
}

// sums returns the debits and credits of every shard, each summed.
func (c *foCluster) sums(pools []*pgxpool.Pool) (out, in int64) {
	c.t.Helper()
	for _, p := range pools {
		var o, i int64
		if err := p.QueryRow(context.Background(),
			"SELECT coalesce(sum(amount) FILTER (WHERE kind = 'transfer_out'), 0), coalesce(sum(amount) FILTER (WHERE kind = 'transfer_in'), 0) FROM ledger_entries").Scan(&o, &i); err != nil {
			c.t.Fatal(err)
		}
		out += o
		in += i
	}
	return out, in
}

// relayAll runs relay passes until one settles nothing.
func (c *foCluster) relayAll() {
	c.svc.Relay.Wait() // the credits the router handed off
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for c.svc.Relay.Pass(ctx) > 0 {
	}
}

// TestFailoverToSyncStandbyLosesNoAcknowledgedTransfer: shard-0 has a synchronous standby whose
// WAL receiver is stalled while transfers from shard-0's accounts are posted and retried under
// their keys; the primary is killed, the standby promoted and the map repointed. Every transfer
// the router answered 201, first time or replayed, is on the promoted shard, once; commits held
// back by the stall were answered 503 (their outcome unknown), not 201; and after the relay the
// debits and credits of both shards add up.
func TestFailoverToSyncStandbyLosesNoAcknowledgedTransfer(t *testing.T) {
	c := startFailoverCluster(t, syncStandby, noStandby)
	srcs := []int64{c.account(0, 1000), c.account(0, 2000), c.account(0, 3000), c.account(0, 4000)}
	dsts := []int64{c.account(0, 5000), c.account(1, 6000), c.account(1, 7000)}
	stop := make(chan struct{})
	done := make(chan []sent)
	go func() { done <- c.load(6, srcs, dsts, stop, time.Now().Add(45*time.Second)) }()

	time.Sleep(1500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stalledAt := time.Now()
	if err := c.standbys[0].StallReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // longer than request_timeout: commits wait, clients get 503
	failedAt := time.Now()
	c.failOver(0)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	all := <-done

	promoted := c.pool(0)
	var ids, keys []string
	var sents []sent
	acked, unknown := 0, 0
	for _, s := range all {
		if s.status != http.StatusCreated {
			t.Errorf("key %s: final answer %d, want 201 (every transfer here is valid and retried until final)", s.key, s.status)
			continue
		}
		acked++
		if s.unknownBefore {
			unknown++
		}
		ids = append(ids, router.TransferID(shardmap.KeyspaceID(s.src), "client-a:transfer", s.key))
		keys = append(keys, s.key)
		sents = append(sents, s)
	}
	found := debits(t, promoted, ids)
	lost := 0
	for i, id := range ids {
		if found[id] != 1 {
			lost++
			if lost <= 10 {
				t.Errorf("acknowledged transfer %s (key %s) has %d debits on the promoted shard, want 1 (%d attempts from %s to %s after the stall, failed over %s after it)", id, keys[i], found[id], sents[i].attempts, sents[i].first.Sub(stalledAt), sents[i].final.Sub(stalledAt), failedAt.Sub(stalledAt))
			}
		}
	}
	t.Logf("%d transfers acknowledged, %d of them after a 503, %d lost", acked, unknown, lost)
	if lost > 0 {
		b, _ := os.ReadFile(c.primaries[0].LogPath())
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "WARNING") || strings.Contains(l, "FATAL") || strings.Contains(l, "DETAIL") {
				t.Log("primary: " + l)
			}
		}
		for _, l := range strings.Split(c.logs.String(), "\n") {
			if !strings.Contains(l, "level=INFO") {
				t.Log("router: " + l)
			}
		}
	}
	if acked < 10 || unknown == 0 {
		t.Fatalf("%d transfers acknowledged, %d after an unknown outcome: the stall did not hold commits back, so this test proved nothing", acked, unknown)
	}
	if n := c.counter("shardgate_shard_identity_changes_total", map[string]string{"shard": "shard-0"}); n != 1 {
		t.Errorf("shardgate_shard_identity_changes_total{shard=shard-0} = %v, want 1", n)
	}
	c.relayAll()
	if out, in := c.sums([]*pgxpool.Pool{promoted, c.pool(1)}); out != in {
		t.Errorf("after the relay, debits sum to %d and credits to %d over both shards", out, in)
	}
}

// relayLoop runs relay passes until the returned stop is called, as a router's relay does.
// Stopping waits for the pass in progress to end rather than cancelling it: a cancelled pass
// leaves the credits it had claimed leased (relay.lease) and out of the next passes' reach.
func (c *foCluster) relayLoop() (stop func()) {
	var stopped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stopped.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			c.svc.Relay.Pass(ctx)
			cancel()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() { stopped.Store(true); <-done }
}

// loadFor runs c.load for d with the relay running, and returns what was acknowledged.
func (c *foCluster) loadFor(d time.Duration, srcs, dsts []int64, during func()) []sent {
	c.t.Helper()
	stopRelay := c.relayLoop()
	defer stopRelay()
	stop := make(chan struct{})
	done := make(chan []sent)
	go func() { done <- c.load(4, srcs, dsts, stop, time.Now().Add(30*time.Second)) }()
	time.Sleep(d / 2)
	if during != nil {
		during()
	}
	time.Sleep(d / 2)
	close(stop)
	var acked []sent
	for _, s := range <-done {
		if s.status != http.StatusCreated {
			c.t.Fatalf("key %s: final answer %d, want 201", s.key, s.status)
		}
		acked = append(acked, s)
	}
	return acked
}

func ids(ss []sent) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = router.TransferID(shardmap.KeyspaceID(s.src), "client-a:transfer", s.key)
	}
	return out
}

// credits returns which of ids have a credit on pool.
func credits(t *testing.T, pool *pgxpool.Pool, ids []string) map[string]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT transfer_id FROM ledger_entries WHERE kind = 'transfer_in' AND transfer_id = ANY($1)", ids)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		found[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return found
}

// TestFailoverToAsyncStandby: both shards have asynchronous standbys. Transfers go from
// shard-0's accounts to shard-1's, the relay delivering their credits.
//
// Destination side: shard-1's standby lags (its WAL receiver stalled) while credits are
// delivered and settled; shard-1 fails over and loses them. The router sees shard-1's new
// identity, and the relay owes again what it settled there within relay.reowe_window: after it
// runs, every debit has its credit again.
//
// Source side: shard-0's standby lags while transfers are acknowledged and their credits
// delivered; shard-0 fails over and loses those debits, whose credits stay on shard-1. Async
// replication loses them whatever the router does; reconcile reports each one.
func TestFailoverToAsyncStandby(t *testing.T) {
	c := startFailoverCluster(t, asyncStandby, asyncStandby)
	srcs := []int64{c.account(0, 1000), c.account(0, 2000), c.account(0, 3000)}
	dsts := []int64{c.account(1, 6000), c.account(1, 7000)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Destination side.
	before := c.loadFor(time.Second, srcs, dsts, nil)
	lagging := c.loadFor(2*time.Second, srcs, dsts, func() {
		if err := c.standbys[1].StallReceiver(ctx); err != nil {
			t.Fatal(err)
		}
	})
	c.relayAll()
	c.failOver(1)
	all := ids(append(before, lagging...))
	if lost := len(all) - len(credits(t, c.pool(1), all)); lost == 0 {
		t.Fatalf("no credit was lost with shard-1's failover (%d transfers): the stall did not hold replication back, so this test proved nothing", len(all))
	} else {
		t.Logf("destination failover: %d of %d credits lost", lost, len(all))
	}
	c.relayAll()
	if got := credits(t, c.pool(1), all); len(got) != len(all) {
		t.Errorf("after the relay, %d of %d transfers have their credit on the promoted shard-1, want all: the relay did not owe again what the failover lost", len(got), len(all))
	}
	if n := c.counter("shardgate_credits_reowed_total", map[string]string{"shard": "shard-1"}); n == 0 {
		t.Error("shardgate_credits_reowed_total{shard=shard-1} is 0 after shard-1's identity changed")
	}

	// Source side.
	more := c.loadFor(time.Second, srcs, dsts, nil)
	lost := c.loadFor(2*time.Second, srcs, dsts, func() {
		if err := c.standbys[0].StallReceiver(ctx); err != nil {
			t.Fatal(err)
		}
	})
	c.relayAll()
	c.failOver(0)
	acked := ids(append(append(append(before, lagging...), more...), lost...))
	found := debits(t, c.pool(0), acked)
	var missing []string
	for _, id := range acked {
		if found[id] == 0 {
			missing = append(missing, id)
		}
	}
	t.Logf("source failover: %d of %d acknowledged debits lost", len(missing), len(acked))
	if len(missing) == 0 {
		t.Fatal("no debit was lost with shard-0's failover: the stall did not hold replication back, so this test proved nothing")
	}

	// After both failovers, before reconcile: the lost debits' credits are on shard-1, so money
	// was created; reconcile must name each of them.
	topo := c.svc.Router.HoldTopology()
	defer topo.Release()
	rep, err := reconcile.Run(ctx, topo.Map, topo.Pool, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Found[reconcile.OrphanCredit]; got != len(missing) {
		t.Errorf("reconcile found %d credits without debit, want %d (the debits the source failover lost)", got, len(missing))
	}
	lostSet := map[string]bool{}
	for _, id := range missing {
		lostSet[id] = true
	}
	for _, d := range rep.Listed[reconcile.OrphanCredit] {
		if !lostSet[d.Leg.TransferID] {
			t.Errorf("reconcile lists transfer %s as a credit without debit, which the failover did not lose", d.Leg.TransferID)
		}
	}
	if got := rep.Found[reconcile.MissingCredit]; got != 0 {
		t.Errorf("reconcile found %d missing credits, want 0 (the relay owed again what the destination failover lost)", got)
	}
}

// TestReplayCacheDroppedOnIdentityChange: shard-0's DSN names its primary and its asynchronous
// standby with target_session_attrs=read-write, so that the pool follows a promotion without a
// map change. A transfer acknowledged (and cached) while the standby lags is lost with the
// failover; once the router's first connection reaches the promoted standby, the retry of that
// transfer is not replayed from the cache but applied again, on the shard that lacks it.
func TestReplayCacheDroppedOnIdentityChange(t *testing.T) {
	c := startFailoverCluster(t, asyncStandby, noStandby)
	primary, standby := c.primaries[0], c.standbys[0]
	c.dsns[0] = fmt.Sprintf("postgres://shardgate:%s@127.0.0.1:%d,127.0.0.1:%d/ledger?sslmode=disable&target_session_attrs=read-write",
		c.password, primary.Port(), standby.Port())
	c.writeMap()
	if res, err := c.svc.Router.Reload(c.mapPath); res != router.ReloadApplied {
		t.Fatalf("reload with the two-host DSN: %s, %v", res, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, dst := c.account(0, 1000), c.account(0, 2000)
	postFinal := func(key string) *http.Response {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			req, _ := http.NewRequest(http.MethodPost, c.url+"/transfers", strings.NewReader(transferBody(src, dst, 10)))
			req.Header.Set("Authorization", "Bearer token-a")
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body) //nolint:errcheck // only status and headers matter
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusConflict {
				return resp
			}
		}
		t.Fatalf("key %s: no final answer in 20s", key)
		return nil
	}

	if err := standby.StallReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	lostKey := rand.Text()
	if r := postFinal(lostKey); r.StatusCode != http.StatusCreated {
		t.Fatalf("first post: %d", r.StatusCode)
	}
	if r := postFinal(lostKey); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry before the failover: %d, Idempotent-Replayed %q; want a 201 replay", r.StatusCode, r.Header.Get("Idempotent-Replayed"))
	}
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// Another transfer makes the router connect to the promoted standby.
	if r := postFinal(rand.Text()); r.StatusCode != http.StatusCreated {
		t.Fatalf("a new transfer after the failover: %d", r.StatusCode)
	}
	if n := c.counter("shardgate_shard_identity_changes_total", map[string]string{"shard": "shard-0"}); n != 1 {
		t.Fatalf("shardgate_shard_identity_changes_total{shard=shard-0} = %v, want 1", n)
	}
	r := postFinal(lostKey)
	if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry of the lost transfer after the failover: %d, Idempotent-Replayed %q; want 201 applied anew (the cache must not answer for a database that lacks the transfer)",
			r.StatusCode, r.Header.Get("Idempotent-Replayed"))
	}
	id := router.TransferID(shardmap.KeyspaceID(src), "client-a:transfer", lostKey)
	if n := debits(t, c.pool(0), []string{id})[id]; n != 1 {
		t.Errorf("the lost transfer has %d debits on the promoted shard after its retry, want 1", n)
	}
}

// TestAsyncDestinationFailoverRepairedByReconcile: with relay.reowe_window 0 (or past the window),
// the credits a destination's failover lost are left to reconcile: it reports each as a missing
// credit (its outbox row says settled), --repair owes them again, and after the relay every
// transfer has its credit and the ledgers are clean.
func TestAsyncDestinationFailoverRepairedByReconcile(t *testing.T) {
	c := startFailoverClusterWith(t, "relay:\n  reowe_window: 0s\n", noStandby, asyncStandby)
	srcs := []int64{c.account(0, 1000), c.account(0, 2000)}
	dsts := []int64{c.account(1, 6000), c.account(1, 7000)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acked := c.loadFor(2*time.Second, srcs, dsts, func() {
		if err := c.standbys[1].StallReceiver(ctx); err != nil {
			t.Fatal(err)
		}
	})
	c.relayAll()
	c.failOver(1)
	c.relayAll()
	all := ids(acked)
	lost := map[string]bool{}
	have := credits(t, c.pool(1), all)
	for _, id := range all {
		if !have[id] {
			lost[id] = true
		}
	}
	if len(lost) == 0 {
		t.Fatal("no credit was lost with shard-1's failover: the stall did not hold replication back, so this test proved nothing")
	}
	if n := c.counter("shardgate_credits_reowed_total", map[string]string{"shard": "shard-1"}); n != 0 {
		t.Fatalf("%v credits owed again with relay.reowe_window 0", n)
	}

	topo := c.svc.Router.HoldTopology()
	defer topo.Release()
	rep, err := reconcile.Run(ctx, topo.Map, topo.Pool, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Found[reconcile.MissingCredit]; got != len(lost) || len(rep.Missing) != len(lost) {
		t.Fatalf("reconcile found %d missing credits (%d listed for repair), want %d (the credits the failover lost)", got, len(rep.Missing), len(lost))
	}
	for _, d := range rep.Missing {
		if !lost[d.Leg.TransferID] {
			t.Errorf("reconcile reports transfer %s as missing its credit, which the failover did not lose", d.Leg.TransferID)
		}
	}
	n, err := reconcile.Repair(ctx, topo.Map, topo.Pool, rep, io.Discard)
	if err != nil || n != len(lost) {
		t.Fatalf("repair owed %d credits again (%v), want %d", n, err, len(lost))
	}
	c.relayAll()
	if got := credits(t, c.pool(1), all); len(got) != len(all) {
		t.Errorf("after repair and the relay, %d of %d transfers have their credit, want all", len(got), len(all))
	}
	if rep, err := reconcile.Run(ctx, topo.Map, topo.Pool, reconcile.Options{}); err != nil || !rep.Clean() {
		var out strings.Builder
		rep.Print(&out)
		t.Errorf("reconcile after repair (%v):\n%s", err, out.String())
	}
}

// TestReadsWaitForTheSyncStandby: a transfer whose commit stopped waiting for shard-0's
// synchronous standby (the wait cancelled on the server while the standby's WAL receiver is
// stalled) is visible on the primary, and would be gone after a failover. GET /transfers/{id} and
// GET /accounts/{id}/balance do not report it while the standby lacks it: they answer 503, and
// after the failover the transfer is unknown (404), so a client that saw a 503 on its POST and
// then read never concludes that its transfer happened. A transfer the standby has reads 200.
func TestReadsWaitForTheSyncStandby(t *testing.T) {
	c := startFailoverCluster(t, syncStandby, noStandby)
	src, dst := c.account(0, 1000), c.account(0, 5000)
	body := func(amount int) string { return fmt.Sprintf(`{"src":%d,"dst":%d,"amount":%d}`, src, dst, amount) }
	id := func(key string) string { return router.TransferID(shardmap.KeyspaceID(src), "client-a:transfer", key) }
	balance := fmt.Sprintf("/accounts/%d/balance", src)

	kept := newKey()
	if got := c.postOnce(kept, body(5)); got != http.StatusCreated {
		t.Fatalf("a transfer before the stall: %d, want 201", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.standbys[0].StallReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	lost := newKey()
	posted := make(chan int, 1)
	go func() { posted <- c.postOnce(lost, body(7)) }()
	// Its commit waits for the standby; someone (an operator, a pooler) cancels the wait.
	admin := c.pool(0)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the transfer's commit never waited for the standby")
		}
	}
	if got := <-posted; got == http.StatusCreated {
		t.Fatalf("the transfer whose standby wait was cancelled was answered %d", got)
	}
	var visible int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_out'", id(lost)).Scan(&visible); err != nil || visible != 1 {
		t.Fatalf("the transfer is %d times on the primary (%v): the test needs it visible there", visible, err)
	}
	if got := c.getOnce("/transfers/" + id(lost)); got != http.StatusServiceUnavailable {
		t.Errorf("GET of a transfer the standby lacks: %d, want 503", got)
	}
	if got := c.getOnce(balance); got != http.StatusServiceUnavailable {
		t.Errorf("GET of a balance that counts a transfer the standby lacks: %d, want 503", got)
	}

	c.failOver(0)
	if got := c.getOnce("/transfers/" + id(lost)); got != http.StatusNotFound {
		t.Errorf("after the failover, GET of the transfer the standby lacked: %d, want 404", got)
	}
	if got := c.getOnce("/transfers/" + id(kept)); got != http.StatusOK {
		t.Errorf("after the failover, GET of the transfer the standby had: %d, want 200", got)
	}
	if got := c.getOnce(balance); got != http.StatusOK {
		t.Errorf("after the failover, GET of the balance: %d, want 200", got)
	}
}
