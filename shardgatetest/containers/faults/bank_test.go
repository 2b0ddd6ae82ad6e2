package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/reconcile"
	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardgatetest"
	"github.com/shardgate/shardgate/shardgatetest/containers"
	"github.com/shardgate/shardgate/shardmap"
)

// Sizes of the bank run. The whole test stays well under three minutes on a 2-core machine.
const (
	numShards   = 3
	numClients  = 6
	perShard    = 8                       // accounts of each shard the bank moves money between
	maxAttempts = 6                       // per key: the first try and its retries
	dropRate    = 0.08                    // share of responses the proxy swallows after COMMIT
	clientWait  = 6 * time.Second         // client-side deadline per request
	settle      = 1500 * time.Millisecond // calm between faults
	drainWait   = time.Minute             // bound on the relay delivering every owed credit after healing
)

// bankPool is the router's shard pool: the request timeout is short so a paused or cut-off
// shard turns into 503s quickly instead of holding clients for the default. The relay's lease
// is the shortest the router accepts (three request timeouts), so that the credits the killed
// router had claimed are taken over soon after it restarts, and its backoff stays short, so that
// credits deferred during a fault are delivered soon after healing.
const bankPool = `shard_pool:
  max_conns: 8
  connect_timeout: 1s
  request_timeout: 3s
  retry_after: 1s
relay:
  lease: 9s
  backoff_max: 2s
`

const bankToken = "bank-token"

// attempt is one request of a client and what came of it.
type attempt struct {
	status   int    // 0 when no response was received
	replayed bool   // Idempotent-Replayed: true
	body     []byte // response body
	err      string // transport error or timeout, when status is 0
}

// op is one idempotency key's history: the request and every attempt made with it.
type op struct {
	key              string
	src, dst, amount int64
	cross            bool // src and dst live on different shards
	body             string
	invalid          bool // deliberately invalid request: must fail with 400 and store nothing
	attempts         []attempt
}

// outcome classifies an op from its history alone, as a client would.
type outcome int

const (
	acked        outcome = iota // some attempt got 201
	surelyFailed                // only 4xx other than 409: the server said no and nothing else
	unknown                     // no 201, and some 503, 409, timeout or reset: it may have landed
)

// id is the transfer id the router gives o.
func (o *op) id() string {
	return router.TransferID(shardmap.KeyspaceID(o.src), "bank:transfer", o.key)
}

func (o *op) outcome() outcome {
	definite := true
	for _, a := range o.attempts {
		switch {
		case a.status == http.StatusCreated:
			return acked
		case a.status >= 400 && a.status < 500 && a.status != http.StatusConflict:
		default:
			definite = false
		}
	}
	if definite && len(o.attempts) > 0 {
		return surelyFailed
	}
	return unknown
}

// TestBankUnderFaults is a Jepsen-style bank check: clients move money between accounts of every
// shard, within a shard and across shards, with retries while shards are paused, killed, cut off
// the network, the router restarts, and a proxy drops responses after the shard committed. The
// router's relay delivers the credits of cross-shard transfers throughout. Afterwards the
// debits must agree with what clients were told; once the relay has delivered everything owed,
// every applied debit has exactly one credit, no credit exists twice or without its debit, each
// account's balance is exactly what the applied transfers make it, the balances sum to zero, and
// reconcile finds the ledgers clean.
func TestBankUnderFaults(t *testing.T) {
	if os.Getenv(shardgatetest.BackendEnv) != string(shardgatetest.Docker) {
		t.Skip("set SHARDGATE_TEST_BACKEND=docker to run the fault suite against shard containers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Shards and the router image as containers on one network. A fault suite that cannot start
	// tests nothing: New fails in CI, and skips elsewhere only if no backend can run.
	env := shardgatetest.New(t, shardgatetest.Options{
		Backend:    shardgatetest.Docker,
		Shards:     numShards,
		Clients:    map[string]string{"bank": bankToken},
		RouterYAML: bankPool,
	})
	rt := containers.RouterOf(env)
	b := newBank(env.Map)
	px := newDropProxy(t, rt.Addr(), dropRate)
	defer px.Close()
	httpc := &http.Client{
		Timeout: clientWait,
		// A fresh connection per request, so the proxy's drop decision is per request.
		Transport: &http.Transport{DisableKeepAlives: true},
	}

	// Clients run until the fault schedule is over.
	ops := runClients(ctx, httpc, px.URL(), b, func() { injectFaults(ctx, t, env) })
	pools := assertionPools(ctx, t, env)
	counts := check(ctx, t, ops, pools)
	t.Logf("history: %d keys, %d requests, %d responses dropped by the proxy", len(ops), counts.requests, px.dropped.Load())
	t.Logf("acknowledged %d (1 row each), surely failed %d (0 rows), unknown %d (%d landed, %d did not), replays checked %d",
		counts.acked, counts.failed, counts.unknown, counts.unknownLanded, counts.unknown-counts.unknownLanded, counts.replays)
	t.Logf("ledger sum %d = acknowledged %d + unknown that landed %d", counts.ledgerSum, counts.ackedSum, counts.unknownSum)

	px.setDropRate(0)
	final, resolved, refused := resolveAndCheck(ctx, t, httpc, px.URL(), ops, pools, counts, "after healing")
	t.Logf("after healing: %d unknown keys retried: %d applied or replayed once, %d refused; ledger sum %d", resolved+refused, resolved, refused, final.ledgerSum)

	drained := drainCredits(ctx, t, pools)
	debits := debitRows(ctx, t, pools)
	legs := checkCredits(ctx, t, ops, debits, pools, env.Map)
	checkBalances(ctx, t, httpc, env.URL, b, ops, debits)
	checkReconcile(ctx, t, env.Map, pools)
	t.Logf("credits: all owed delivered %s after healing; %d applied transfers, %d across shards and %d within one, each with one credit; balances of %d accounts as applied",
		drained.Round(time.Millisecond), legs.applied, legs.cross, legs.applied-legs.cross, len(b.accounts))
	checkRouterLogs(ctx, t, env)
	fmt.Printf("bank summary: keys=%d requests=%d dropped=%d acked=%d failed=%d unknown=%d landed=%d replays=%d ledger_sum=%d healed=%d cross_shard=%d same_shard=%d drain=%s ok=%t\n",
		len(ops), counts.requests, px.dropped.Load(), counts.acked, counts.failed, counts.unknown, counts.unknownLanded,
		counts.replays, counts.ledgerSum, resolved+refused, legs.cross, legs.applied-legs.cross, drained.Round(time.Millisecond), !t.Failed())
}

// runClients runs numClients clients sending transfers between b's accounts with retries
// through url while during runs, and returns every client's history once during has returned
// and the clients stopped.
func runClients(ctx context.Context, httpc *http.Client, url string, b *bank, during func()) []*op {
	var (
		mu   sync.Mutex
		ops  []*op
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	for c := range numClients {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(uint64(c), uint64(time.Now().UnixNano())))
			for n := 0; !stop.Load(); n++ {
				o := b.newOp(rng, c, n)
				runOp(ctx, httpc, url, o, rng)
				mu.Lock()
				ops = append(ops, o)
				mu.Unlock()
			}
		})
	}
	func() {
		defer func() { // also when during ends the test with t.Fatal
			stop.Store(true)
			wg.Wait()
		}()
		during()
	}()
	return ops
}

// injectFaults runs the fault schedule: each fault is injected, held, and healed, with calm
// between them. The router image runs as a container on the shards' network, as users deploy
// it; its fault SIGKILLs it mid-traffic and starts it again.
func injectFaults(ctx context.Context, t *testing.T, env *shardgatetest.Env) {
	t.Helper()
	shards, rt := containers.ClusterOf(env).Shards, containers.RouterOf(env)
	faults := []struct {
		name         string
		inject, heal func(context.Context) error
		hold         time.Duration
	}{
		{"pause shard-0", shards[0].Pause, shards[0].Resume, 4 * time.Second},
		{"kill shard-1", shards[1].Kill, shards[1].Restart, 2 * time.Second},
		{"cut shard-2 off the network", shards[2].Disconnect, shards[2].Connect, 4 * time.Second},
		{"kill the router (SIGKILL) and start it again", rt.Kill, rt.Restart, time.Second},
	}
	time.Sleep(settle)
	for _, f := range faults {
		t.Logf("fault: %s", f.name)
		if err := f.inject(ctx); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		time.Sleep(f.hold)
		if err := f.heal(ctx); err != nil {
			t.Fatalf("healing %s: %v", f.name, err)
		}
		time.Sleep(settle)
	}
}

// resolveAndCheck retries every key of ops whose outcome is unknown (resolveUnknown) and checks
// that each key then ended acknowledged or failed, with the rows to match: before is check's
// counts from before the retries, when names the moment in errors.
func resolveAndCheck(ctx context.Context, t *testing.T, httpc *http.Client, url string, ops []*op, pools map[string]*pgxpool.Pool, before counts, when string) (final counts, resolved, refused int) {
	t.Helper()
	resolved, refused = resolveUnknown(ctx, t, httpc, url, ops)
	final = check(ctx, t, ops, pools)
	if final.unknown != 0 || final.acked != before.acked+resolved || final.failed != before.failed+refused {
		t.Errorf("%s: %d acknowledged, %d failed, %d unknown; want %d, %d and 0",
			when, final.acked, final.failed, final.unknown, before.acked+resolved, before.failed+refused)
	}
	return final, resolved, refused
}

// poolsOf opens a pool to each of dsns, named shard-0, shard-1, … as the bank's maps name them.
func poolsOf(ctx context.Context, t *testing.T, dsns []string) map[string]*pgxpool.Pool {
	t.Helper()
	pools := map[string]*pgxpool.Pool{}
	for i, dsn := range dsns {
		p, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools[fmt.Sprintf("shard-%d", i)] = p
	}
	return pools
}

// resolveUnknown retries, once everything is healed, every key whose outcome is unknown: each
// must now get a definite answer — a valid transfer applies or replays exactly once, an invalid
// one is refused. It returns how many applied and how many were refused.
func resolveUnknown(ctx context.Context, t *testing.T, httpc *http.Client, url string, ops []*op) (resolved, refused int) {
	t.Helper()
	for _, o := range ops {
		if o.outcome() != unknown {
			continue
		}
		o.attempts = nil
		runOp(ctx, httpc, url, o, mrand.New(mrand.NewPCG(1, 2)))
		switch got := o.outcome(); {
		case got == acked && !o.invalid:
			resolved++
		case got == surelyFailed && o.invalid:
			refused++
		default:
			t.Errorf("key %s: no definite answer after healing: %+v", o.key, o.attempts)
		}
	}
	return resolved, refused
}

// bank is the accounts money moves between: perShard accounts on each shard of the map.
type bank struct {
	accounts []int64
	byShard  [][]int64     // accounts by shard, in map order
	shardOf  map[int64]int // account -> index in byShard
}

// newBank picks the first perShard accounts from 1 up that each shard of m owns.
func newBank(m *shardmap.Map) *bank {
	b := &bank{byShard: make([][]int64, len(m.Shards)), shardOf: map[int64]int{}}
	index := map[string]int{}
	for i, s := range m.Shards {
		index[s.Name] = i
	}
	for a := int64(1); len(b.accounts) < perShard*len(m.Shards); a++ {
		i := index[m.Route(a).Shard]
		if len(b.byShard[i]) < perShard {
			b.byShard[i] = append(b.byShard[i], a)
			b.shardOf[a] = i
			b.accounts = append(b.accounts, a)
		}
	}
	return b
}

// newOp makes client c's n-th operation: mostly valid transfers between a few hot accounts (so
// keys of different clients meet on the same rows), half of them within the source's shard and
// half to another shard's account; sometimes an invalid one.
func (b *bank) newOp(rng *mrand.Rand, c, n int) *op {
	o := &op{key: fmt.Sprintf("bank-%d-%d-%d", c, n, rng.Uint32()), src: b.accounts[rng.IntN(len(b.accounts))], amount: 1 + rng.Int64N(1000)}
	from := b.shardOf[o.src]
	to := from
	if o.cross = rng.IntN(2) == 0; o.cross {
		to = (from + 1 + rng.IntN(len(b.byShard)-1)) % len(b.byShard)
	}
	for o.dst = o.src; o.dst == o.src; {
		o.dst = b.byShard[to][rng.IntN(perShard)]
	}
	o.body = fmt.Sprintf(`{"src": %d, "dst": %d, "amount": %d}`, o.src, o.dst, o.amount)
	if rng.IntN(10) == 0 {
		o.invalid = true
		o.body = fmt.Sprintf(`{"src": %d, "dst": %d, "amount": 0}`, o.src, o.dst)
	}
	return o
}

// runOp sends o until it gets a definite answer (a 201 or a 4xx other than 409) or runs out of
// attempts. After a 201 it sometimes sends once more, to collect a replay to compare.
func runOp(ctx context.Context, httpc *http.Client, url string, o *op, rng *mrand.Rand) {
	for range maxAttempts {
		a := send(ctx, httpc, url, o)
		o.attempts = append(o.attempts, a)
		if a.status == http.StatusCreated {
			if rng.IntN(3) == 0 {
				o.attempts = append(o.attempts, send(ctx, httpc, url, o))
			}
			return
		}
		if a.status >= 400 && a.status < 500 && a.status != http.StatusConflict {
			return
		}
		time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
	}
}

func send(ctx context.Context, httpc *http.Client, url string, o *op) attempt {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/transfers", bytes.NewReader([]byte(o.body)))
	if err != nil {
		return attempt{err: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+bankToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", o.key)
	resp, err := httpc.Do(req)
	if err != nil {
		return attempt{err: err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return attempt{err: err.Error()}
	}
	return attempt{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", body: body}
}

// counts are the checker's findings.
type counts struct {
	requests, acked, failed, unknown, unknownLanded, replays int
	ledgerSum, ackedSum, unknownSum                          int64
}

// row is one transfer_out row of the ledger.
type row struct {
	amount int64
	shard  string
}

// check compares the clients' histories with the ledger of every shard.
func check(ctx context.Context, t *testing.T, ops []*op, pools map[string]*pgxpool.Pool) counts {
	t.Helper()
	rows := debitRows(ctx, t, pools)
	var c counts
	for _, got := range rows {
		for _, r := range got {
			c.ledgerSum += r.amount
		}
	}
	known := map[string]bool{}
	for _, o := range ops {
		known[o.id()] = true
		c.add(t, o, rows[o.id()])
	}
	for id := range rows {
		if !known[id] {
			t.Errorf("ledger row for transfer %s that no client sent", id)
		}
	}
	if c.ledgerSum != c.ackedSum+c.unknownSum {
		t.Errorf("ledger sum %d != acknowledged %d + landed unknown %d", c.ledgerSum, c.ackedSum, c.unknownSum)
	}
	if c.acked == 0 {
		t.Error("no transfer was acknowledged: the run proves nothing")
	}
	return c
}

// debitRows reads every shard's transfer_out rows by transfer id.
func debitRows(ctx context.Context, t *testing.T, pools map[string]*pgxpool.Pool) map[string][]row {
	t.Helper()
	rows := map[string][]row{}
	for name, p := range pools {
		r, err := p.Query(ctx, "SELECT transfer_id, amount FROM ledger_entries WHERE kind = 'transfer_out'")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for r.Next() {
			var id string
			var amount int64
			if err := r.Scan(&id, &amount); err != nil {
				t.Fatal(err)
			}
			rows[id] = append(rows[id], row{amount, name})
		}
		if err := r.Err(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return rows
}

// add checks one key's history against its ledger rows (got) and counts it.
func (c *counts) add(t *testing.T, o *op, got []row) {
	t.Helper()
	c.requests += len(o.attempts)
	for _, r := range got {
		if r.amount != o.amount {
			t.Errorf("key %s: ledger amount %d on %s, requested %d", o.key, r.amount, r.shard, o.amount)
		}
	}
	switch o.outcome() {
	case acked:
		c.acked++
		c.ackedSum += o.amount
		if o.invalid {
			t.Errorf("key %s: an invalid request was acknowledged", o.key)
		}
		if len(got) != 1 {
			t.Errorf("key %s: acknowledged, %d ledger rows, want exactly 1", o.key, len(got))
		}
		c.replays += checkReplays(t, o)
	case surelyFailed:
		c.failed++
		if len(got) != 0 {
			t.Errorf("key %s: surely failed (%d), yet %d ledger rows", o.key, o.attempts[0].status, len(got))
		}
	case unknown:
		c.unknown++
		if len(got) > 1 {
			t.Errorf("key %s: unknown outcome, %d ledger rows, want at most 1", o.key, len(got))
		}
		if len(got) == 1 {
			c.unknownLanded++
			c.unknownSum += o.amount
		}
	}
}

// checkReplays checks that every 201 after an acknowledged key's first is a byte-identical
// replay, and returns how many there were.
func checkReplays(t *testing.T, o *op) int {
	t.Helper()
	var first []byte
	n := 0
	for _, a := range o.attempts {
		if a.status != http.StatusCreated {
			continue
		}
		if first == nil {
			first = a.body
			continue
		}
		n++
		if !a.replayed || !bytes.Equal(a.body, first) {
			t.Errorf("key %s: later 201 (replayed=%t) %q differs from the first %q", o.key, a.replayed, a.body, first)
		}
	}
	return n
}

// drainCredits waits, at most drainWait, until no shard owes a credit (every row of
// shardgate_credit_outbox settled), and returns how long that took.
func drainCredits(ctx context.Context, t *testing.T, pools map[string]*pgxpool.Pool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		owed, why := 0, map[string]string{}
		for name, p := range pools {
			var (
				n    int
				last *string
			)
			if err := p.QueryRow(ctx, `SELECT count(*), max(last_error) FROM shardgate_credit_outbox WHERE settled_at IS NULL`).Scan(&n, &last); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			owed += n
			if last != nil {
				why[name] = *last
			}
		}
		if owed == 0 {
			return time.Since(start)
		}
		if time.Since(start) > drainWait {
			t.Fatalf("%d credits still owed %s after healing; the relay did not deliver them (last errors by shard: %v)", owed, drainWait, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// credit is one transfer_in row of the ledger.
type credit struct {
	dst, src, amount int64
	shard            string
}

// creditRows reads every shard's transfer_in rows by transfer id.
func creditRows(ctx context.Context, t *testing.T, pools map[string]*pgxpool.Pool) map[string][]credit {
	t.Helper()
	out := map[string][]credit{}
	for name, p := range pools {
		r, err := p.Query(ctx, "SELECT transfer_id, account_id, counterparty_id, amount FROM ledger_entries WHERE kind = 'transfer_in'")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for r.Next() {
			var id string
			c := credit{shard: name}
			if err := r.Scan(&id, &c.dst, &c.src, &c.amount); err != nil {
				t.Fatal(err)
			}
			out[id] = append(out[id], c)
		}
		if err := r.Err(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return out
}

// legTally counts the applied transfers checkCredits saw.
type legTally struct{ applied, cross int }

// checkCredits checks, once nothing is owed, the credit of every transfer against its debit
// (debits): an applied debit has exactly one credit, on the shard that owns dst, for the same
// accounts and amount; no transfer has a credit without its debit or more than one credit on all
// shards together. Every shard must have been the source of applied transfers within and across
// shards, or the run proved less than it claims.
func checkCredits(ctx context.Context, t *testing.T, ops []*op, debits map[string][]row, pools map[string]*pgxpool.Pool, m *shardmap.Map) legTally {
	t.Helper()
	credits := creditRows(ctx, t, pools)
	var n legTally
	sources := map[string][2]int{} // src's shard -> applied within, across
	sent := map[string]bool{}
	for _, o := range ops {
		id, got := o.id(), credits[o.id()]
		sent[id] = true
		if len(debits[id]) == 0 {
			if len(got) != 0 {
				t.Errorf("key %s: no debit, yet %d credits", o.key, len(got))
			}
			continue
		}
		n.applied++
		src := sources[m.Route(o.src).Shard]
		if o.cross {
			n.cross++
			src[1]++
		} else {
			src[0]++
		}
		sources[m.Route(o.src).Shard] = src
		if len(got) != 1 {
			t.Errorf("key %s: applied debit %d -> %d (%d) has %d credits %+v, want exactly 1", o.key, o.src, o.dst, o.amount, len(got), got)
			continue
		}
		if c, owner := got[0], m.Route(o.dst).Shard; c.dst != o.dst || c.src != o.src || c.amount != o.amount || c.shard != owner {
			t.Errorf("key %s: credit %+v, want %d -> %d (%d) on %s", o.key, c, o.src, o.dst, o.amount, owner)
		}
	}
	for id, got := range credits {
		if !sent[id] {
			t.Errorf("credit of transfer %s that no client sent: %+v", id, got)
		}
	}
	for _, s := range m.Shards {
		if kinds := sources[s.Name]; kinds[0] == 0 || kinds[1] == 0 {
			t.Errorf("%s was the source of %d applied transfers within its shard and %d across; want some of both", s.Name, kinds[0], kinds[1])
		}
	}
	return n
}

// checkBalances reads every account's balance through the router at url and compares it with
// what the transfers imply: those acknowledged, and those of unknown outcome whose debit the
// ledger holds. Accounts start empty, so the balances sum to zero.
func checkBalances(ctx context.Context, t *testing.T, httpc *http.Client, url string, b *bank, ops []*op, debits map[string][]row) {
	t.Helper()
	type figures struct{ credits, debits int64 }
	want := map[int64]*figures{}
	for _, a := range b.accounts {
		want[a] = &figures{}
	}
	for _, o := range ops {
		switch o.outcome() {
		case acked:
		case unknown:
			if len(debits[o.id()]) == 0 {
				continue
			}
		default:
			continue
		}
		want[o.src].debits += o.amount
		want[o.dst].credits += o.amount
	}
	var sum int64
	for _, a := range b.accounts {
		got, err := balance(ctx, httpc, url, a)
		if err != nil {
			t.Errorf("balance of %d: %v", a, err)
			continue
		}
		w := want[a]
		wantBody := fmt.Sprintf(`[{"currency":"EUR","balance":%d,"credits":%d,"debits":%d,"pending_out":0}]`, w.credits-w.debits, w.credits, w.debits)
		if *w == (figures{}) {
			wantBody = `[]`
		}
		if string(got) != wantBody {
			t.Errorf("balances of account %d: %s, the transfers applied make them %s", a, got, wantBody)
		}
		sum += w.credits - w.debits
	}
	if sum != 0 { // a check of the model: money moved, none was made
		t.Errorf("the applied transfers make the balances sum to %d, want 0", sum)
	}
}

// balance returns the balances array of GET url/accounts/{account}/balance, compacted.
func balance(ctx context.Context, httpc *http.Client, url string, account int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/accounts/%d/balance", url, account), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+bankToken)
	resp, err := httpc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var v struct {
		Account  int64           `json:"account"`
		Balances json.RawMessage `json:"balances"`
	}
	if err := json.Unmarshal(body, &v); resp.StatusCode != http.StatusOK || err != nil || v.Account != account {
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	var out bytes.Buffer
	if err := json.Compact(&out, v.Balances); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// checkReconcile runs `router reconcile`'s check over every shard of m: with nothing owed any
// more, a debit of any age without its credit is a discrepancy.
func checkReconcile(ctx context.Context, t *testing.T, m *shardmap.Map, pools map[string]*pgxpool.Pool) {
	t.Helper()
	rep, err := reconcile.Run(ctx, m, func(s string) *pgxpool.Pool { return pools[s] }, reconcile.Options{})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var out strings.Builder
	rep.Print(&out)
	if !rep.Clean() || rep.Debits == 0 || rep.Debits != rep.Credits {
		t.Errorf("reconcile after draining: %d debits, %d credits, clean=%t:\n%s", rep.Debits, rep.Credits, rep.Clean(), out.String())
		return
	}
	t.Logf("reconcile: clean, %d debits and %d credits", rep.Debits, rep.Credits)
}

// assertionPools opens a pool per shard for the checker, closed with the test.
func assertionPools(ctx context.Context, t *testing.T, env *shardgatetest.Env) map[string]*pgxpool.Pool {
	t.Helper()
	pools := map[string]*pgxpool.Pool{}
	for _, s := range env.Shards {
		p, err := pgxpool.New(ctx, s.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		pools[s.Name()] = p
	}
	return pools
}

// checkRouterLogs fails the test if the router's log holds a shard password or the client
// token; New shows the log's end when the test failed.
func checkRouterLogs(ctx context.Context, t *testing.T, env *shardgatetest.Env) {
	t.Helper()
	logs, err := env.RouterLogs(ctx)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	// Two starts and no clean stop: the log is the container's whole history, and the kill
	// really killed (a graceful shutdown would have logged "stopped").
	if n := strings.Count(logs, `msg=serving`); n != 2 || strings.Contains(logs, `msg=stopped`) {
		t.Errorf("the router's log shows %d starts and stopped=%t; want 2 starts and no clean stop", n, strings.Contains(logs, `msg=stopped`))
	}
	if strings.Contains(logs, "CREDIT CONFLICT") {
		t.Errorf("the relay found a different credit under a transfer id:\n%s", logs)
	}
	secrets := []string{bankToken}
	for _, s := range env.Shards {
		secrets = append(secrets, s.Password())
	}
	for _, sec := range secrets {
		if strings.Contains(logs, sec) {
			t.Errorf("the router's log contains a secret")
		}
	}
}

// dropProxy forwards TCP connections to the router. For a share of connections it forwards the
// request but swallows the response and resets the client's connection as soon as the router
// starts answering: the transfer committed, and the client never hears so.
type dropProxy struct {
	ln       net.Listener
	upstream string
	rate     atomic.Uint64 // float64 bits
	dropped  atomic.Int64
	wg       sync.WaitGroup
}

func newDropProxy(t *testing.T, upstream string, rate float64) *dropProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, upstream: upstream}
	p.setDropRate(rate)
	p.wg.Go(p.accept)
	return p
}

func (p *dropProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *dropProxy) setDropRate(r float64) { p.rate.Store(math.Float64bits(r)) }

func (p *dropProxy) Close() {
	p.ln.Close()
	p.wg.Wait()
}

func (p *dropProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		drop := mrand.Float64() < math.Float64frombits(p.rate.Load())
		p.wg.Go(func() { p.relay(client.(*net.TCPConn), drop) })
	}
}

func (p *dropProxy) relay(client *net.TCPConn, drop bool) {
	defer client.Close()
	up, err := net.DialTimeout("tcp", p.upstream, time.Second)
	if err != nil {
		client.SetLinger(0) // the router is down: the client sees a reset, as with no proxy
		return
	}
	defer up.Close()
	go func() {
		io.Copy(up, client) //nolint:errcheck // ends when either side closes
		up.(*net.TCPConn).CloseWrite()
	}()
	if !drop {
		io.Copy(client, up) //nolint:errcheck // ends when either side closes
		return
	}
	// Wait for the first byte of the answer: by then the shard transaction has committed.
	var b [1]byte
	if _, err := up.Read(b[:]); err == nil {
		p.dropped.Add(1)
	}
	client.SetLinger(0) // close with RST: the client gets "connection reset", not a clean EOF
}
