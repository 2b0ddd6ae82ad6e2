package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/internal/pgtest/shardtest"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/relay"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// secret is the password in every shard DSN of these tests (the test server trusts local
// connections, so it is never checked): no error text or log line may quote it.
const secret = "s3cret-relay-pw"

// cluster is a set of shards, each a database of the test server, with the accounts, transfers
// and maps of one test.
type cluster struct {
	t     *testing.T
	names []string
	pools shardtest.Pools   // the test's own connections, for set-up and checks
	dsns  map[string]string // with the password
	dead  string            // a DSN of a closed port, with the password
}

func newCluster(t *testing.T, names ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, names: names, pools: shardtest.New(t, names...), dsns: map[string]string{}}
	for _, n := range names {
		u, err := url.Parse(c.pools[n].Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(u.User.Username(), secret)
		c.dsns[n] = u.String()
		if c.dead == "" {
			u.Host = "127.0.0.1:" + strconv.Itoa(closedPort(t))
			c.dead = u.String()
		}
	}
	return c
}

// closedPort is a local TCP port nothing listens on: connecting is refused at once.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

func (c *cluster) pool(name string) *pgxpool.Pool { return c.pools[name] }

// mapOf parses a map of version v; owners is as testkit.ShardMap's. The shards named in down
// get a DSN of a closed port.
func (c *cluster) mapOf(v int64, owners string, down ...string) *shardmap.Map {
	c.t.Helper()
	return testkit.ShardMap(c.t, v, owners, func(name string) string {
		if slices.Contains(down, name) {
			return c.dead
		}
		return c.dsns[name]
	})
}

// apply makes the shards own m's ranges, moving rows as `router shardmap apply` does.
func (c *cluster) apply(m *shardmap.Map) []rangemove.MoveReport {
	c.t.Helper()
	moves, err := rangemove.ApplyMap(context.Background(), m, c.pool, partition.Daily)
	if err != nil {
		c.t.Fatalf("apply map version %d: %v", m.Version, err)
	}
	return moves
}

// exec runs sql on every shard of the cluster.
func (c *cluster) exec(sql string) {
	c.t.Helper()
	for _, n := range c.names {
		if _, err := c.pools[n].Exec(context.Background(), sql); err != nil {
			c.t.Fatalf("shard %s: %s: %v", n, sql, err)
		}
	}
}

// makeDue makes every pending owed credit due now: the backoff a test does not wait out.
func (c *cluster) makeDue() {
	c.exec("UPDATE shardgate_credit_outbox SET next_attempt_at = now() WHERE settled_at IS NULL")
}

// expireLeases makes every lease run out: the time a relay that died would take to lose it.
func (c *cluster) expireLeases() {
	c.exec("UPDATE shardgate_credit_outbox SET lease_until = now() - interval '1 second' WHERE lease_until IS NOT NULL")
}

// accounts returns the first n accounts from 1 up whose keyspace id lies in r.
func accounts(t *testing.T, r string, n int) []int64 {
	t.Helper()
	kr, err := shardmap.ParseKeyRange(r)
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for a := int64(1); len(out) < n; a++ {
		if kr.Contains(shardmap.KeyspaceID(a)) {
			out = append(out, a)
		}
	}
	return out
}

// owner is the name of the shard that owns account under m.
func owner(m *shardmap.Map, account int64) string {
	sh, _ := m.ShardFor(shardmap.KeyspaceID(account))
	return sh.Name
}

// transfer is one transfer a test made, and whether its debit left the credit owed.
type transfer struct {
	id       string
	src, dst int64
	amount   int64
	owed     bool
	// handedOff: its router delivered its credit at once and settled it at its source's time of
	// settling, not at the credit's own time, as a pass does.
	handedOff bool
}

// debitRequest is the debit leg of tr, as the router sends it to src's shard.
func debitRequest(tr transfer) idem.TransferRequest {
	key := strings.TrimPrefix(tr.id, "t-")
	return idem.TransferRequest{
		Kind: idem.Debit, Scope: "client-a:transfer", Key: key, RequestHash: "hash-" + key,
		KeyspaceID: shardmap.KeyspaceID(tr.src), DstKeyspaceID: shardmap.KeyspaceID(tr.dst),
		TransferID: tr.id, Client: "client-a", Src: tr.src, Dst: tr.dst, Amount: tr.amount, Currency: "EUR",
		Response: idem.Response{Status: 201, Body: fmt.Sprintf(`{"id":%q}`, tr.id)}, Retention: 720 * time.Hour,
	}
}

// owedCredit is tr's credit as its shard's outbox holds it.
func owedCredit(tr transfer) idem.OwedCredit {
	return idem.OwedCredit{TransferID: tr.id, Src: tr.src, Dst: tr.dst, Amount: tr.amount, Currency: "EUR", Client: "client-a"}
}

// debit applies the debits of trs on the shards that own their sources under m, a group per
// shard through idem.TransferBatch, and records which left their credit owed. A debit whose
// destination is on its own shard must have written the credit at once, any other owes it.
func (c *cluster) debit(m *shardmap.Map, trs []transfer) {
	c.t.Helper()
	c.debitOn(c.pool, m, trs)
}

// debitOn is debit through the pools of pool, a router's connections.
func (c *cluster) debitOn(pool func(string) *pgxpool.Pool, m *shardmap.Map, trs []transfer) {
	c.t.Helper()
	bySrc := map[string][]int{}
	for i, tr := range trs {
		bySrc[owner(m, tr.src)] = append(bySrc[owner(m, tr.src)], i)
	}
	for shard, idx := range bySrc {
		for len(idx) > 0 {
			group := idx[:min(len(idx), 100)]
			idx = idx[len(group):]
			reqs := make([]idem.TransferRequest, len(group))
			for j, i := range group {
				reqs[j] = debitRequest(trs[i])
			}
			res, err := idem.TransferBatch(context.Background(), pool(shard), reqs)
			if err != nil {
				c.t.Fatalf("debits on %s: %v", shard, err)
			}
			for j, i := range group {
				dst := owner(m, trs[i].dst)
				if res[j].Outcome != idem.Applied || res[j].CreditSettled != (dst == shard) {
					c.t.Fatalf("debit %s on %s (credit to %s): %s, credit settled %t", trs[i].id, shard, dst, res[j].Outcome, res[j].CreditSettled)
				}
				trs[i].owed = !res[j].CreditSettled
			}
		}
	}
}

// outboxRow is one owed-credit row as a shard holds it.
type outboxRow struct {
	shard       string
	settledAt   *time.Time
	attempts    int
	nextAttempt time.Time
	leaseOwner  *string
	lastError   *string
}

func (o outboxRow) String() string {
	deref := func(p *string) string {
		if p == nil {
			return "none"
		}
		return *p
	}
	settled := "pending"
	if o.settledAt != nil {
		settled = "settled at " + o.settledAt.String()
	}
	return fmt.Sprintf("{on %s, %s, %d attempts, due %s, lease %s, last error %s}", o.shard, settled, o.attempts, o.nextAttempt, deref(o.leaseOwner), deref(o.lastError))
}

// census is where the rows of every transfer are, across the cluster.
type census struct {
	debits, credits map[string][]string // transfer id → shards holding its transfer_out, transfer_in
	creditAt        map[string]time.Time
	owed            map[string][]outboxRow
}

func (c *cluster) census() census {
	c.t.Helper()
	ctx := context.Background()
	s := census{debits: map[string][]string{}, credits: map[string][]string{}, creditAt: map[string]time.Time{}, owed: map[string][]outboxRow{}}
	for _, n := range c.names {
		rows, _ := c.pools[n].Query(ctx, "SELECT transfer_id, kind, created_at FROM ledger_entries")
		var (
			id, kind string
			at       time.Time
		)
		if _, err := pgx.ForEachRow(rows, []any{&id, &kind, &at}, func() error {
			if kind == string(idem.Debit) {
				s.debits[id] = append(s.debits[id], n)
			} else {
				s.credits[id] = append(s.credits[id], n)
				s.creditAt[id] = at
			}
			return nil
		}); err != nil {
			c.t.Fatalf("shard %s: %v", n, err)
		}
		rows, _ = c.pools[n].Query(ctx, `SELECT transfer_id, settled_at, attempts, next_attempt_at, lease_owner, last_error
			FROM shardgate_credit_outbox`)
		o := outboxRow{shard: n}
		if _, err := pgx.ForEachRow(rows, []any{&id, &o.settledAt, &o.attempts, &o.nextAttempt, &o.leaseOwner, &o.lastError}, func() error {
			s.owed[id] = append(s.owed[id], o)
			return nil
		}); err != nil {
			c.t.Fatalf("shard %s: %v", n, err)
		}
	}
	return s
}

// pending returns the owed credits not settled yet, across the cluster.
func (c *cluster) pending() map[string]outboxRow {
	c.t.Helper()
	out := map[string]outboxRow{}
	for id, rows := range c.census().owed {
		for _, o := range rows {
			if o.settledAt == nil {
				out[id] = o
			}
		}
	}
	return out
}

// checkDelivered checks that every transfer of trs is complete under m: its debit once, on the
// shard owning src; its credit once, on the shard owning dst; an owed credit's row once, on the
// shard owning src, settled at its credit's time (or after it, when handed off), and no row
// for a credit written with its debit; and every account's balance what the transfers imply, nothing pending.
func (c *cluster) checkDelivered(m *shardmap.Map, trs []transfer) {
	c.t.Helper()
	s := c.census()
	bad := 0
	fail := func(format string, args ...any) {
		if bad++; bad <= 10 {
			c.t.Errorf(format, args...)
		}
	}
	for _, tr := range trs {
		if got := s.debits[tr.id]; !slices.Equal(got, []string{owner(m, tr.src)}) {
			fail("%s: debit on %v, want once on %s", tr.id, got, owner(m, tr.src))
		}
		if got := s.credits[tr.id]; !slices.Equal(got, []string{owner(m, tr.dst)}) {
			fail("%s: credit on %v, want once on %s", tr.id, got, owner(m, tr.dst))
		}
		rows := s.owed[tr.id]
		switch {
		case !tr.owed && len(rows) > 0:
			fail("%s: credit written with its debit, yet owed on %s", tr.id, rows[0].shard)
		case tr.owed && (len(rows) != 1 || rows[0].shard != owner(m, tr.src)):
			fail("%s: %d owed-credit rows (%+v), want one on %s", tr.id, len(rows), rows, owner(m, tr.src))
		case tr.owed && (rows[0].settledAt == nil || rows[0].settledAt.Before(s.creditAt[tr.id]) ||
			!tr.handedOff && !rows[0].settledAt.Equal(s.creditAt[tr.id])):
			fail("%s: owed credit settled at %v, want the credit's time %v (or later, when handed off)", tr.id, rows[0].settledAt, s.creditAt[tr.id])
		}
	}
	if len(s.debits) != len(trs) || len(s.credits) != len(trs) || len(s.owed) > len(trs) {
		fail("the cluster holds %d debits, %d credits and %d owed credits for %d transfers", len(s.debits), len(s.credits), len(s.owed), len(trs))
	}
	c.checkBalances(m, trs, false)
	if bad > 10 {
		c.t.Errorf("... and %d more", bad-10)
	}
}

// checkBalances checks idem.Balance of every account of trs against what trs imply: every debit,
// and every credit if delivered, else only those written with their debit (the rest pending).
func (c *cluster) checkBalances(m *shardmap.Map, trs []transfer, undelivered bool) {
	c.t.Helper()
	type want struct{ credits, debits, pending int64 }
	wants := map[int64]*want{}
	for _, tr := range trs {
		for _, a := range []int64{tr.src, tr.dst} {
			if wants[a] == nil {
				wants[a] = &want{}
			}
		}
		wants[tr.src].debits += tr.amount
		if undelivered && tr.owed {
			wants[tr.src].pending += tr.amount
		} else {
			wants[tr.dst].credits += tr.amount
		}
	}
	for a, w := range wants {
		ks := shardmap.KeyspaceID(a)
		sh, _ := m.ShardFor(ks)
		bal, _, err := idem.Balance(context.Background(), c.pool(sh.Name), a, ks)
		if err != nil {
			c.t.Fatalf("balance of %d on %s: %v", a, sh.Name, err)
		}
		got := want{}
		for _, b := range bal {
			if b.Currency != "EUR" {
				c.t.Errorf("account %d has a balance in %s", a, b.Currency)
			}
			got = want{b.Credits, b.Debits, b.PendingOut}
		}
		if got != *w {
			c.t.Errorf("account %d on %s: credits, debits, pending out %+v; want %+v", a, sh.Name, got, *w)
		}
	}
}

// relayConfig is router.yaml with the given relay settings ("batch: 16", ...).
func relayConfig(t *testing.T, settings ...string) *config.Config {
	t.Helper()
	y := "auth:\n  mode: none\nrelay:\n"
	for _, s := range settings {
		y += "  " + s + "\n"
	}
	cfg, err := config.Parse("router.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// topos is what a router gives its relay: the topology it routes with, swapped as a router's
// reload swaps it, and a reload that reads the shard map file, here a map the test publishes.
type topos struct {
	t        *testing.T
	sp       config.ShardPool
	mu       sync.Mutex
	cur      *topology.Topology
	file     *shardmap.Map
	reloads  int
	retiring sync.WaitGroup
}

var _ relay.Topologies = (*topos)(nil)

func newTopos(t *testing.T, cfg *config.Config, m *shardmap.Map) *topos {
	t.Helper()
	cur, err := topology.Open(m, nil, cfg.ShardPool)
	if err != nil {
		t.Fatal(err)
	}
	tp := &topos{t: t, sp: cfg.ShardPool, cur: cur, file: m}
	t.Cleanup(func() {
		tp.retiring.Wait()
		tp.cur.Close()
	})
	return tp
}

func (tp *topos) HoldTopology() *topology.Topology {
	for {
		tp.mu.Lock()
		cur := tp.cur
		tp.mu.Unlock()
		if cur.Hold() {
			return cur
		}
	}
}

func (tp *topos) ReloadAtLeast(version int64) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.cur.Map.Version < version && tp.file.Version > tp.cur.Map.Version {
		tp.swap(tp.file)
		tp.reloads++
	}
	return tp.cur.Map.Version >= version
}

// pool is the named shard's pool in the current topology: the router's connections.
func (tp *topos) pool(shard string) *pgxpool.Pool {
	topo := tp.HoldTopology()
	defer topo.Release()
	return topo.Pool(shard)
}

// publish makes m the shard map file, which the next reload reads.
func (tp *topos) publish(m *shardmap.Map) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.file = m
}

// serve publishes m and reloads it at once.
func (tp *topos) serve(m *shardmap.Map) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.file = m
	tp.swap(m)
}

// version is the map version the relay routes with.
func (tp *topos) version() int64 {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.cur.Map.Version
}

// swap opens a topology of m and swaps it in; the old one closes once its last user leaves. The
// caller holds tp.mu. It may run inside a Pass, which holds the old topology: it never waits.
func (tp *topos) swap(m *shardmap.Map) {
	next, err := topology.Open(m, tp.cur, tp.sp)
	if err != nil {
		tp.t.Errorf("open topology of map version %d: %v", m.Version, err)
		return
	}
	old := tp.cur
	tp.cur = next
	tp.retiring.Go(func() { old.Retire(next) })
}

// testRelay is a relay with its own registry and log.
type testRelay struct {
	*relay.Relay
	reg  *prometheus.Registry
	logs *testkit.SyncBuffer
}

func newRelay(cfg *config.Config, tp relay.Topologies) testRelay {
	return newRelayAs(cfg, relay.NewOwner(), tp)
}

// newRelayAs is newRelay with owner as its name in leases.
func newRelayAs(cfg *config.Config, owner string, tp relay.Topologies) testRelay {
	r := testRelay{reg: prometheus.NewPedanticRegistry(), logs: &testkit.SyncBuffer{}}
	r.Relay = relay.New(cfg, owner, tp, slog.New(slog.NewTextHandler(r.logs, nil)), r.reg)
	return r
}

// metric returns the sample of family name whose labels include labels (name, value, ...), or
// 0 when there is none; ok says whether there was.
func (r testRelay) metric(t *testing.T, name string, labels ...string) (v float64, ok bool) {
	t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// series is how many samples family name has.
func (r testRelay) series(t *testing.T, name string) int {
	t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return len(f.GetMetric())
		}
	}
	return 0
}

// deliveries is shardgate_credit_deliveries_total of shard and outcome.
func (r testRelay) deliveries(t *testing.T, shard, outcome string) float64 {
	t.Helper()
	v, _ := r.metric(t, "shardgate_credit_deliveries_total", "shard", shard, "outcome", outcome)
	return v
}
